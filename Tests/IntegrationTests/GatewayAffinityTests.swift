import Foundation
import LMXCore
import Testing

/// Objects that live on one server (agent runs, RAG collections, stored responses, CONTRACT §8)
/// through the gateway, with two real servers: each request naming one reaches the server that
/// made it, also when the other one is active; when that server cannot be reached, an honest 503
/// naming it, never the other server's 404.
@Suite("The gateway's server affinity (two real servers)", .serialized)
struct GatewayAffinityTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    @Test(
        "runs, collections and responses go back to the server that made them, by whichever route; gone: 503 naming it")
    func affinity() async throws {
        try await withResources {
            let portA = freePort()
            let portB = freePort()
            let a = try await LMXServer.start(
                bed, on: .h1, port: portA, instance: "alpha-\(portA)", extra: ["--agents"])
            let b = try await LMXServer.start(bed, on: .h2, port: portB, instance: "beta-\(portB)", extra: ["--agents"])
            let endpoints = [
                #"{"url": "http://10.254.0.11:\#(portA)", "name": "Alpha"}"#,
                #"{"url": "http://10.254.0.12:\#(portB)", "name": "Beta"}"#,
            ]
            let agent = try await AgentProcess.start(
                bed,
                config: config(
                    window: 1, endpoints: endpoints,
                    top: #""prefer": ["beta-\#(portB)"], "gateway": {"hold_seconds": 1}"#),
                arguments: ["--no-discovery", "--gateway", "off"])
            let socket = agent.directory + "/gateway.sock"
            func call(_ method: String, _ path: String, _ body: String? = nil) async throws -> (
                status: Int, body: [String: Any]
            ) {
                var arguments = ["--unix-socket", socket, "-X", method]
                if let body { arguments += ["-H", "Content-Type: application/json", "-d", body] }
                let result = try await curl(arguments + ["http://localhost" + path])
                let object = (try? JSONSerialization.jsonObject(with: Data(result.body.utf8)) as? [String: Any]) ?? [:]
                return (result.status, object)
            }
            func server(_ answer: (status: Int, body: [String: Any])) -> String? { answer.body["server"] as? String }

            // Beta away: the objects are made on Alpha.
            await b.set("dead")
            #expect(await agent.waitForActive(timeout: 10) { $0?.baseURL == a.baseURL } != nil)
            let run = try await call("POST", "/v1/agents/runs", #"{"agent": "research", "input": "x"}"#)
            let runID = run.body["id"] as? String ?? ""
            #expect(run.status == 201 && server(run) == "alpha-\(portA)", "\(run)")
            let ingest = try await call("POST", "/v1/rag/ingest", #"{"collection": "docs", "documents": ["d"]}"#)
            #expect(ingest.status == 200 && server(ingest) == "alpha-\(portA)")
            let response = try await call("POST", "/v1/responses", #"{"model": "test/model", "input": "hi"}"#)
            let responseID = response.body["id"] as? String ?? ""
            #expect(response.status == 200 && server(response) == "alpha-\(portA)")

            // Beta back, and active (preferred): new work goes there, the objects still to Alpha.
            await b.set("alive")
            #expect(
                await agent.waitForActive(timeout: 15) { $0?.baseURL == b.baseURL } != nil, "Beta never became active")
            var answers: [(status: Int, body: [String: Any])] = []
            for _ in 0..<5 { answers.append(try await call("GET", "/v1/agents/runs/\(runID)")) }
            answers.append(try await call("POST", "/v1/agents/runs/\(runID)/cancel", "{}"))
            answers.append(try await call("POST", "/v1/rag/query", #"{"collection": "docs", "query": "q"}"#))
            answers.append(try await call("GET", "/v1/rag/collections/docs"))
            answers.append(
                try await call(
                    "POST", "/v1/responses", #"{"model": "test/model", "previous_response_id": "\#(responseID)"}"#))
            for answer in answers {
                #expect(answer.status == 200 && server(answer) == "alpha-\(portA)", "\(answer)")
            }
            // Its event stream too (whole snapshots, to run.completed and [DONE]).
            let events = try await curl([
                "--unix-socket", socket, "-sN", "http://localhost/v1/agents/runs/\(runID)/events",
            ])
            #expect(events.status == 200 && events.body.contains(#""server": "alpha-\#(portA)""#), "\(events.body)")
            #expect(events.body.contains("event: run.completed") && events.body.contains("data: [DONE]"))
            let fresh = try await call("POST", "/v1/agents/runs", #"{"agent": "research"}"#)
            #expect(server(fresh) == "beta-\(portB)", "new work goes to the active server")
            let unknown = try await call("GET", "/v1/agents/runs/run-nobody-knows")
            #expect(unknown.status == 404, "an object the gateway never saw goes where any request goes")

            // Alpha gone: an honest error naming it, never Beta's 404.
            await a.set("dead")
            var last: (status: Int, body: [String: Any]) = (0, [:])
            let deadline = ContinuousClock.now + .seconds(15)
            while ContinuousClock.now < deadline {
                last = try await call("GET", "/v1/agents/runs/\(runID)")
                #expect(last.status != 404, "another server's 404 reached the client")
                if last.status == 503 { break }
                try await Task.sleep(for: .milliseconds(200))
            }
            let error = last.body["error"] as? [String: Any]
            #expect(last.status == 503 && error?["code"] as? String == "server_unreachable", "\(last)")
            #expect((error?["message"] as? String)?.contains("agent run \(runID) is on Alpha") == true, "\(last)")
            #expect(b.requests.filter { $0.contains(runID) }.isEmpty, "Beta was asked for Alpha's run")
            // All of it on the data path: made objects read from answers as they pass, named ones
            // routed to their server, the 503 for one no route reaches.
            let metrics = String(decoding: try agent.client.request("GET", "/metrics").body, as: UTF8.self)
            #expect(metrics.contains("lmx_gateway_general_path_total 0"), "handed to the general path")
        }
    }
}
