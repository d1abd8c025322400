import Foundation
import LMXCore
import Logging
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import LMXAgent

/// A gateway client connection's whole pipeline in process: the front and the data path's
/// handler on an `EmbeddedChannel`, its servers `EmbeddedChannel`s behind ``HTTP1Upstream``s
/// on the same loop (the pool's connector), time moved by hand. Bytes in, bytes out, no socket.
final class PipelineHarness {
    let loop = EmbeddedEventLoop()
    let client: EmbeddedChannel
    let handler: GatewayConnectionHandler
    let state: GatewayDataPath.LoopState
    let gateway: Gateway
    /// The server side of every connection the gateway opened, in order.
    private(set) var servers: [EmbeddedChannel] = []
    /// Addresses connected to, in order.
    private(set) var connected: [String] = []
    /// Connections that fail to open (by address authority).
    var refuse: Set<String> = []

    /// The general path behind the handler, when the harness has one (``init(_:configuration:uid:generalPath:)``).
    let generalPath: GeneralPathRecorder?

    init(
        _ fixture: AgentFixture, configuration: GatewayConfiguration = GatewayConfiguration(), uid: UInt32 = 1000,
        generalPath: Bool = false
    ) throws {
        let recorder = generalPath ? GeneralPathRecorder() : nil
        self.generalPath = recorder
        gateway = try Gateway(
            agent: fixture.agent, configuration: configuration, extraCAFile: nil, logger: Logger(label: "test"))
        guard let dataPath = gateway.dataPath, let tls = dataPath.state(for: dataPath.group.next())?.pool.tls else {
            throw GeneralPathNotHere()
        }
        let pool = UpstreamPool(eventLoop: loop, tls: tls)
        state = GatewayDataPath.LoopState(
            loop: loop, snapshot: fixture.agent.board.snapshot, pool: pool,
            clientTimeout: .milliseconds(Int64(configuration.clientTimeout * 1000)))
        // The test publishes the snapshots: no manager may replace them with its own.
        state.reportsUse = false
        self.dataPath = dataPath
        self.uid = uid
        (client, handler) = try Self.connect(
            dataPath: dataPath, state: state, limiter: limiter, loop: loop, uid: uid, generalPath: recorder)
        pool.connector = { [unowned self] address, _ in
            self.connected.append(address.authority)
            if self.refuse.contains(address.authority) {
                return self.loop.makeFailedFuture(ChannelError.connectTimeout(.seconds(1)))
            }
            let server = EmbeddedChannel(handler: HTTP1Upstream(), loop: self.loop)
            self.servers.append(server)
            return server.connect(to: try! SocketAddress(ipAddress: "127.0.0.1", port: 1)).map { server }
        }
    }

    struct GeneralPathNotHere: Error {}

    /// The client connection's front (the data path's reader).
    var front: ClientFront { handler.front! }

    /// The general path's place in the pipeline: records the request parts llhttp passes on, and
    /// answers the oldest request when told (``answerNext(_:)``).
    final class GeneralPathRecorder: ChannelInboundHandler, RemovableChannelHandler {
        typealias InboundIn = HTTPServerRequestPart
        typealias OutboundOut = HTTPServerResponsePart
        private var context: ChannelHandlerContext?
        /// The targets of the requests whose heads arrived, in order.
        private(set) var heads: [String] = []
        /// The requests whose `.end` arrived.
        private(set) var ends = 0
        private(set) var answered = 0

        func handlerAdded(context: ChannelHandlerContext) { self.context = context }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            switch unwrapInboundIn(data) {
            case .head(let head): heads.append(head.uri)
            case .body: break
            case .end: ends += 1
            }
        }

