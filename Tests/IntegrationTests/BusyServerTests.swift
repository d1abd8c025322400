import Foundation
import LMXCore
import LMXStatusClient
import Testing

/// Live streams judged by their own connection, and probing proportional to use, against real
/// test servers on the test LAN: a busy server (health answering late while it streams) keeps its
/// stream; a server gone silent ends its stream by the stream's own connection; an idle agent asks
/// its server little; a route that vanished while nobody looked is not handed out.
@Suite("Busy servers, idle agents: streams judged by their own connection, probing by use", .serialized)
struct BusyServerTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    private var client: String { "\(TestBed.repo)/scripts/fixtures/gateway-client.py" }

    private func json(_ result: CommandResult) -> [String: Any] {
        let line = result.stdout.split(separator: "\n").last.map(String.init) ?? ""
        return (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]) ?? [:]
    }

    private func endpoint(_ server: LMXServer, name: String) -> String {
        #"{"url": "\#(server.baseURL)", "name": "\#(name)", "allow_insecure": true}"#
    }

    @Test(
        "a busy server's generation is not cut: health answering in 2.5 s (past the 1.5 s LAN timeout) while the stream is quiet for 4 s arrives whole, and the route stays up"
    )
    func busyStreamArrivesWhole() async throws {
        try await withResources {
            let port = freePort()
            let gatewayPort = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "busy-\(port)")
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [endpoint(server, name: "Studio")]),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
            await server.set("slow-health 2500")
            await server.set("pause 4000")
            let started = ContinuousClock.now
            let stream = json(
                try await Command.run(
                    "/usr/bin/python3", [client, "stream", "http://127.0.0.1:\(gatewayPort)/v1"], timeout: 30))
            let took = (ContinuousClock.now - started).seconds
            #expect(stream["error_event"] is NSNull || stream["error_event"] == nil, "\(stream)")
            #expect(stream["done"] as? Bool == true, "\(stream)")
            #expect(stream["events"] as? Int == 20, "\(stream)")
            #expect(took >= 4, "the stream's quiet phase was \(took) s long")
            // Its probes timed out meanwhile; the route was judged busy, not gone.
            let route = try agent.status().candidates.flatMap(\.routes).first { $0.baseURL == server.baseURL }
            #expect(route?.health == .up, "\(String(describing: route))")
            #expect(agent.active()?.baseURL == server.baseURL)
            #expect(!agent.process.stderr.contains("upstream_lost"))
            print("busy server: stream with 4 s of silence and 2.5 s health answers arrived whole in \(took) s")
        }
    }

    @Test(
        "a stream to a server gone silent (its link cut) ends by its own connection within 8 s, with the upstream_lost event"
    )
    func silentServerEndsStream() async throws {
        try await withResources {
            let port = freePort()
            let gatewayPort = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "gone-\(port)")
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [endpoint(server, name: "Studio")]),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
            await server.set("pause 60000")
            async let streamed = Command.run(
                "/usr/bin/python3", [client, "stream", "http://127.0.0.1:\(gatewayPort)/v1"], timeout: 40)
            try await Task.sleep(for: .milliseconds(800))
            let cut = ContinuousClock.now
            try await bed.control("link", "h1", "down")
            let result: CommandResult
            do {
                result = try await streamed
            } catch {
                try? await bed.control("link", "h1", "up")
                throw error
            }
            let ended = (ContinuousClock.now - cut).seconds
            try await bed.control("link", "h1", "up")
            let stream = json(result)
            let error = (stream["error_event"] as? [String: Any])?["error"] as? [String: Any]
            #expect(error?["code"] as? String == "upstream_lost", "\(stream)")
            #expect(stream["events"] as? Int == 1, "\(stream)")
            #expect(ended <= 8, "the stream ended \(ended) s after its server went silent")
            print("silent server: its stream ended by its own connection \(ended) s after the cut")
        }
    }

    @Test(
        "idle: the active server gets at most 12 requests a minute; lmx-status --url after the server vanished (link cut) names the standby within 0.6 s"
    )
    func idleCostAndFreshCheck() async throws {
        try await withResources {
            let port = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "idle-\(port)")
            let standby = try await LMXServer.start(bed, on: .h2, port: freePort(), instance: "standby-\(port)")
            let agent = try await AgentProcess.start(
                bed,
                // Studio first among the two equal LAN servers.
                config: config(
                    endpoints: [endpoint(server, name: "Studio"), endpoint(standby, name: "Spare")],
                    top: #""prefer": ["idle-\#(port)"]"#),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(freePort())"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
            // Settle, then count what the idle agent asks for 30 s.
            try await Task.sleep(for: .seconds(5))
            let before = server.requests.count
            try await Task.sleep(for: .seconds(30))
            let asked = server.requests.count - before
            #expect(asked <= 6, "the idle agent sent its active server \(asked) requests in 30 s")
            // The server vanishes without a word while nobody looks.
            try await bed.control("link", "h1", "down")
            let started = ContinuousClock.now
            let url: CommandResult
            do {
                url = try await Command.run(
                    "\(TestBed.binDir)/lmx-status", ["--url", "--socket", agent.socket], timeout: 10)
            } catch {
                try? await bed.control("link", "h1", "up")
                throw error
            }
            let took = (ContinuousClock.now - started).seconds
            try await bed.control("link", "h1", "up")
            #expect(
                url.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == standby.baseURL,
                "\(url.stdout) \(url.stderr)")
            #expect(took <= 0.6, "lmx-status --url took \(took) s")
            print(
                "idle agent: \(asked) requests to its active server in 30 s; --url after a silent loss: \(String(format: "%.3f", took)) s"
            )
        }
    }
}
