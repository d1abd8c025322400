import Foundation
import LMXCore
import LMXStatusClient
import Synchronization
import Testing

/// A port for a test's server or gateway: never one handed out before in this run, free when
/// handed out (bound and let go here), below the kernel's range of ports for outgoing connections
/// (32768–60999 by default: any connection the agent or a test opens could take one of those
/// between now and the server's `bind`, which then fails), and away from the benchmarks' ports.
func freePort() -> Int { TestPorts.shared.next() }

final class TestPorts: Sendable {
    static let shared = TestPorts()
    private let counter = Mutex(Int.random(in: 0..<10_000))

    func next() -> Int {
        let low = 20_000
        let high = min(Self.ephemeralLow(), 32_768)
        while true {
            let port = counter.withLock { index in
                defer { index += 1 }
                return low + index % (high - low)
            }
            if (21_700..<21_800).contains(port) { continue }  // the benchmarks'
            if Self.bindable(port) { return port }
        }
    }

    /// The first port of the kernel's range for outgoing connections.
    private static func ephemeralLow() -> Int {
        let range = (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8)) ?? ""
        return range.split(whereSeparator: \.isWhitespace).first.flatMap { Int($0) } ?? 32_768
    }

    /// A TCP socket can be bound to the port on every address now.
    private static func bindable(_ port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return true }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr = in_addr(s_addr: INADDR_ANY)
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }
}