        /// Answers the oldest request not yet answered with `body`.
        func answerNext(_ body: String) {
            guard let context, answered < heads.count else { return }
            answered += 1
            var head = HTTPResponseHead(version: .http1_1, status: .ok)
            head.headers.add(name: "Content-Length", value: "\(body.utf8.count)")
            context.write(wrapOutboundOut(.head(head)), promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: body)))), promise: nil)
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        }
    }

    private let dataPath: GatewayDataPath
    private let limiter = ConnectionLimiter(perUser: 16)
    /// The clients' user, as the kernel would name it.
    private let uid: UInt32
    /// Other clients' connections to the same loop (``addClient()``).
    private(set) var others: [EmbeddedChannel] = []

    /// A client connection of the loop: the front and the handler on an `EmbeddedChannel`.
    private static func connect(
        dataPath: GatewayDataPath, state: GatewayDataPath.LoopState, limiter: ConnectionLimiter,
        loop: EmbeddedEventLoop, uid: UInt32, generalPath: GeneralPathRecorder? = nil
    ) throws -> (EmbeddedChannel, GatewayConnectionHandler) {
        guard let admission = limiter.admitUnnamed(asking: { uid }) else { throw GeneralPathNotHere() }
        let front = ClientFront()
        let handler = GatewayConnectionHandler(
            dataPath: dataPath, state: state, peer: PeerUser(limiter: limiter, admission: admission), overTCP: false,
            startGeneralPath: { channel in
                // SwiftNIO's HTTP/1 handlers where the daemon puts them, and a recorder in place
                // of Hummingbird's.
                guard let generalPath else { throw GeneralPathNotHere() }
                let sync = channel.pipeline.syncOperations
                try sync.configureHTTPServerPipeline(
                    position: .after(front), withPipeliningAssistance: false, withErrorHandling: false,
                    withOutboundHeaderValidation: false)
                try sync.addHandler(generalPath)
            })
        front.handler = handler
        handler.front = front
        let client = EmbeddedChannel(loop: loop)
        try client.pipeline.syncOperations.addHandler(front)
        try client.pipeline.syncOperations.addHandler(handler)
        try client.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 9)).wait()
        return (client, handler)
    }

    /// Another client connection to the same loop (its index in ``others``).
    func addClient() throws -> Int {
        others.append(try Self.connect(dataPath: dataPath, state: state, limiter: limiter, loop: loop, uid: uid).0)
        return others.count - 1
    }

    /// Another client sends `text`.
    func send(_ text: String, from other: Int) throws {
        try others[other].writeInbound(ByteBuffer(string: text))
        loop.run()
    }

    /// All another client has been sent since last asked.
    func received(by other: Int) throws -> String {
        loop.run()
        var text = ""
        while let buffer = try others[other].readOutbound(as: ByteBuffer.self) { text += String(buffer: buffer) }
        return text
    }

    /// The client sends `text`.
    func send(_ text: String) throws {
        try client.writeInbound(ByteBuffer(string: text))
        loop.run()
    }

    /// All the client has been sent since last asked.
    func received() throws -> String {
        loop.run()
        var text = ""
        while let buffer = try client.readOutbound(as: ByteBuffer.self) { text += String(buffer: buffer) }
        return text
    }

    /// All server `index` has been sent since last asked.
    func serverGot(_ index: Int) throws -> String {
        loop.run()
        guard index < servers.count else { return "" }
        var text = ""
        while let buffer = try servers[index].readOutbound(as: ByteBuffer.self) { text += String(buffer: buffer) }
        return text
    }

    /// Server `index` answers `text`.
    func answer(_ index: Int, _ text: String) throws {
        try servers[index].writeInbound(ByteBuffer(string: text))
        loop.run()
    }

    /// Server `index` closes its connection.
    func serverCloses(_ index: Int) {
        servers[index].pipeline.fireChannelInactive()
        try? servers[index].close().wait()
        loop.run()
    }

    func finish() {
        _ = try? client.finish()
        for other in others { _ = try? other.finish() }
        for server in servers { _ = try? server.finish() }
    }

    static func ok(_ body: String = "{}", headers: String = "") -> String {
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\(headers)Content-Length: \(body.utf8.count)\r\n\r\n\(body)"
    }

    static func get(_ path: String = "/v1/models") -> String { "GET \(path) HTTP/1.1\r\nHost: localhost\r\n\r\n" }

    static func post(_ body: String, path: String = "/v1/chat/completions") -> String {
        "POST \(path) HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
    }
}

@Suite("The gateway connection's pipeline in process (EmbeddedChannel, manual time)")
struct ConnectionPipelineTests {
    static let server = AgentFixture.lan("10.9.0.2")
    static let other = AgentFixture.lan("10.9.0.3")

    @Test("a request goes to the route and its answer back, the server's connection kept for the next request")
    func forwardsAndKeeps() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send(PipelineHarness.get())
            let sent = try pipe.serverGot(0)
            #expect(sent.hasPrefix("GET /v1/models HTTP/1.1\r\nHost: 10.9.0.2:1234\r\n"), "\(sent)")
            try pipe.answer(0, PipelineHarness.ok(#"{"data":[]}"#))
            let answer = try pipe.received()
            #expect(answer.hasPrefix("HTTP/1.1 200 OK\r\n"), "\(answer)")
            #expect(answer.contains("X-LMX-Via: lan\r\n") && answer.hasSuffix(#"{"data":[]}"#))
            try pipe.send(PipelineHarness.get())
            #expect(try pipe.serverGot(0).hasPrefix("GET /v1/models"))
            #expect(pipe.servers.count == 1)  // the kept connection
            try pipe.answer(0, PipelineHarness.ok())
            #expect(try pipe.received().hasPrefix("HTTP/1.1 200 OK"))
            #expect(pipe.client.isActive)
        }
    }

