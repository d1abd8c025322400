import Testing

@testable import LMXCore

@Suite("Server affinity: objects that live on one server go back to it")
struct ServerAffinityTests {
    private func body(_ text: String) -> [UInt8] { Array(text.utf8) }

    @Test("which requests name an object, make one, or make one their answer names")
    func requests() {
        #expect(ServerAffinity.named(method: "GET", path: "/v1/agents/runs/run-7", body: []) == .agentRun("run-7"))
        #expect(
            ServerAffinity.named(method: "GET", path: "/v1/agents/runs/run-7/events", body: []) == .agentRun("run-7"))
        #expect(
            ServerAffinity.named(method: "POST", path: "/v1/agents/runs/run-7/cancel", body: []) == .agentRun("run-7"))
        #expect(ServerAffinity.named(method: "POST", path: "/v1/agents/runs", body: []) == nil)
        #expect(
            ServerAffinity.named(method: "DELETE", path: "/v1/rag/collections/docs", body: []) == .ragCollection("docs")
        )
        #expect(
            ServerAffinity.named(
                method: "POST", path: "/v1/rag/query", body: body(#"{"query": "x", "collection": "docs"}"#))
                == .ragCollection("docs"))
        #expect(
            ServerAffinity.named(
                method: "POST", path: "/v1/responses", body: body(#"{"model": "m", "previous_response_id": "resp_1"}"#))
                == .response("resp_1"))
        #expect(ServerAffinity.named(method: "POST", path: "/v1/responses", body: body(#"{"model": "m"}"#)) == nil)
        #expect(
            ServerAffinity.named(method: "POST", path: "/v1/chat/completions", body: body(#"{"model": "m"}"#)) == nil)
        // Ids the gateway does not follow: too long, or with characters no id has.
        #expect(
            ServerAffinity.named(method: "GET", path: "/v1/agents/runs/" + String(repeating: "a", count: 300), body: [])
                == nil)
        #expect(ServerAffinity.named(method: "GET", path: "/v1/agents/runs/a%2Fb", body: []) == nil)

        #expect(
            ServerAffinity.madeByRequest(method: "POST", path: "/v1/rag/ingest", body: body(#"{"collection": "docs"}"#))
                == .ragCollection("docs"))
        #expect(ServerAffinity.answerMakes(method: "POST", path: "/v1/agents/runs"))
        #expect(ServerAffinity.answerMakes(method: "POST", path: "/v1/responses"))
        #expect(!ServerAffinity.answerMakes(method: "GET", path: "/v1/agents/runs"))
        #expect(
            ServerAffinity.madeByAnswer(body(#"{"id": "run-9", "status": "queued"}"#), path: "/v1/agents/runs")
                == .agentRun("run-9"))
        #expect(
            ServerAffinity.madeByAnswer(body(#"{"object": "response", "id": "resp_2"}"#), path: "/v1/responses")
                == .response("resp_2"))
        #expect(ServerAffinity.madeByAnswer(body(#"{"id": 12}"#), path: "/v1/agents/runs") == nil)
    }

    @Test(
        "a path that may not concern an object (the data path's first check) is one no rule takes, on 20,000 generated paths"
    )
    func mayConcern() {
        let segments = [
            "v1", "agents", "agent", "runs", "run", "rag", "ra", "collections", "query", "context", "ingest", "ingests",
            "responses", "response", "chat", "completions", "models", "x", "Agents", "RAG", "docs", "run-7", "", "?a=b",
        ]
        var rng = SplitMix64(seed: 0xAFF1)
        let body = Array(#"{"collection": "docs", "previous_response_id": "resp_1"}"#.utf8)
        var concerned = 0
        for _ in 0..<20_000 {
            let count = Int(rng.next() % 6) + 1
            let path =
                "/" + (0..<count).map { _ in segments[Int(rng.next() % UInt64(segments.count))] }.joined(separator: "/")
            let may = ServerAffinity.mayConcern(path: path)
            if may { concerned += 1 }
            for method in ["GET", "POST", "DELETE"] {
                let any =
                    ServerAffinity.named(method: method, path: path, body: body) != nil
                    || ServerAffinity.madeByRequest(method: method, path: path, body: body) != nil
                    || ServerAffinity.answerMakes(method: method, path: path)
                #expect(may || !any, "\(method) \(path)")
            }
        }
        #expect(concerned > 5_000 && concerned < 19_000, "\(concerned)")
        #expect(
            !ServerAffinity.mayConcern(path: "/v1/chat/completions") && !ServerAffinity.mayConcern(path: "/v1/models"))
        #expect(ServerAffinity.mayConcern(path: "/v1/rag/ingest") && ServerAffinity.mayConcern(path: "/v1/agents/runs"))
    }

    @Test("the table is bounded, least recently used first, and forgets what expired")
    func table() {
        var table = AffinityTable(capacity: 64, lifetime: 100)
        for n in 0..<1_000 {
            table.record(.agentRun("r\(n)"), on: n.isMultiple(of: 2) ? "a" : "b", user: 1000, now: Double(n) / 100)
        }
        #expect(table.count <= 64)
        #expect(table.owner(of: .agentRun("r999"), user: 1000, now: 10) == "b")
        #expect(table.owner(of: .agentRun("r0"), user: 1000, now: 10) == nil, "the oldest was kept")
        // Used: renewed. Unused past the lifetime: gone.
        #expect(table.owner(of: .agentRun("r998"), user: 1000, now: 105) == "a")
        #expect(table.owner(of: .agentRun("r998"), user: 1000, now: 200) == "a")
        #expect(table.owner(of: .agentRun("r997"), user: 1000, now: 200) == nil)
    }

    @Test("affinity is per local user: another user's ingest of the same collection name moves nothing of yours")
    func perUser() {
        var table = AffinityTable(capacity: 64, lifetime: 100)
        table.record(.ragCollection("docs"), on: "a", user: 1000, now: 1)
        // Another user (or a peer the kernel named nobody) makes "docs" on server b.
        table.record(.ragCollection("docs"), on: "b", user: 1001, now: 2)
        table.record(.ragCollection("docs"), on: "c", user: nil, now: 3)
        #expect(table.owner(of: .ragCollection("docs"), user: 1000, now: 4) == "a")
        #expect(table.owner(of: .ragCollection("docs"), user: 1001, now: 4) == "b")
        #expect(table.owner(of: .ragCollection("docs"), user: nil, now: 4) == "c")
        #expect(table.owner(of: .ragCollection("docs"), user: 0, now: 4) == nil)
        #expect(table.count == 3)
    }

    @Test(
        "a request for a server's object goes only to that server's routes, LAN or tunnel; none usable is an empty plan"
    )
    func planToTheOwner() {
        var h = PlannerHarness { _, _ in .ready }
        // Server a on the LAN and through its tunnel, server b on the LAN; every LAN server trusted.
        h.instance = { id in id.contains("10.0.0.2") ? "b" : "a" }
        h.planner.policy.trust = .lan
        h.add(lan("10.0.0.1"))
        h.add(lan("10.0.0.2"))
        h.add(wan("https://a.example.com", pin: "a"))
        h.run(until: 5)
        let snapshot = AgentSnapshot(planner: h.planner, originWall: 0)
        guard case .forward(let toA) = snapshot.gatewayPlan(limit: 3, server: "a"),
            case .forward(let toB) = snapshot.gatewayPlan(limit: 3, server: "b"),
            case .forward(let toC) = snapshot.gatewayPlan(limit: 3, server: "c")
        else {
            Issue.record("refused")
            return
        }
        #expect(Set(toA.map(\.routeID)) == ["lan/10.0.0.1:1234", "wan/https://a.example.com"])
        #expect(toA.allSatisfy { $0.instanceID == "a" })
        #expect(toB.map(\.routeID) == ["lan/10.0.0.2:1234"])
        #expect(toC.isEmpty)
    }
}
