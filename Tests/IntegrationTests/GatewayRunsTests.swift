import Foundation
import LMXCore
import Testing

/// Agent runs through the gateway against a test server that keeps them as the real one does
/// (CONTRACT §8a: whole snapshots polled every 250 ms, keep-alive comments, `run.completed`,
/// `[DONE]`, `Idempotency-Key`, the API only where enabled).
@Suite("Agent runs through the gateway: made once, followed to the end", .serialized)
struct GatewayRunsTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    @Test(
        "a run is made once when the server made it and its answer was lost (the gateway's Idempotency-Key, sent again); its events arrive as whole snapshots to run.completed and [DONE]; the same key with another body is 409"
    )
    func runsMadeOnce() async throws {
        try await withResources {
            let port = freePort()
            let server = try await LMXServer.start(
                bed, on: .h1, port: port, instance: "runs-\(port)",
                extra: ["--agents", "--run-step-ms", "100", "--run-steps", "6", "--run-keepalive", "0.3"])
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [#"{"url": "\#(server.baseURL)", "name": "Studio"}"#]),
                arguments: ["--no-discovery", "--gateway", "off"])
            #expect(await agent.waitForActive(timeout: 10) { $0?.baseURL == server.baseURL } != nil)
            let socket = agent.directory + "/gateway.sock"
            func made() -> Int { server.process.stdoutLines.filter { $0.hasPrefix("RUN MADE") }.count }

            // The server makes the run, then its connection dies before the answer.
            await server.set("drop-after-run")
            let created = try await curl([
                "--unix-socket", socket, "-H", "Content-Type: application/json", "-d",
                #"{"agent": "research", "input": {"q": "x"}}"#, "http://localhost/v1/agents/runs",
            ])
            let run = (try? JSONSerialization.jsonObject(with: Data(created.body.utf8)) as? [String: Any]) ?? [:]
            let runID = run["id"] as? String ?? ""
            #expect(created.status == 201 && runID.hasPrefix("run-"), "\(created)")
            #expect(made() == 1, "one run: \(server.process.stdoutLines.filter { $0.hasPrefix("RUN") })")
            #expect(server.process.stdoutLines.contains("RUN AGAIN \(runID)"), "sent again with the same key")
            #expect(server.process.stdoutLines.contains { $0.hasPrefix("RUN MADE \(runID) key=yes") })

            // Its events: every snapshot the server sent reaches the client, whole, in order.
            let events = try await curl([
                "--unix-socket", socket, "-N", "http://localhost/v1/agents/runs/\(runID)/events",
            ])
            #expect(events.status == 200)
            let sent = server.process.stdoutLines.filter { $0.hasPrefix("EVENT \(runID) ") }
            let updates = events.body.components(separatedBy: "\n").filter { $0.hasPrefix("data: {") }
            #expect(updates.count == sent.count && sent.count >= 2, "sent \(sent), got \(updates)")
            let steps = updates.compactMap { line -> Int? in
                let object = try? JSONSerialization.jsonObject(with: Data(line.dropFirst(6).utf8)) as? [String: Any]
                return ((object?["run"] as? [String: Any])?["steps"] as? [Any])?.count
            }
            #expect(steps == steps.sorted() && steps.last == 6, "\(steps)")
            #expect(events.body.contains("event: run.completed") && events.body.hasSuffix("data: [DONE]\n\n"))
            #expect(!events.body.contains("event: error"))

            // The same key with another request: 409 from the server, passed through.
            func create(_ body: String, key: String) async throws -> Int {
                try await curl([
                    "--unix-socket", socket, "-H", "Idempotency-Key: \(key)", "-d", body,
                    "http://localhost/v1/agents/runs",
                ]).status
            }
            #expect(try await create(#"{"agent": "a"}"#, key: "k-1") == 201)
            #expect(try await create(#"{"agent": "a"}"#, key: "k-1") == 201)
            #expect(try await create(#"{"agent": "b"}"#, key: "k-1") == 409)
            #expect(made() == 2)
            // A run it does not have: run.error, then [DONE].
            let unknown = try await curl([
                "--unix-socket", socket, "-N", "http://localhost/v1/agents/runs/run-nobody/events",
            ])
            #expect(unknown.body.contains("event: run.error") && unknown.body.contains("run_not_found"))
        }
    }

    @Test("the test server keeps the runs API to where it is enabled, and sends keep-alive comments on a quiet stream")
    func runsAPIAsTheRealServer() async throws {
        try await withResources {
            let port = freePort()
            let off = try await LMXServer.start(bed, on: .h1, port: port)
            let plain = try await curl(["-d", "{}", off.baseURL + "/v1/agents/runs"])
            #expect(plain.status == 404 && plain.body.contains("Not Found"))
            let onPort = freePort()
            let on = try await LMXServer.start(
                bed, on: .h2, port: onPort,
                extra: ["--agents", "--run-step-ms", "700", "--run-steps", "1", "--run-keepalive", "0.2"])
            let made = try await curl(["-d", #"{"agent": "a"}"#, on.baseURL + "/v1/agents/runs"])
            let id =
                ((try? JSONSerialization.jsonObject(with: Data(made.body.utf8))) as? [String: Any])?["id"] as? String
            let events = try await curl(["-N", on.baseURL + "/v1/agents/runs/\(id ?? "")/events"])
            #expect(events.body.contains(": keep-alive\n\n"), "\(events.body)")
            #expect(events.body.contains("event: run.completed"))
        }
    }
}