    @Test("each path carries its own key: the inference key on /v1/ alone, the admin key on /admin/ alone")
    func keysByPath() async throws {
        try await AgentFixture.with { fixture in
            let keyed = Route(
                baseURL: "http://10.9.0.2:1234", via: .lan, source: .manual, name: "keyed",
                credentials: Credentials(adminKey: "admin-secret", inferenceKey: "inference-secret"))
            fixture.publish([keyed])
            var configuration = GatewayConfiguration()
            configuration.admin = true
            let pipe = try PipelineHarness(fixture, configuration: configuration)
            defer { pipe.finish() }
            for (path, admin, inference) in [
                ("/v1/models", false, true), ("/admin/models", true, false), ("/V1/models", false, false),
                ("/ADMIN/models", false, false), ("/v1x/models", false, false),
            ] {
                try pipe.send(PipelineHarness.get(path))
                let sent = try pipe.serverGot(pipe.servers.count - 1)
                guard sent.hasPrefix("GET \(path) ") else {
                    // Refused by the gateway itself (not a path it forwards): no key went anywhere.
                    #expect(!sent.contains("secret"), "\(path): \(sent)")
                    _ = try pipe.received()
                    continue
                }
                #expect(sent.contains("X-Admin-Key: admin-secret\r\n") == admin, "\(path): \(sent)")
                #expect(sent.contains("Authorization: Bearer inference-secret\r\n") == inference, "\(path): \(sent)")
                try pipe.answer(pipe.servers.count - 1, PipelineHarness.ok())
                #expect(try pipe.received().hasPrefix("HTTP/1.1 200 OK"))
            }
        }
    }

