import Foundation
import Hummingbird
import HummingbirdTesting
import LMXCore
import LMXSystem
import NIOCore
import Synchronization
import Testing

@testable import LMXAgent

/// The status API's routes in process (HummingbirdTesting's router tests), on a real SQLite file.
/// The peer's user id, which the socket gives from the kernel, is chosen per test.
@Suite("Status API routes (in process)")
struct StatusAPITests {
    static let stranger: UInt32 = 4_000_123

    func app(_ fixture: AgentFixture, peer: UInt32?) -> some ApplicationProtocol {
        Application(router: StatusServer.router(agent: fixture.agent) { _ in peer })
    }

    @Test("/v1/active: 503 with the reason while nothing is usable, then the active endpoint")
    func active() async throws {
        try await AgentFixture.with { fixture in
            try await app(fixture, peer: 0).test(.router) { client in
                try await client.execute(uri: "/v1/active", method: .get) { response in
                    #expect(response.status == .serviceUnavailable)
                    let body = try JSONDecoder().decode(StatusAPI.ErrorBody.self, from: Data(buffer: response.body))
                    #expect(body.error == "no-active-endpoint")
                    #expect(body.reason.contains("no server known"))
                }
                fixture.publish([AgentFixture.lan("10.9.0.2")])
                try await client.execute(uri: "/v1/active", method: .get) { response in
                    #expect(response.status == .ok)
                    let active = try JSONDecoder().decode(StatusAPI.Active.self, from: Data(buffer: response.body))
                    #expect(active.baseURL == "http://10.9.0.2:1234")
                    #expect(active.via == .lan)
                }
                try await client.execute(uri: "/v1/status", method: .get) { response in
                    let status = try JSONDecoder().decode(StatusAPI.Status.self, from: Data(buffer: response.body))
                    #expect(status.candidates.count == 1)
                    #expect(status.avahi == "running")
                    #expect(response.headers[.cacheControl] == "no-store")
                }
            }
        }
    }

