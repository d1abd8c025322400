import Foundation
import LMXCore
import LMXStatusClient
import Testing

/// The active server's `/admin/events` stream, followed when its admin key is known.
@Suite("Passive health from the server's event stream", .serialized)
struct PassiveHealthTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    @Test(
        "model events reach the agent within a second (between full probes); a silent stream counts as a failed probe and is reopened"
    )
    func events() async throws {
        try await withResources {
            let port = freePort()
            let server = try await LMXServer.start(
                bed, on: .h1, port: port, instance: "events-\(port)", extra: ["--heartbeat", "0.5"])
            let endpoint =
                #"{"url": "http://10.254.0.11:\#(port)", "name": "Studio", "admin_key": "test-admin-key", "allow_insecure": true}"#
            // Full probes only every 60 s: what changes sooner came through the event stream.
            let agent = try await AgentProcess.start(
                bed,
                config: config(endpoints: [endpoint], extra: #", "stable_interval": 60, "event_heartbeat_timeout": 2"#),
                arguments: ["--no-discovery"])
            #expect(await agent.waitForActive(timeout: 8) { $0?.baseURL == server.baseURL } != nil)
            #expect(
                await server.process.waitFor(timeout: 5) { _ in
                    server.requests.contains { $0.hasPrefix("REQ /admin/events X-Admin-Key") }
                })
            try await Task.sleep(for: .seconds(1))

            let loaded = ContinuousClock.now
            await server.set("load extra/model")
            let seen = await agent.waitForRoute(timeout: 5) {
                $0.baseURL == server.baseURL && $0.loadedModels?.contains("extra/model") == true
            }
            #expect(seen != nil)
            let loadSeconds = (ContinuousClock.now - loaded).seconds
            #expect(loadSeconds < 1.5)
            await server.set("unload test/model")
            #expect(
                await agent.waitForRoute(timeout: 5) {
                    $0.baseURL == server.baseURL && $0.loadedModels == ["extra/model"]
                } != nil)
            let resolved = try JSONDecoder().decode(
                StatusAPI.Resolved.self,
                from: Data(try agent.client.request("GET", "/v1/resolve?model=extra/model").body))
            #expect(resolved.endpoint?.baseURL == server.baseURL)

            // Heartbeats stop while the connection stays open: after 2 s of silence the agent
            // records a failed probe and opens the stream again.
            let before = server.requests.filter { $0.hasPrefix("REQ /admin/events") }.count
            await server.set("mute")
            #expect(
                await agent.process.waitFor(timeout: 6) { $0.stderr.contains("no heartbeat on /admin/events for 2 s") })
            await server.set("unmute")
            #expect(
                await server.process.waitFor(timeout: 6) { _ in
                    server.requests.filter { $0.hasPrefix("REQ /admin/events") }.count > before
                })
            let metrics = String(decoding: try agent.client.request("GET", "/metrics").body, as: UTF8.self)
            #expect(metrics.contains("lmx_server_events_total"))
            print("figure: model_loaded event → agent's model list in \(loadSeconds) s (full probes every 60 s)")
            // The admin key never shows.
            #expect(!agent.process.stderr.contains("test-admin-key"))
        }
    }
}