    @Test("pipelined requests: the second goes only once the first is answered; answers in order")
    func pipelining() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send(
                PipelineHarness.post(#"{"model":"alpha","n":1}"#) + PipelineHarness.post(#"{"model":"alpha","n":2}"#))
            #expect(try pipe.serverGot(0).hasSuffix(#""n":1}"#))
            #expect(pipe.servers.count == 1)  // the second waits: not sent on a connection of its own
            #expect(try pipe.received() == "")
            try pipe.answer(0, PipelineHarness.ok(#"{"first":1}"#))
            #expect(try pipe.received().hasSuffix(#"{"first":1}"#))
            #expect(try pipe.serverGot(0).hasSuffix(#""n":2}"#))
            try pipe.answer(0, PipelineHarness.ok(#"{"second":2}"#))
            #expect(try pipe.received().hasSuffix(#"{"second":2}"#))
        }
    }

    @Test("an answer that comes before the client's upload ends is held until the upload is done")
    func answerHeldUntilUploadDone() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            var configuration = GatewayConfiguration()
            configuration.readAheadBytes = 16
            let pipe = try PipelineHarness(fixture, configuration: configuration)
            defer { pipe.finish() }
            let body = #"{"model":"alpha","input":""# + String(repeating: "x", count: 200) + #""}"#
            let request = PipelineHarness.post(body, path: "/v1/embeddings")
            let half = request.utf8.count - 100
            try pipe.send(String(request.prefix(half)))
            #expect(try pipe.serverGot(0).hasPrefix("POST /v1/embeddings"))  // past the read-ahead: sent on
            try pipe.answer(0, PipelineHarness.ok(#"{"early":true}"#))
            #expect(try pipe.received() == "")  // held: the client is still writing
            // The server answered without the rest of the body: its connection is closed (never
            // pooled with a request half read), the rest of the body read and dropped.
            #expect(!pipe.servers[0].isActive)
            try pipe.send(String(request.dropFirst(half)))
            #expect(try pipe.received().hasSuffix(#"{"early":true}"#))
            #expect(pipe.client.isActive)
        }
    }

    @Test(
        "a kept connection closed as a request comes: a GET goes again on a new connection; a POST whose body was passed on is answered 502, never sent without its body"
    )
    func keptConnectionClosed() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            var configuration = GatewayConfiguration()
            configuration.readAheadBytes = 16
            let pipe = try PipelineHarness(fixture, configuration: configuration)
            defer { pipe.finish() }
            try pipe.send(PipelineHarness.get())
            try pipe.answer(0, PipelineHarness.ok())
            _ = try pipe.received()
            _ = try pipe.serverGot(0)
            try pipe.send(PipelineHarness.get())
            #expect(try pipe.serverGot(0).hasPrefix("GET"))
            pipe.serverCloses(0)
            #expect(pipe.servers.count == 2)
            #expect(try pipe.serverGot(1).hasPrefix("GET /v1/models"))
            try pipe.answer(1, PipelineHarness.ok(#"{"again":1}"#))
            #expect(try pipe.received().hasSuffix(#"{"again":1}"#))
            // A PUT whose body went on as it came (past the read-ahead), on the kept connection.
            let body = String(repeating: "y", count: 64)
            let put = "PUT /v1/files/a HTTP/1.1\r\nHost: localhost\r\nContent-Length: 64\r\n\r\n"
            try pipe.send(put + body.prefix(32))
            #expect(try pipe.serverGot(1).hasPrefix("PUT /v1/files/a"))
            pipe.serverCloses(1)
            #expect(pipe.servers.count == 2)  // not sent again
            let answer = try pipe.received()
            #expect(answer.hasPrefix("HTTP/1.1 502 "), "\(answer)")
            #expect(answer.contains("upstream_unreachable"))
        }
    }

    @Test("a stream cut mid-answer ends with an error event and the chunked end, not a hang")
    func cutStream() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send(PipelineHarness.post(#"{"model":"alpha","stream":true}"#))
            _ = try pipe.serverGot(0)
            let event = "data: {\"n\":1}\n\n"
            try pipe.answer(
                0,
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                    + String(event.utf8.count, radix: 16) + "\r\n" + event + "\r\n")
            let first = try pipe.received()
            #expect(first.contains("Transfer-Encoding: chunked") && first.contains(#"data: {"n":1}"#))
            pipe.serverCloses(0)
            let rest = try pipe.received()
            #expect(rest.contains("event: error") || rest.contains("\"error\""), "\(rest)")
            #expect(rest.hasSuffix("0\r\n\r\n"), "\(rest)")
        }
    }

    static let runEventsHead =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

    static func chunk(_ text: String) -> String { String(text.utf8.count, radix: 16) + "\r\n" + text + "\r\n" }

    static func snapshot(_ steps: Int, done: Bool = false) -> String {
        let kind = done ? "run.completed" : "run.update"
        return "event: \(kind)\ndata: {\"type\":\"\(kind)\",\"run\":{\"id\":\"run-1\",\"steps\":\(steps)}}\n\n"
    }

    @Test(
        "a run's event stream cut mid-answer goes on by its server's other route: no second head, the snapshot the client has dropped, no error event, then its end"
    )
    func runStreamGoesOn() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server, Self.other], oneServer: true)
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send(PipelineHarness.get("/v1/agents/runs/run-1/events"))
            #expect(try pipe.serverGot(0).hasPrefix("GET /v1/agents/runs/run-1/events HTTP/1.1"))
            try pipe.answer(
                0, Self.runEventsHead + Self.chunk(Self.snapshot(1)) + Self.chunk(": keep-alive\n\n" + Self.snapshot(2))
            )
            let first = try pipe.received()
            #expect(first.hasPrefix("HTTP/1.1 200 ") && first.contains(#""steps":2"#), "\(first)")
            pipe.serverCloses(0)
            #expect(pipe.servers.count == 2, "opened again")
            #expect(try pipe.serverGot(1).hasPrefix("GET /v1/agents/runs/run-1/events HTTP/1.1"))
            try pipe.answer(
                1,
                Self.runEventsHead + Self.chunk(Self.snapshot(2)) + Self.chunk(Self.snapshot(3))
                    + Self.chunk(Self.snapshot(4, done: true) + "data: [DONE]\n\n") + "0\r\n\r\n")
            let rest = try pipe.received()
            #expect(!rest.contains("HTTP/1.1"), "no second head: \(rest)")
            #expect(!rest.contains(#""steps":2"#), "the snapshot the client has, not again: \(rest)")
            #expect(rest.contains(#""steps":3"#) && rest.contains("run.completed") && rest.contains("[DONE]"))
            #expect(!rest.contains("event: error"))
            #expect(rest.hasSuffix("0\r\n\r\n"))
            #expect(pipe.client.isActive)
            #expect(fixture.agent.metrics.text().contains("lmx_gateway_streams_resumed_total 1"))
            // The connection takes the next request (to the server's best route again).
            try pipe.send(PipelineHarness.get())
            #expect(pipe.servers.count == 3)
            #expect(try pipe.serverGot(2).hasPrefix("GET /v1/models"))
        }
    }