    @Test("/v1/resolve: 400 without a model, the server that has it, 503 naming the model otherwise")
    func resolve() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([AgentFixture.lan("10.9.0.2")], models: ["alpha"])
            try await app(fixture, peer: 0).test(.router) { client in
                try await client.execute(uri: "/v1/resolve", method: .get) { #expect($0.status == .badRequest) }
                try await client.execute(uri: "/v1/resolve?model=alpha", method: .get) { response in
                    #expect(response.status == .ok)
                    let resolved = try JSONDecoder().decode(StatusAPI.Resolved.self, from: Data(buffer: response.body))
                    #expect(resolved.endpoint?.baseURL == "http://10.9.0.2:1234")
                }
                try await client.execute(uri: "/v1/resolve?model=gamma", method: .get) { response in
                    #expect(response.status == .serviceUnavailable)
                    #expect(String(buffer: response.body).contains("gamma"))
                }
            }
        }
    }

    @Test("changes answer root and the agent's user only: another user gets 403 and changes nothing")
    func changesNeedAdministrator() async throws {
        try await AgentFixture.with { fixture in
            let token =
                "opta-lmx://pair?v=1&name=Studio&url=https%3A%2F%2Fquiet-river-1234.trycloudflare.com&key=ADMIN&instance=Mono512%3A1234"
            let upload = try JSONEncoder().encode(PairingUpload(payloads: [.init(text: token)], allowInsecure: false))
            try await app(fixture, peer: Self.stranger).test(.router) { client in
                try await client.execute(uri: "/v1/refresh", method: .post) { #expect($0.status == .forbidden) }
                try await client.execute(uri: "/v1/pairings", method: .post, body: ByteBuffer(data: upload)) {
                    response in
                    #expect(response.status == .forbidden)
                    #expect(String(buffer: response.body).contains("only root or the agent's own user"))
                }
                try await client.execute(uri: "/v1/pairings/x", method: .delete) { #expect($0.status == .forbidden) }
            }
            #expect(try fixture.store.pairings().isEmpty)
            try await app(fixture, peer: Users.effective).test(.router) { client in
                try await client.execute(uri: "/v1/refresh", method: .post) { #expect($0.status == .accepted) }
            }
        }
    }

    @Test("POST /v1/pairings: 400 for a bad body, 422 naming the bad payload, 201 and listed without secrets")
    func pairings() async throws {
        try await AgentFixture.with { fixture in
            let good =
                "opta-lmx://pair?v=1&name=Studio&url=https%3A%2F%2Fquiet-river-1234.trycloudflare.com&key=SECRET-ADMIN&instance=Mono512%3A1234"
            @Sendable func upload(_ texts: [String]) throws -> ByteBuffer {
                ByteBuffer(
                    data: try JSONEncoder().encode(
                        PairingUpload(payloads: texts.map { .init(text: $0) }, allowInsecure: false)))
            }
            try await app(fixture, peer: 0).test(.router) { client in
                try await client.execute(uri: "/v1/pairings", method: .post, body: ByteBuffer(string: "not json")) {
                    #expect($0.status == .badRequest)
                }
                try await client.execute(
                    uri: "/v1/pairings", method: .post, body: try upload([good, "opta-lmx://pair?v=9"])
                ) { response in
                    #expect(response.status == .unprocessableContent)
                    #expect(String(buffer: response.body).contains("payload 2"))
                }
                #expect(try fixture.store.pairings().isEmpty, "all or nothing")
                try await client.execute(uri: "/v1/pairings", method: .post, body: try upload([good])) { response in
                    #expect(response.status == .created)
                    #expect(!String(buffer: response.body).contains("SECRET-ADMIN"))
                }
                try await client.execute(uri: "/v1/pairings", method: .get) { response in
                    let listed = try JSONDecoder().decode([PairingSummary].self, from: Data(buffer: response.body))
                    #expect(listed.map(\.name) == ["Studio"])
                    #expect(listed.first?.secrets == ["admin_key"])
                    #expect(!String(buffer: response.body).contains("SECRET-ADMIN"))
                }
                try await client.execute(uri: "/v1/pairings/nope", method: .delete) { #expect($0.status == .notFound) }
                try await client.execute(uri: "/v1/pairings/Studio", method: .delete) { #expect($0.status == .ok) }
            }
            #expect(try fixture.store.pairings().isEmpty)
        }
    }

    @Test("/v1/history on a damaged database: a 500 naming the file and the next step")
    func historyOnDamagedDatabase() async throws {
        try await AgentFixture.with { fixture in
            // Every page overwritten under the open connections (a disk that went bad), once the
            // write-ahead log is in the file.
            let path = fixture.directory + "/agent.db"
            try fixture.store.close()
            let size = try FileManager.default.attributesOfItem(atPath: path)[.size] as? Int ?? 0
            let file = try #require(FileHandle(forWritingAtPath: path))
            try file.write(contentsOf: Data(repeating: 0x5A, count: max(size, 4096)))
            try file.close()
            try await app(fixture, peer: 0).test(.router) { client in
                try await client.execute(uri: "/v1/history?since=1h", method: .get) { response in
                    #expect(response.status == .internalServerError)
                    let body = try JSONDecoder().decode(StatusAPI.ErrorBody.self, from: Data(buffer: response.body))
                    #expect(body.reason.contains(path), "\(body.reason)")
                    #expect(body.reason.contains("stop the agent, move the file aside"), "\(body.reason)")
                }
            }
        }
    }

    @Test("every error has the API's one JSON shape")
    func errorShape() async throws {
        try await AgentFixture.with { fixture in
            try await app(fixture, peer: 0).test(.router) { client in
                try await client.execute(uri: "/v1/nothing", method: .get) { response in
                    #expect(response.status == .notFound)
                    let body = try JSONDecoder().decode(StatusAPI.ErrorBody.self, from: Data(buffer: response.body))
                    #expect(body.error == "not-found")
                    #expect(body.reason.contains("/v1/nothing"))
                }
            }
        }
    }

    @Test("/metrics: sampled from the snapshot (routes by verdict, the active route's way)")
    func metrics() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([AgentFixture.lan("10.9.0.2"), AgentFixture.lan("10.9.0.3")])
            try await app(fixture, peer: 0).test(.router) { client in
                try await client.execute(uri: "/metrics", method: .get) { response in
                    let text = String(buffer: response.body)
                    #expect(text.contains(#"lmx_routes{verdict="ready"} 2"#))
                    #expect(text.contains(#"lmx_active_via{via="lan"} 1"#))
                }
            }
        }
    }

    @Test("large answers: at most 4 at once per user, others and administrators unaffected")
    func largeAnswerGate() async throws {
        let gate = LargeAnswerGate(perUser: 4)
        final class Flags: Sendable {
            let released = Mutex(false)
            let started = Mutex(0)
        }
        let flags = Flags()
        try await withThrowingTaskGroup(of: Bool.self) { group in
            for _ in 0..<4 {
                group.addTask {
                    await gate.run(for: 1000) {
                        flags.started.withLock { $0 += 1 }
                        while !flags.released.withLock({ $0 }) { try? await Task.sleep(for: .milliseconds(5)) }
                        return true
                    } ?? false
                }
            }
            while flags.started.withLock({ $0 }) < 4 { try await Task.sleep(for: .milliseconds(5)) }
            #expect(await gate.run(for: 1000) { true } == nil, "a fifth for the same user waits for none: refused")
            #expect(await gate.run(for: 1001) { true } == true, "another user is served")
            #expect(await gate.run(for: 0) { true } == true, "root is not limited")
            flags.released.withLock { $0 = true }
            for try await ran in group { #expect(ran) }
        }
        #expect(await gate.run(for: 1000) { true } == true, "given back")
    }

    @Test(
        "connections per user: none asked whose while under the limit in all; at the limit every one is named and the limit holds"
    )
    func unnamedConnections() {
        let limiter = ConnectionLimiter(perUser: 3)
        /// Each connection's user, and how many times the kernel was asked.
        final class Kernel: Sendable {
            let asked = Mutex(0)
            func ask(_ uid: UInt32?) -> @Sendable () -> UInt32? {
                {
                    self.asked.withLock { $0 += 1 }
                    return uid
                }
            }
        }
        let kernel = Kernel()
        // Two open in all: no user can be at the limit of three, nobody is asked.
        let a = limiter.admitUnnamed(asking: kernel.ask(1000))
        let b = limiter.admitUnnamed(asking: kernel.ask(1000))
        #expect(a != nil && b != nil && limiter.unnamedCount == 2 && kernel.asked.withLock { $0 } == 0)
        // The third makes three: still no user over it.
        let c = limiter.admitUnnamed(asking: kernel.ask(1001))
        #expect(c != nil && limiter.unnamedCount == 3 && kernel.asked.withLock { $0 } == 0)
        // A fourth for 1000: at the limit in all, so all are named (three) and the new one (one):
        // 1000 has two, under three: admitted.
        let d = limiter.admitUnnamed(asking: kernel.ask(1000))
        #expect(d != nil && limiter.unnamedCount == 0 && kernel.asked.withLock { $0 } == 4)
        // A fifth for 1000: it has three, refused; another user is not; root never is.
        #expect(limiter.admitUnnamed(asking: kernel.ask(1000)) == nil && limiter.refused == 1)
        let e = limiter.admitUnnamed(asking: kernel.ask(1001))
        #expect(e != nil)
        #expect(limiter.admitUnnamed(asking: kernel.ask(0)) != nil, "root is not limited")
        #expect(limiter.admit(1000) == false, "a Unix socket's connection of 1000, named at once, is counted the same")
        // One of 1000's closes: room for one more.
        if let a { limiter.release(a) }
        #expect(limiter.admitUnnamed(asking: kernel.ask(1000)) != nil)
        #expect(limiter.admitUnnamed(asking: kernel.ask(1000)) == nil && limiter.refused == 3)
        // A peer the kernel names nobody counts as one unknown user, with a limit of its own.
        for _ in 0..<3 { #expect(limiter.admitUnnamed(asking: kernel.ask(nil)) != nil) }
        #expect(limiter.admitUnnamed(asking: kernel.ask(nil)) == nil)
    }

    @Test("connections per user: one named when first needed, counted from then; released ones give their place back")
    func namedWhenNeeded() {
        let limiter = ConnectionLimiter(perUser: 2)
        let asked = Mutex(0)
        let ask: @Sendable () -> UInt32? = {
            asked.withLock { $0 += 1 }
            return 1000
        }
        guard let first = limiter.admitUnnamed(asking: ask) else {
            Issue.record("the first connection was refused")
            return
        }
        #expect(limiter.uid(of: first) == 1000 && limiter.uid(of: first) == 1000)
        #expect(asked.withLock { $0 } == 1 && limiter.unnamedCount == 0, "asked once, then kept")
        let second = limiter.admitUnnamed(asking: ask)
        #expect(second != nil && limiter.unnamedCount == 1)
        // Two open, the limit: the third names the second, and 1000 has two.
        #expect(limiter.admitUnnamed(asking: ask) == nil && asked.withLock { $0 } == 3)
        // Released, named or not, each gives its place back (the unnamed list stays whole).
        limiter.release(first)
        if let second { limiter.release(second) }
        limiter.release(first)  // a second release changes nothing
        let again = (0..<2).compactMap { _ in limiter.admitUnnamed(asking: ask) }
        #expect(again.count == 2 && limiter.unnamedCount == 2)
        limiter.release(again[0])
        #expect(limiter.unnamedCount == 1 && limiter.uid(of: again[1]) == 1000 && limiter.unnamedCount == 0)
        #expect(limiter.uid(of: again[0]) == nil, "a released connection is nobody's")
    }
}