/// A config that browses only the test bridge, with a short stability window so tests are quick.
/// - Parameter trust: the trust policy; failover tests whose tunnel is a separate test server (not
///   the LAN server's own tunnel, so it vouches for no LAN address) use `lan`.
func config(
    window: Double = 3, endpoints: [String] = [], extraCA: String? = nil, extra: String = "", top: String? = nil,
    trust: String? = nil
) -> String {
    var fields = [
        #""interfaces": ["lmxbr0"]"#,
        #""health": {"stability_window": \#(window)\#(extra)}"#,
        #""endpoints": [\#(endpoints.joined(separator: ","))]"#,
    ]
    if let extraCA { fields.append(#""extra_ca_file": "\#(extraCA)""#) }
    if let top { fields.append(top) }
    if let trust { fields.append(#""trust": "\#(trust)""#) }
    return "{" + fields.joined(separator: ", ") + "}"
}

func wanEndpoint(_ url: String, id: String? = nil, secret: String? = nil, admin: String? = nil) -> String {
    var parts = [#""url": "\#(url)""#, #""via": "wan""#, #""name": "tunnel""#]
    if let id { parts.append(#""cf_access_client_id": "\#(id)""#) }
    if let secret { parts.append(#""cf_access_client_secret": "\#(secret)""#) }
    if let admin { parts.append(#""admin_key": "\#(admin)""#) }
    return "{" + parts.joined(separator: ", ") + "}"
}

@Suite("lmx-agentd end to end (real avahi, namespace hosts, LMX test servers)", .serialized)
struct AgentTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    var caFile: String { bed["LMX_TESTBED_TLS"] + "/ca.pem" }

    @Test("a LAN server that appears is active within 1.5 s of its announcement")
    func lanServerAppears() async throws {
        try await withResources {
            let agent = try await AgentProcess.start(bed, config: config())
            let port = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "appear-\(port)")
            _ = try await Publish.avahi(bed, on: .h1, name: "agent appear \(TestBed.tag())", port: port)

            let seconds = await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL }
            #expect(seconds != nil)
            #expect((seconds ?? 99) <= 1.5)
            let active = agent.active()
            #expect(active?.via == .lan)
            #expect(active?.instanceID == "appear-\(port)")
            #expect(active?.openAIBaseURL == server.baseURL + "/v1")
            #expect(active?.verdict == .ready)
        }
    }

    @Test("LAN server gone with a goodbye → WAN within 1 s; back on the LAN after the stability window")
    func failoverOnGoodbyeAndReturn() async throws {
        try await withResources {
            let wanPort = freePort()
            _ = try await LMXServer.start(
                bed, on: .root, port: wanPort, instance: "tunnel-\(wanPort)", bind: "127.0.0.1", tls: true)
            let agent = try await AgentProcess.start(
                bed,
                config: config(
                    window: 3, endpoints: [wanEndpoint("https://127.0.0.1:\(wanPort)")], extraCA: caFile, trust: "lan"))
            #expect(await agent.waitForActive(timeout: 5) { $0?.via == .wan } != nil)

            let port = freePort()
            let name = "agent goodbye \(TestBed.tag())"
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "gb-\(port)")
            var publisher = try await Publish.avahi(bed, on: .h1, name: name, port: port)
            // A server that never failed replaces the WAN at once.
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)

            await server.stop()
            await publisher.stop()  // avahi-daemon sends the goodbye
            let failover = await agent.waitForActive(timeout: 5) { $0?.via == .wan }
            #expect(failover != nil)
            #expect((failover ?? 99) <= 1.0)

            // The agent keeps probing the remembered route (with backoff), so it may see the server
            // before the announcement: count from the server's start.
            let backStarted = ContinuousClock.now
            let back = try await LMXServer.start(bed, on: .h1, port: port, instance: "gb-\(port)")
            publisher = try await Publish.avahi(bed, on: .h1, name: name, port: port)
            let returned = await agent.waitForActive(timeout: 12) { $0?.baseURL == back.baseURL }
            #expect(returned != nil)
            let sinceStart = (ContinuousClock.now - backStarted).seconds
            // The window is 3 s in this test's config; it came back from a failure, so it must wait.
            #expect(sinceStart >= 3.0)
            #expect(sinceStart <= 9.0)

            let events = try agent.client.request("GET", "/v1/events?limit=50")
            let list = try JSONDecoder().decode([StatusAPI.Event].self, from: Data(events.body))
            let switches = list.filter { $0.kind == "active" }
            #expect(switches.count == 4)
            #expect(switches.allSatisfy { !$0.reason.isEmpty })
            // Each switch's cause as a code: the first route usable, a better one, the LAN lost, back.
            let causes = switches.map(\.cause)
            #expect(causes == [.firstUsable, .preferred, causes.count == 4 ? causes[2] : nil, .preferred], "\(causes)")
            #expect(causes.count == 4 && [Cause.refused, .reset].contains(causes[2]), "\(causes)")
        }
    }

    @Test("LAN server refusing connections (mDNS still announcing) → WAN within 1 s")
    func failoverOnRefused() async throws {
        try await withResources {
            let wanPort = freePort()
            _ = try await LMXServer.start(bed, on: .root, port: wanPort, bind: "127.0.0.1", tls: true)
            let port = freePort()
            let server = try await LMXServer.start(bed, on: .h2, port: port)
            _ = try await Publish.avahi(bed, on: .h2, name: "agent refused \(TestBed.tag())", port: port)
            let agent = try await AgentProcess.start(
                bed,
                config: config(endpoints: [wanEndpoint("https://127.0.0.1:\(wanPort)")], extraCA: caFile, trust: "lan"))
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
            try await Task.sleep(for: .seconds(1))

            await server.set("dead")
            let failover = await agent.waitForActive(timeout: 5) { $0?.via == .wan }
            #expect(failover != nil)
            #expect((failover ?? 99) <= 1.0)
            let lan = try agent.status().candidates.flatMap(\.routes).first { $0.id == server.routeID }
            #expect(lan?.lastProbe?.detail == "connection refused")
        }
    }

    @Test("LAN link cut so packets vanish → WAN within 6 s; link back → LAN again")
    func failoverOnBlackHole() async throws {
        try await withResources {
            let wanPort = freePort()
            _ = try await LMXServer.start(bed, on: .root, port: wanPort, bind: "127.0.0.1", tls: true)
            let port = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port)
            _ = try await Publish.avahi(bed, on: .h1, name: "agent blackhole \(TestBed.tag())", port: port)
            let agent = try await AgentProcess.start(
                bed,
                config: config(endpoints: [wanEndpoint("https://127.0.0.1:\(wanPort)")], extraCA: caFile, trust: "lan"))
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)

            try await bed.control("link", "h1", "down")
            let failover = await agent.waitForActive(timeout: 10) { $0?.via == .wan }
            try await bed.control("link", "h1", "up")
            #expect(failover != nil)
            #expect((failover ?? 99) <= 6.0)
            let lan = try agent.status().candidates.flatMap(\.routes).first { $0.id == server.routeID }
            #expect(lan?.lastProbe?.detail == "timed out")

            // Back on the LAN once it has been healthy for the window (3 s) and re-probed (backoff ≤ 4 s).
            #expect(await agent.waitForActive(timeout: 20) { $0?.baseURL == server.baseURL } != nil)
        }
    }

    @Test("ready beats not ready; lower latency wins among equals; one server on two addresses is one candidate")
    func selectionRules() async throws {
        try await withResources {
            let notReadyPort = freePort()
            let fastPort = freePort()
            let slowPort = freePort()
            _ = try await LMXServer.start(
                bed, on: .h1, port: notReadyPort, instance: "nr-\(notReadyPort)", mode: "notready")
            let slow = try await LMXServer.start(bed, on: .h2, port: slowPort, instance: "slow-\(slowPort)")
            await slow.set("slow 150")
            // One server reachable at two addresses: bound to every address of this machine.
            let fast = try await LMXServer.start(
                bed, on: .root, port: fastPort, instance: "fast-\(fastPort)", bind: "0.0.0.0")
            let endpoints = [
                #"{"url": "http://10.254.0.11:\#(notReadyPort)"}"#,
                #"{"url": "http://10.254.0.12:\#(slowPort)"}"#,
                #"{"url": "http://10.254.0.1:\#(fastPort)"}"#,
                #"{"url": "http://127.0.0.1:\#(fastPort)"}"#,
            ]
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: endpoints), arguments: ["--no-discovery"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.instanceID == "fast-\(fastPort)" } != nil)
            // The fast server can be active before the other routes' first probes are in: wait for
            // them (both of the fast server's addresses, and a verdict for the not-ready one).
            let status = await agent.waitForStatus(timeout: 5) { status in
                status.candidates.contains { $0.instanceID == "nr-\(notReadyPort)" && $0.verdict != nil }
                    && status.candidates.contains { $0.instanceID == "fast-\(fastPort)" && $0.routes.count == 2 }
            }
            let candidates = status?.candidates ?? []
            let fastCandidate = candidates.filter { $0.instanceID == "fast-\(fastPort)" }
            #expect(fastCandidate.count == 1)
            #expect(fastCandidate.first?.routes.count == 2)
            #expect(candidates.first { $0.instanceID == "nr-\(notReadyPort)" }?.verdict == .aliveNotReady)

            // Without the fast server: the ready one (slow) beats the not-ready one.
            await fast.set("dead")
            #expect(await agent.waitForActive(timeout: 5) { $0?.instanceID == "slow-\(slowPort)" } != nil)
        }
    }

    @Test("401/403 show as auth-rejected, never down; wrong Access token too; overloaded is alive but not preferred")
    func authAndOverload() async throws {
        try await withResources {
            let wanPort = freePort()
            let lanPort = freePort()
            let overPort = freePort()
            let tunnel = try await LMXServer.start(
                bed, on: .root, port: wanPort, bind: "127.0.0.1", tls: true,
                requireAccess: ("svc.access", "right-secret"))
            let lan = try await LMXServer.start(bed, on: .h1, port: lanPort, instance: "auth-\(lanPort)")
            let overloaded = try await LMXServer.start(
                bed, on: .h2, port: overPort, instance: "over-\(overPort)", mode: "overloaded")
            let endpoints = [
                wanEndpoint("https://127.0.0.1:\(wanPort)", id: "svc.access", secret: "wrong-secret-XYZ"),
                #"{"url": "http://10.254.0.11:\#(lanPort)"}"#,
                #"{"url": "http://10.254.0.12:\#(overPort)"}"#,
            ]
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: endpoints, extraCA: caFile), arguments: ["--no-discovery"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.instanceID == "auth-\(lanPort)" } != nil)
            let wan = await agent.waitForRoute(timeout: 5) { $0.via == .wan && $0.verdict != nil }
            #expect(wan?.verdict == .authRejected)
            #expect(wan?.health == .down)
            let over = await agent.waitForRoute(timeout: 5) {
                $0.baseURL.hasSuffix(":\(overPort)") && $0.verdict != nil
            }
            #expect(over?.verdict == .overloaded)
            #expect(over?.health == .up)
            #expect(over?.active == false)

            // A LAN server answering 403 is auth-rejected, not down.
            await lan.set("403")
            let rejected = await agent.waitForRoute(timeout: 8) {
                $0.baseURL == lan.baseURL && $0.verdict == .authRejected
            }
            #expect(rejected != nil)
            // Then the overloaded server, alive, is better than nothing.
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == overloaded.baseURL } != nil)
            // The Access token went on every request to the tunnel; nothing else did.
            #expect(!tunnel.requests.isEmpty)
            #expect(tunnel.requests.allSatisfy { $0.hasSuffix(" CF-Access-Client-Id,CF-Access-Client-Secret") })
            #expect(lan.requests.allSatisfy { $0.hasSuffix(" -") })
            // The secret never leaves the agent.
            let status = try agent.client.request("GET", "/v1/status").body
            #expect(!String(decoding: status, as: UTF8.self).contains("wrong-secret-XYZ"))
            #expect(!agent.process.stderr.contains("wrong-secret-XYZ"))
        }
    }

    @Test("a TLS certificate from an unknown CA is down (TLS failure), never trusted")
    func untrustedCertificate() async throws {
        try await withResources {
            let port = freePort()
            _ = try await LMXServer.start(
                bed, on: .root, port: port, bind: "127.0.0.1", tls: true, rogueCertificate: true)
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [wanEndpoint("https://127.0.0.1:\(port)")], extraCA: caFile),
                arguments: ["--no-discovery"])
            let route = await agent.waitForRoute(timeout: 10) { $0.verdict != nil }
            #expect(route?.verdict == .down)
            #expect(route?.lastProbe?.detail?.hasPrefix("TLS failure") == true)
            #expect(agent.active() == nil)
        }
    }

    @Test("avahi-daemon restarted while the LAN server stays up → no failover")
    func avahiRestartNoFailover() async throws {
        try await withResources {
            let wanPort = freePort()
            _ = try await LMXServer.start(bed, on: .root, port: wanPort, bind: "127.0.0.1", tls: true)
            let port = freePort()
            let server = try await LMXServer.start(bed, on: .h2, port: port)
            _ = try await Publish.avahi(bed, on: .h2, name: "agent avahi restart \(TestBed.tag())", port: port)
            let agent = try await AgentProcess.start(
                bed,
                config: config(endpoints: [wanEndpoint("https://127.0.0.1:\(wanPort)")], extraCA: caFile, trust: "lan"))
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)

            try await bed.control("restart-avahi", "root")
            let deadline = ContinuousClock.now + .seconds(6)
            var everLeft = false
            while ContinuousClock.now < deadline {
                if agent.active()?.baseURL != server.baseURL { everLeft = true }
                try await Task.sleep(for: .milliseconds(50))
            }
            #expect(!everLeft)
            let status = try agent.status()
            #expect(status.avahi == "running")
            #expect(
                agent.process.stderr.contains("mDNS discovery lost avahi-daemon and is connecting again.")
                    || agent.process.stderr.contains("mDNS discovery is waiting for avahi-daemon"))
        }
    }

    @Test("restarted daemon: last-good endpoint restored and active within 1 s, without waiting for mDNS")
    func restartRestoresLastGood() async throws {
        try await withResources {
            let port = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "restore-\(port)")
            let publisher = try await Publish.avahi(bed, on: .h1, name: "agent restore \(TestBed.tag())", port: port)
            let agent = try await AgentProcess.start(bed, config: config())
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
            await agent.stop()
            // No announcement any more: only the store knows the server.
            await publisher.stop()
            try await Task.sleep(for: .seconds(2))

            let started = ContinuousClock.now
            let again = try await AgentProcess.start(
                bed, config: config(), arguments: ["--no-discovery"], directory: agent.directory)
            let seconds = await again.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL }
            let total = (ContinuousClock.now - started).seconds
            #expect(seconds != nil)
            #expect(total <= 1.0)
            #expect(again.active()?.source == .remembered)
        }
    }

    @Test("a corrupt database file is moved aside and the daemon starts")
    func corruptDatabase() async throws {
        try await withResources {
            let directory = AgentProcess.makeDirectory()
            try FileManager.default.createDirectory(atPath: directory + "/state", withIntermediateDirectories: true)
            try Data(repeating: 0x42, count: 16_384).write(to: URL(fileURLWithPath: directory + "/state/agent.db"))
            let agent = try await AgentProcess.start(
                bed, config: config(), arguments: ["--no-discovery"], directory: directory)
            #expect(agent.isServing)
            #expect(agent.process.stderr.contains("is corrupt"))
            let files = try FileManager.default.contentsOfDirectory(atPath: directory + "/state")
            #expect(files.contains { $0.hasPrefix("agent.db.corrupt-") })
            let mode =
                try FileManager.default.attributesOfItem(atPath: directory + "/state/agent.db")[.posixPermissions]
                as? Int
            #expect(mode == 0o600)
        }
    }

    @Test("a second daemon on the same socket refuses to start; a stale socket file is replaced")
    func singleInstance() async throws {
        try await withResources {
            let agent = try await AgentProcess.start(bed, config: config(), arguments: ["--no-discovery"])
            let second = try await Command.run(
                "\(TestBed.binDir)/lmx-agentd",
                ["--socket", agent.socket, "--db", agent.directory + "/other.db", "--no-discovery"])
            #expect(second.status == 73)
            #expect(second.stderr.contains("already serving"))
            #expect(agent.isServing)

            // A daemon killed without cleanup leaves its socket file behind.
            agent.process.signal(SIGKILL)
            _ = await agent.process.waitFor(timeout: 5) { !$0.isRunning }
            #expect(FileManager.default.fileExists(atPath: agent.socket))
            let third = try await AgentProcess.start(
                bed, config: config(), arguments: ["--no-discovery"], directory: agent.directory)
            #expect(third.isServing)
            #expect(third.process.stderr.contains("stale socket"))
            await third.stop()
            #expect(!FileManager.default.fileExists(atPath: agent.socket))  // removed on a clean stop
            await third.finish()
        }
    }
}