    @Test(
        "the agent's state changes under streams: a run's stream moves to its server's better route; a chat stream whose route is gone ends at once with the stream-lost event; one that stays, stays"
    )
    func streamsFollowTheAgent() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server, Self.other], oneServer: true)
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send(PipelineHarness.get("/v1/agents/runs/run-1/events"))
            _ = try pipe.serverGot(0)
            try pipe.answer(0, Self.runEventsHead + Self.chunk(Self.snapshot(1)))
            _ = try pipe.received()
            // The same state again: nothing moves.
            pipe.state.snapshotChanged()
            #expect(pipe.servers.count == 1)
            // The other route is the better one now (as the LAN after coming home).
            fixture.publish([Self.other, Self.server], oneServer: true)
            pipe.state.snapshot = fixture.agent.board.snapshot
            pipe.state.snapshotChanged()
            pipe.loop.run()
            #expect(pipe.servers.count == 2 && !pipe.servers[0].isActive, "moved, the old connection closed")
            #expect(try pipe.serverGot(1).hasPrefix("GET /v1/agents/runs/run-1/events"))
            try pipe.answer(1, Self.runEventsHead + Self.chunk(Self.snapshot(1)) + Self.chunk(Self.snapshot(2)))
            let moved = try pipe.received()
            #expect(!moved.contains(#""steps":1"#) && moved.contains(#""steps":2"#), "\(moved)")

            // A chat completion's stream on a route the agent no longer has: ended at once.
            let chat = try PipelineHarness(fixture)
            defer { chat.finish() }
            try chat.send(PipelineHarness.post(#"{"model":"alpha","stream":true}"#))
            _ = try chat.serverGot(0)
            try chat.answer(0, Self.runEventsHead + Self.chunk("data: {\"n\":1}\n\n"))
            _ = try chat.received()
            fixture.publish([Self.server], oneServer: true)  // 10.9.0.3 gone
            chat.state.snapshot = fixture.agent.board.snapshot
            chat.state.snapshotChanged()
            let lost = try chat.received()
            #expect(lost.contains("event: error") && lost.hasSuffix("0\r\n\r\n"), "\(lost)")
        }
    }

    @Test("a body that stops coming: 408 after the client timeout (the sweep run by hand), connection closed")
    func stalledBody() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{\"mo")
            pipe.client.read()
            pipe.handler.sweepDue()
            #expect(try pipe.received() == "")
            pipe.handler.sweepDue()
            let answer = try pipe.received()
            #expect(answer.hasPrefix("HTTP/1.1 408 "), "\(answer)")
            #expect(answer.contains("request_timeout"))
            #expect(!pipe.client.isActive)
        }
    }

    @Test("the daemon stops: an idle connection closes at once; one with an answer in progress closes when it ends")
    func gracefulShutdown() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send(PipelineHarness.get())
            _ = try pipe.serverGot(0)
            pipe.client.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
            pipe.loop.run()
            #expect(pipe.client.isActive)
            try pipe.answer(0, PipelineHarness.ok(#"{"last":1}"#))
            #expect(try pipe.received().hasSuffix(#"{"last":1}"#))
            #expect(!pipe.client.isActive)

            let idle = try PipelineHarness(fixture)
            defer { idle.finish() }
            idle.client.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
            idle.loop.run()
            #expect(!idle.client.isActive)
        }
    }

    @Test("no usable route within the hold: 503 no_endpoint with Retry-After, in the OpenAI error shape")
    func noEndpoint() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([])
            var configuration = GatewayConfiguration()
            configuration.holdSeconds = 0
            let pipe = try PipelineHarness(fixture, configuration: configuration)
            defer { pipe.finish() }
            try pipe.send(PipelineHarness.get())
            let answer = try pipe.received()
            #expect(answer.hasPrefix("HTTP/1.1 503 "), "\(answer)")
            #expect(answer.contains("Retry-After: 2\r\n") && answer.contains(#""code":"no_endpoint""#))
            #expect(pipe.servers.isEmpty)
            // On the Anthropic API's path, in Anthropic's shape (its SDKs read that one).
            try pipe.send(PipelineHarness.post(#"{"model":"alpha"}"#, path: "/v1/messages"))
            let anthropic = try pipe.received()
            #expect(anthropic.hasPrefix("HTTP/1.1 503 "), "\(anthropic)")
            #expect(
                anthropic.contains(#""type":"error""#) && anthropic.contains(#""type":"overloaded_error""#),
                "\(anthropic)")
        }
    }

    @Test("a body naming the model twice is refused 400 before anything is sent")
    func ambiguousBody() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send(PipelineHarness.post(#"{"model":"alpha","model":"beta"}"#))
            let answer = try pipe.received()
            #expect(answer.hasPrefix("HTTP/1.1 400 "), "\(answer)")
            #expect(answer.contains("ambiguous_body"))
            #expect(pipe.servers.isEmpty)
        }
    }

    @Test("a route that cannot be connected to: the request goes to the next route at once")
    func nextRoute() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server, Self.other])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            pipe.refuse = ["10.9.0.2:1234"]
            try pipe.send(PipelineHarness.post(#"{"model":"alpha"}"#))
            #expect(pipe.connected == ["10.9.0.2:1234", "10.9.0.3:1234"])
            #expect(try pipe.serverGot(0).contains("Host: 10.9.0.3:1234"))
            try pipe.answer(0, PipelineHarness.ok(#"{"from":3}"#))
            #expect(try pipe.received().hasSuffix(#"{"from":3}"#))
        }
    }

    @Test("a busy server (429) hands the request to another with the model, on the data path; its answer is not seen")
    func busyHandOver() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server, Self.other])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send(PipelineHarness.post(#"{"model":"alpha","n":7}"#))
            #expect(try pipe.serverGot(0).hasSuffix(#""n":7}"#))
            try pipe.answer(0, "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 2\r\nContent-Length: 2\r\n\r\n{}")
            #expect(pipe.connected == ["10.9.0.2:1234", "10.9.0.3:1234"])
            #expect(!pipe.servers[0].isActive)  // mid-answer: never reused
            let second = try pipe.serverGot(1)
            #expect(second.contains("Host: 10.9.0.3:1234") && second.hasSuffix(#""n":7}"#))
            try pipe.answer(1, PipelineHarness.ok(#"{"from":3}"#))
            let answer = try pipe.received()
            #expect(answer.hasPrefix("HTTP/1.1 200 OK") && answer.hasSuffix(#"{"from":3}"#), "\(answer)")
        }
    }

    @Test(
        "a run made on one server is asked of that server only: its id read from the answer as it passes, per user, on the data path"
    )
    func affinity() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server, Self.other])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            // The first route refuses the connection: the run is made on the second.
            pipe.refuse = ["10.9.0.2:1234"]
            try pipe.send(PipelineHarness.post(#"{"agent":"helper","input":"hi"}"#, path: "/v1/agents/runs"))
            #expect(try pipe.serverGot(0).contains("Host: 10.9.0.3:1234"))
            try pipe.answer(0, PipelineHarness.ok(#"{"id":"run_9","status":"queued"}"#))
            #expect(try pipe.received().hasSuffix(#""queued"}"#))
            #expect(pipe.gateway.affinity.owner(of: .agentRun("run_9"), user: 1000) == "instance-1")
            #expect(pipe.gateway.affinity.owner(of: .agentRun("run_9"), user: 1001) == nil)
            // Both routes usable again: the run's events come from its server, not the first route.
            pipe.refuse = []
            try pipe.send(PipelineHarness.get("/v1/agents/runs/run_9/events"))
            #expect(try pipe.serverGot(0).hasPrefix("GET /v1/agents/runs/run_9/events HTTP/1.1\r\nHost: 10.9.0.3:1234"))
            #expect(pipe.connected == ["10.9.0.2:1234", "10.9.0.3:1234"])
            try pipe.answer(0, PipelineHarness.ok(#"{"events":[]}"#))
            // Another request goes to the first route as before.
            try pipe.send(PipelineHarness.post(#"{"model":"alpha"}"#))
            #expect(pipe.connected.last == "10.9.0.2:1234")
        }
    }

    @Test(
        "one cap on connections to a route: past it a request waits for one to come free (then goes on it), or 503 after the hold"
    )
    func connectionCap() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            var configuration = GatewayConfiguration()
            configuration.maxConnectionsPerRoute = 1
            configuration.holdSeconds = 0.05
            let pipe = try PipelineHarness(fixture, configuration: configuration)
            defer { pipe.finish() }
            let second = try pipe.addClient()
            try pipe.send(PipelineHarness.get())
            #expect(try pipe.serverGot(0).hasPrefix("GET /v1/models"))
            try pipe.send(PipelineHarness.post(#"{"model":"alpha","n":2}"#), from: second)
            #expect(pipe.connected.count == 1, "no second connection past the cap")
            try pipe.answer(0, PipelineHarness.ok(#"{"first":1}"#))
            #expect(try pipe.received().hasSuffix(#"{"first":1}"#))
            // The connection came back: the waiting request goes on it.
            #expect(try pipe.serverGot(0).hasSuffix(#""n":2}"#))
            #expect(pipe.connected.count == 1)
            try pipe.answer(0, PipelineHarness.ok(#"{"second":2}"#))
            #expect(try pipe.received(by: second).hasSuffix(#"{"second":2}"#))

            // Busy for longer than the hold: 503 connections_full.
            try pipe.send(PipelineHarness.get())
            let third = try pipe.addClient()
            try pipe.send(PipelineHarness.get(), from: third)
            try await Task.sleep(for: .milliseconds(80))
            pipe.loop.advanceTime(to: .now() + .seconds(1))  // (the loop's timers, on the monotonic clock)
            let refused = try pipe.received(by: third)
            #expect(refused.hasPrefix("HTTP/1.1 503 ") && refused.contains("connections_full"), "\(refused)")
        }
    }

    @Test("an expectation other than 100-continue: 417, nothing sent; 100-continue answered at once")
    func expectations() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\nContent-Length: 17\r\n\r\n"
            )
            #expect(try pipe.received() == "HTTP/1.1 100 Continue\r\n\r\n")
            try pipe.send(#"{"model":"alpha"}"#)
            #expect(!(try pipe.serverGot(0).lowercased().contains("expect")))
            try pipe.answer(0, PipelineHarness.ok())
            #expect(try pipe.received().hasPrefix("HTTP/1.1 200 OK"))
            let other = try pipe.addClient()
            try pipe.send(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nExpect: something-else\r\nContent-Length: 17\r\n\r\n",
                from: other)
            let answer = try pipe.received(by: other)
            #expect(answer.hasPrefix("HTTP/1.1 417 ") && answer.contains("expectation_failed"), "\(answer)")
            #expect(pipe.servers.count == 1)
        }
    }

    @Test(
        "a chunked upload on the data path: read ahead whole it goes with its length; longer, it goes on chunked as it comes; a broken framing is 400"
    )
    func chunkedUploads() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            var configuration = GatewayConfiguration()
            configuration.readAheadBytes = 64
            let pipe = try PipelineHarness(fixture, configuration: configuration)
            defer { pipe.finish() }
            let head = "POST /v1/embeddings HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
            try pipe.send(head + "9\r\n{\"model\":\r\nA\r\n\"alpha\"}  \r\n0\r\n\r\n")
            let whole = try pipe.serverGot(0)
            let said = try pipe.received()
            try #require(pipe.servers.count == 1, "\(said) active \(pipe.client.isActive)")
            #expect(whole.contains("Content-Length: 19\r\n") && !whole.lowercased().contains("transfer-encoding"))
            #expect(whole.hasSuffix(#"{"model":"alpha"}  "#), "\(whole)")
            try pipe.answer(0, PipelineHarness.ok())
            #expect(try pipe.received().hasPrefix("HTTP/1.1 200 OK"))
            // Past the read-ahead: on as it comes, chunked again for the server.
            let big = String(repeating: "z", count: 100)
            try pipe.send(head + "64\r\n" + big + "\r\n")
            let streamed = try pipe.serverGot(0)
            #expect(streamed.contains("Transfer-Encoding: chunked\r\n") && streamed.contains(big), "\(streamed)")
            try pipe.send("0\r\n\r\n")
            #expect(try pipe.serverGot(0).hasSuffix("0\r\n\r\n"))
            try pipe.answer(0, PipelineHarness.ok(#"{"n":2}"#))
            #expect(try pipe.received().hasSuffix(#"{"n":2}"#))
            // A chunk extension: refused before anything goes.
            let other = try pipe.addClient()
            try pipe.send(head + "3;x=y\r\nabc\r\n0\r\n\r\n", from: other)
            let refused = try pipe.received(by: other)
            #expect(refused.hasPrefix("HTTP/1.1 400 ") && refused.contains("malformed_body"), "\(refused)")
        }
    }

    @Test(
        "refusals answered on the data path in the policy's words: the body read and dropped, the connection kept; one too large, or a head with two Hosts, answered at once and closed"
    )
    func refusals() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            var configuration = GatewayConfiguration()
            configuration.maxRequestBytes = 1000
            let pipe = try PipelineHarness(fixture, configuration: configuration)
            defer { pipe.finish() }
            let refused = [
                ("GET /v1/models HTTP/1.1\r\nOrigin: https://evil.example\r\n\r\n", 403, "forbidden_origin"),
                (
                    "POST /v1/chat/completions HTTP/1.1\r\nOrigin: https://evil.example\r\nContent-Length: 5\r\n\r\nhello",
                    403, "forbidden_origin"
                ),
                ("GET /v1/../admin/x HTTP/1.1\r\n\r\n", 400, "bad_path"),
                ("GET /v1/chat/stream HTTP/1.1\r\n\r\n", 403, "websocket_refused"),
                // (TRACE and upgrades are heads llhttp reads: the general path refuses them.)
            ]
            for (request, status, code) in refused {
                try pipe.send(request)
                let answer = try pipe.received()
                #expect(answer.hasPrefix("HTTP/1.1 \(status) ") && answer.contains(code), "\(answer)")
                #expect(pipe.client.isActive, "kept after \(code)")
            }
            // Two Host lines (RFC 9112 §3.2), whichever comes first, on any path: a bad request,
            // answered at once, and its connection closes (a request behind it is not read). So
            // does a refusal before a body the client holds back (`Expect`), even when the body
            // and another request come anyway.
            for (request, status, code) in [
                ("GET /v1/models HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n", 400, "bad_request"),
                (
                    "GET /dashboard/api/status HTTP/1.1\r\nHost: localhost\r\nhost: localhost\r\n\r\n", 400,
                    "bad_request"
                ),
                (
                    "POST /v1/chat/completions HTTP/1.1\r\nOrigin: https://evil.example\r\nExpect: 100-continue\r\n"
                        + "Content-Length: 5\r\n\r\nhello", 403, "forbidden_origin"
                ),
            ] {
                let other = try pipe.addClient()
                try pipe.send(request + PipelineHarness.get(), from: other)
                let answer = try pipe.received(by: other)
                #expect(answer.hasPrefix("HTTP/1.1 \(status) ") && answer.contains(code), "\(answer)")
                #expect(answer.lowercased().contains("\r\nconnection: close\r\n"), "\(answer)")
                #expect(answer.components(separatedBy: "HTTP/1.1 ").count == 2, "one answer: \(answer)")
                #expect(!pipe.others[other].isActive, "closed after \(request)")
            }
            #expect(pipe.servers.isEmpty)
            try pipe.send(PipelineHarness.get())
            try pipe.answer(0, PipelineHarness.ok())
            #expect(try pipe.received().hasPrefix("HTTP/1.1 200 OK"))
            try pipe.send("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 5000\r\n\r\nxx")
            let tooLarge = try pipe.received()
            #expect(tooLarge.hasPrefix("HTTP/1.1 413 ") && tooLarge.contains("request_too_large"), "\(tooLarge)")
            #expect(!pipe.client.isActive)
        }
    }

    @Test(
        "a run is created once: the gateway adds an Idempotency-Key (or keeps the client's), and when the connection dies before the answer sends the same request, same key, again on a new connection"
    )
    func runCreatedOnce() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            let body = #"{"agent":"research","input":"x"}"#
            try pipe.send(PipelineHarness.post(body, path: "/v1/agents/runs"))
            let first = try pipe.serverGot(0)
            let keyLine = first.components(separatedBy: "\r\n").first { $0.hasPrefix("Idempotency-Key: ") }
            let key = keyLine.map { String($0.dropFirst("Idempotency-Key: ".count)) } ?? ""
            #expect(key.hasPrefix("lmx-") && key.count >= 20, "\(first)")
            // The server made the run; its answer is lost with the connection.
            pipe.serverCloses(0)
            #expect(pipe.servers.count == 2, "sent again on a new connection")
            let again = try pipe.serverGot(1)
            #expect(again.contains("Idempotency-Key: \(key)\r\n") && again.hasSuffix(body), "\(again)")
            try pipe.answer(1, PipelineHarness.ok(#"{"id":"run-1","status":"queued"}"#))
            #expect(try pipe.received().hasSuffix(#"{"id":"run-1","status":"queued"}"#))

            // The client's own key is kept, never replaced.
            try pipe.send(
                "POST /v1/agents/runs HTTP/1.1\r\nIdempotency-Key: mine-42\r\nContent-Length: \(body.utf8.count)\r\n\r\n"
                    + body)
            let own = try pipe.serverGot(1)
            #expect(
                own.contains("Idempotency-Key: mine-42\r\n") && !own.contains("Idempotency-Key: lmx-"), "\(own)")
            try pipe.answer(1, PipelineHarness.ok(#"{"id":"run-2"}"#))
            _ = try pipe.received()

            // Any other POST still goes once.
            try pipe.send(PipelineHarness.post(#"{"model":"alpha"}"#))
            #expect(!(try pipe.serverGot(1)).contains("Idempotency-Key"))
            pipe.serverCloses(1)
            #expect(pipe.servers.count == 2)
            #expect(try pipe.received().hasPrefix("HTTP/1.1 502 "))
        }
    }

    @Test(
        "gateway.group on the data path: a user not yet looked up waits (reads held) while the lookup runs off the loop, then is refused 403 with the body dropped and the connection kept, its pipelined request after it answered too; a member or root forwarded"
    )
    func groupGate() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            var configuration = GatewayConfiguration()
            configuration.group = "root"
            configuration.listen = nil
            let outsider = try PipelineHarness(fixture, configuration: configuration, uid: 4242)
            defer { outsider.finish() }
            // The lookup, answered by hand.
            var asked: [UInt32] = []
            let answer = outsider.loop.makePromise(of: Bool?.self)
            outsider.state.groupLookup = { _, uid in
                asked.append(uid)
                return answer.futureResult
            }
            let body = #"{"model": "test/model", "messages": []}"#
            try outsider.send(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
                    + PipelineHarness.get())
            #expect(asked == [4242])
            #expect(
                try outsider.received().isEmpty && outsider.servers.isEmpty, "nothing answered while it is looked up")
            answer.succeed(false)
            let both = try outsider.received()
            #expect(both.components(separatedBy: "HTTP/1.1 403 ").count == 3, "\(both)")
            #expect(both.contains("only members of the group root"))
            #expect(outsider.client.isActive && outsider.servers.isEmpty)
            #expect(asked == [4242, 4242], "the second request looks up again: the gate keeps no answer here")
            let known = try PipelineHarness(fixture, configuration: configuration, uid: 4242)
            defer { known.finish() }
            #expect(known.gateway.groupGate?.allows(4242) == false)
            try known.send(PipelineHarness.get())
            let refused = try known.received()
            #expect(refused.hasPrefix("HTTP/1.1 403 ") && refused.contains("only members of the group root"))
            #expect(known.servers.isEmpty)
            let root = try PipelineHarness(fixture, configuration: configuration, uid: 0)
            defer { root.finish() }
            try root.send(PipelineHarness.get())
            #expect(try root.serverGot(0).hasPrefix("GET /v1/models"))
        }
    }
}
