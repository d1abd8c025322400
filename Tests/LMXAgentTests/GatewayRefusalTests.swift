import Foundation
import Hummingbird
import HummingbirdTesting
import LMXCore
import Logging
import NIOCore
import Testing

@testable import LMXAgent

/// The gateway's own answers, in process: what it refuses before anything is forwarded, and
/// what it says when no route can take a request.
@Suite("Gateway refusals (in process)")
struct GatewayRefusalTests {
    /// Tests the gateway's general path (Hummingbird's application).
    func test(_ fixture: AgentFixture, _ body: @Sendable (any TestClientProtocol) async throws -> Void) async throws {
        let gateway = try Gateway(
            agent: fixture.agent, configuration: GatewayConfiguration(), extraCAFile: nil, logger: Logger(label: "test")
        )
        try await Application(responder: GatewayResponder(gateway: gateway)).test(.router, body)
    }

    @Test("a foreign Origin, a cross-site fetch and an unknown path are refused before any route is looked at")
    func refusedRequests() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([AgentFixture.lan("10.9.0.2")])
            try await test(fixture) { client in
                try await client.execute(uri: "/v1/models", method: .get, headers: [.origin: "https://evil.example"]) {
                    response in
                    #expect(response.status == .forbidden)
                    #expect(String(buffer: response.body).contains("forbidden_origin"))
                }
                try await client.execute(uri: "/etc/passwd", method: .get) { response in
                    #expect(response.status == .notFound)
                }
            }
            #expect(fixture.agent.metrics.text().contains("lmx_gateway_refused_total 2"))
        }
    }

    @Test(
        "the dashboard at the root: its page and script with the strict headers, read endpoints, GET only; /v1/* still forwarded"
    )
    func dashboard() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([AgentFixture.lan("10.9.0.2")])
            try await test(fixture) { client in
                try await client.execute(uri: "/", method: .get) { response in
                    #expect(response.status == .ok)
                    #expect(response.headers[.contentType] == "text/html; charset=utf-8")
                    #expect(response.headers[.contentSecurityPolicy]?.contains("script-src 'self'") == true)
                    #expect(response.headers[.contentSecurityPolicy]?.contains("unsafe") == false)
                    #expect(String(buffer: response.body).contains("<script src=\"/dashboard/app.js\" defer></script>"))
                    #expect(!String(buffer: response.body).contains("<script>"), "no inline script")
                }
                try await client.execute(uri: "/dashboard/app.js", method: .get) { response in
                    #expect(
                        response.status == .ok && response.headers[.contentType] == "text/javascript; charset=utf-8")
                    #expect(!String(buffer: response.body).contains("innerHTML"), "server text is set as text only")
                }
                try await client.execute(uri: "/dashboard/api/status", method: .get) { response in
                    let status = try JSONDecoder().decode(StatusAPI.Status.self, from: Data(buffer: response.body))
                    #expect(status.active?.baseURL == "http://10.9.0.2:1234")
                }
                try await client.execute(uri: "/dashboard/api/traffic", method: .get) { response in
                    let traffic = try JSONDecoder().decode(StatusAPI.Traffic.self, from: Data(buffer: response.body))
                    #expect(traffic.models.isEmpty)
                }
                try await client.execute(uri: "/dashboard/api/status", method: .post) { response in
                    #expect(response.status == .methodNotAllowed)
                }
                try await client.execute(uri: "/dashboard/nothing", method: .get) { response in
                    #expect(response.status == .notFound)
                }
                try await client.execute(uri: "/", method: .get, headers: [.origin: "http://evil.example"]) {
                    response in
                    #expect(response.status == .forbidden)
                }
            }
        }
    }

    @Test("gateway listener reports applied in the order they were made, whatever order they arrive in")
    func listenerReports() async throws {
        try await AgentFixture.with { fixture in
            await fixture.agent.manager.setGatewayListener(url: "http://127.0.0.1:1235", problem: nil, generation: 2)
            // Made earlier, came later.
            await fixture.agent.manager.setGatewayListener(url: nil, problem: nil, generation: 1)
            #expect(fixture.agent.board.snapshot.gateway?.openAIBaseURL == "http://127.0.0.1:1235/v1")
            await fixture.agent.manager.setGatewayListener(url: nil, problem: "held", generation: 3)
            #expect(fixture.agent.board.snapshot.gateway?.openAIBaseURL == nil)
        }
    }

    @Test(
        "the general path forwards nothing: a request under /v1/ it is given (one llhttp read) is refused in words, 501 for a transfer coding, Anthropic's shape on /v1/messages"
    )
    func generalPathForwardsNothing() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([AgentFixture.lan("10.9.0.2")])
            try await test(fixture) { client in
                try await client.execute(uri: "/v1/models", method: .get) { response in
                    #expect(response.status == .badRequest)
                    #expect(String(buffer: response.body).contains("percent-encode"))
                }
                try await client.execute(
                    uri: "/v1/messages", method: .post, headers: [.transferEncoding: "gzip, chunked"],
                    body: ByteBuffer(string: "{}")
                ) { response in
                    #expect(response.status == .notImplemented)
                    let text = String(buffer: response.body)
                    #expect(
                        text.contains("transfer_coding_unsupported") && text.contains(#""type":"error""#), "\(text)")
                }
            }
            #expect(fixture.agent.metrics.text().contains("lmx_gateway_requests_total 0"))
        }
    }

    @Test(
        "a server that requires an inference key, reached only without one: 401 unless the client brings its own (data path)"
    )
    func keyRequired() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([AgentFixture.lan("10.9.0.2")], keyRequired: true)
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send(PipelineHarness.get())
            let answer = try pipe.received()
            #expect(answer.hasPrefix("HTTP/1.1 401 ") && answer.contains("inference_key_required"), "\(answer)")
            #expect(pipe.servers.isEmpty)
            let plan = fixture.agent.board.snapshot.gatewayPlan(limit: 3, clientHasKey: true)
            guard case .forward(let targets) = plan else {
                Issue.record("expected a route for a client with its own key")
                return
            }
            #expect(targets.map(\.baseURL) == ["http://10.9.0.2:1234"])
        }
    }

    @Test("a model only announced servers have, with a pairing set up: 404 model_not_trusted naming both")
    func untrustedModel() async throws {
        try await AgentFixture.with { fixture in
            let paired = Route(baseURL: "https://studio.example", via: .wan, source: .pairing, name: "Studio")
            fixture.publish([paired], models: ["alpha"], trust: .paired)
            var snapshot = fixture.agent.board.snapshot
            _ = snapshot.planner.upsert(AgentFixture.lan("10.9.0.7"), now: 101)
            for step in 102...105 {
                var report = ProbeReport(
                    verdict: .ready, latency: 0.001, instanceID: "stranger", ready: true, modelCount: 1)
                report.models = ["secret-model"]
                _ = snapshot.planner.record(report, for: "lan/10.9.0.7:1234", now: Double(step))
            }
            fixture.agent.board.publish(snapshot)
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send(PipelineHarness.post(#"{"model":"secret-model","messages":[]}"#))
            let answer = try pipe.received()
            #expect(answer.hasPrefix("HTTP/1.1 404 "), "\(answer)")
            #expect(answer.contains("model_not_trusted") && answer.contains("secret-model"))
            #expect(pipe.servers.isEmpty)
        }
    }
}

@Suite("The gateway's route load")
struct RouteLoadTests {
    func target(_ id: String, rank: Int, server: Int = 0) -> GatewayTarget {
        GatewayTarget(
            routeID: id, baseURL: "http://\(id)", via: .lan, credentials: Credentials(), rank: rank,
            serverInFlight: server)
    }

    @Test("among equal ranks the least busy comes first; a cooling route goes last; rank still wins")
    func order() {
        let load = RouteLoad()
        let a = target("a", rank: 1)
        let b = target("b", rank: 1)
        let c = target("c", rank: 2)
        #expect(load.order([a, b, c]).map(\.routeID) == ["a", "b", "c"])
        let token = load.started("a")
        #expect(load.order([a, b, c]).map(\.routeID) == ["b", "a", "c"])
        withExtendedLifetime(token) {}
        #expect(
            load.order([target("a", rank: 1, server: 3), b]).map(\.routeID) == ["b", "a"], "the server's own count")
        // A server's count past any real one (a hostile document) is added to the gateway's
        // own without overflow.
        let busy = load.started("a")
        #expect(
            load.order([target("a", rank: 1, server: Int.max), b]).map(\.routeID) == ["b", "a"], "Int.max in flight")
        withExtendedLifetime(busy) {}
        load.coolDown("b", seconds: 30)
        #expect(load.order([a, b, c]).map(\.routeID).last == "b")
    }

    @Test(
        "a route's count of requests in flight: the data path's request counts on one route at a time and gives it back once, however it ends; a full table lets idle counts go and says so"
    )
    func counts() {
        let load = RouteLoad()
        let a = load.count("a")
        let b = load.count("b")
        #expect(load.count("a") === a, "one count per route")
        let head = ClientHead(
            method: .GET, uri: "/v1/models", minor: 1, raw: ByteBuffer(), fields: [], known: 0, keepAlive: true)
        var request: ForwardedRequest? = ForwardedRequest(
            head: head, path: "/v1/models", declaredLength: 0, mayConcern: false,
            configuration: GatewayConfiguration(), maxBodyBytes: GatewayConfiguration().maxRequestBytes)
        request?.countOnRoute(a)
        #expect(a.current == 1 && b.current == 0)
        #expect(load.order([target("a", rank: 1), target("b", rank: 1)]).map(\.routeID) == ["b", "a"])
        // The next attempt goes to another route: counted there alone.
        request?.countOnRoute(b)
        #expect(a.current == 0 && b.current == 1)
        #expect(load.order([target("a", rank: 1), target("b", rank: 1)]).map(\.routeID) == ["a", "b"])
        request?.leaveRoute()
        #expect(b.current == 0)
        request?.countOnRoute(b)
        request?.releaseCounts()
        request?.releaseCounts()
        #expect(a.current == 0 && b.current == 0, "given back once")
        request?.countOnRoute(b)
        request = nil
        #expect(b.current == 0, "a request that goes is no longer counted")
        // Many routes counted: the idle ones go (a count kept from before is looked up again:
        // the generation changed), the busy ones stay.
        let before = load.generation
        var busy: (any AnyObject & Sendable)? = load.started("busy")
        for index in 0..<70 { _ = load.count(RouteKey("r\(index)")) }
        #expect(load.generation > before)
        #expect(load.count("a") !== a)
        #expect(load.count("busy").current == 1)
        #expect(load.order([target("busy", rank: 1), target("r1", rank: 1)]).map(\.routeID) == ["r1", "busy"])
        #expect(busy != nil)
        busy = nil
        #expect(load.count("busy").current == 0)
    }

    @Test("the read-ahead budget is shared fairly between users and given back")
    func budget() {
        let budget = ReadAheadBudget(bytes: 400)
        #expect(budget.perUser == 100)
        var first: ReadAheadBudget.Reservation? = budget.reservation(for: 1000)
        #expect(first!.take(80))
        // The same user cannot hold more than its quarter, in any number of requests.
        let second = budget.reservation(for: 1000)
        #expect(!second.take(30))
        #expect(second.take(20))
        // Another user still has room, up to the total.
        let other = budget.reservation(for: 1001)
        #expect(other.take(100))
        let third = budget.reservation(for: 1002)
        #expect(third.take(100))
        let fourth = budget.reservation(for: 1003)
        #expect(fourth.take(100))
        let fifth = budget.reservation(for: 1004)
        #expect(!fifth.take(1), "the total is spent")
        first = nil
        #expect(budget.available == 80)
        #expect(fifth.take(80))
        withExtendedLifetime((second, other, third, fourth, fifth)) {}
    }
}
