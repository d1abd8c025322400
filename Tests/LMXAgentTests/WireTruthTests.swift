import LMXCore
import NIOCore
import NIOEmbedded
import NIOSSL
import Testing

@testable import LMXAgent

/// What reaches the wire, case by case (issue 63's reproductions), in the whole pipeline in
/// process (``PipelineHarness``): the bytes the client gets, the bytes the server gets, and the
/// bytes the connection holds.
@Suite("The gateway's wire behaviour in process: framing kept, foreign answers recognised, bytes held bounded")
struct WireTruthTests {
    static let server = AgentFixture.lan("10.9.0.2")
    static let other = AgentFixture.lan("10.9.0.3")
    static let streamHead =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    static func chunk(_ text: String) -> String { String(text.utf8.count, radix: 16) + "\r\n" + text + "\r\n" }

    @Test(
        "a stream whose last event has no final newline, then ends cleanly, arrives whole: [DONE] kept, no error event")
    func doneWithoutFinalNewline() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send(PipelineHarness.post(#"{"model":"alpha","stream":true}"#))
            _ = try pipe.serverGot(0)
            try pipe.answer(
                0, Self.streamHead + Self.chunk("data: {\"n\":1}\n\n") + Self.chunk("data: [DONE]") + "0\r\n\r\n")
            let answer = try pipe.received()
            #expect(answer.contains("data: [DONE]\n\n"), "\(answer)")
            #expect(!answer.contains("event: error"), "\(answer)")
            #expect(answer.hasSuffix("0\r\n\r\n") && pipe.client.isActive)
        }
    }

    @Test(
        "a compressed event stream passes untouched (its coding, its bytes, nothing added); cut, the connection closes rather than write into it"
    )
    func compressedStreamUntouched() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            let body = #"{"model":"alpha","stream":true}"#
            try pipe.send(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
            )
            #expect(try pipe.serverGot(0).contains("Accept-Encoding: gzip\r\n"))
            // (Opaque bytes standing for gzip's: no event boundary the gateway could read.)
            let coded = "\u{1f}x-coded-bytes\nno-event-boundary"
            try pipe.answer(
                0,
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
                    + Self.chunk(coded) + "0\r\n\r\n")
            let answer = try pipe.received()
            #expect(answer.contains("Content-Encoding: gzip\r\n"), "\(answer)")
            #expect(answer.hasSuffix(Self.chunk(coded) + "0\r\n\r\n"), "untouched: \(answer)")
            #expect(!answer.contains("event: error"))

            try pipe.send(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
            )
            _ = try pipe.serverGot(0)
            try pipe.answer(
                0,
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
                    + Self.chunk(coded))
            _ = try pipe.received()
            pipe.serverCloses(0)
            let rest = try pipe.received()
            #expect(!rest.contains("event: error") && !rest.hasSuffix("0\r\n\r\n"), "\(rest)")
            #expect(!pipe.client.isActive, "closed short of the end, as from the server")
        }
    }

    @Test("a stream the gateway must read (a run's events) is asked of the server uncompressed")
    func identityWhereRead() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send(
                "GET /v1/agents/runs/run-1/events HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip, br\r\n\r\n")
            let sent = try pipe.serverGot(0)
            #expect(sent.contains("Accept-Encoding: identity\r\n") && !sent.contains("gzip"), "\(sent)")
        }
    }

    @Test(
        "an event stream that came with a Content-Length and is cut: the client was promised chunks, gets the error event in them, and its next answer in step"
    )
    func sizedStreamCut() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send(PipelineHarness.post(#"{"model":"alpha","stream":true}"#))
            _ = try pipe.serverGot(0)
            try pipe.answer(
                0,
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 1144\r\n\r\ndata: {\"n\":1}\n\n")
            let head = try pipe.received()
            #expect(!head.contains("Content-Length") && head.contains("Transfer-Encoding: chunked"), "\(head)")
            pipe.serverCloses(0)
            let rest = try pipe.received()
            #expect(rest.contains("event: error") && rest.hasSuffix("0\r\n\r\n"), "\(rest)")
            #expect(pipe.client.isActive)
            try pipe.send(PipelineHarness.get())
            try pipe.answer(1, PipelineHarness.ok(#"{"next":1}"#))
            let next = try pipe.received()
            #expect(next.hasPrefix("HTTP/1.1 200 OK") && next.hasSuffix(#"{"next":1}"#), "in step: \(next)")
        }
    }

    @Test("a run's stream with a Content-Length resumed by the other route: one chunked answer, the new events in it")
    func sizedStreamResumed() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server, Self.other], oneServer: true)
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send(PipelineHarness.get("/v1/agents/runs/run-1/events"))
            _ = try pipe.serverGot(0)
            let first = "event: run.update\ndata: {\"steps\":1}\n\n"
            try pipe.answer(
                0,
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 344\r\n\r\n" + first)
            let head = try pipe.received()
            #expect(!head.contains("Content-Length") && head.contains("Transfer-Encoding: chunked"), "\(head)")
            pipe.serverCloses(0)
            _ = try pipe.serverGot(1)
            let second = "event: run.completed\ndata: {\"steps\":2}\n\ndata: [DONE]\n\n"
            try pipe.answer(
                1,
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: \(second.utf8.count)\r\n\r\n"
                    + second)
            let rest = try pipe.received()
            #expect(rest == Self.chunk(second) + "0\r\n\r\n", "\(rest)")
            #expect(pipe.client.isActive)
        }
    }

    @Test("Expect: 100-continue on a refused request: the refusal at once, not a 408 a minute later")
    func expectOnRefusal() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nOrigin: https://evil.example\r\nExpect: 100-continue\r\nContent-Length: 17\r\n\r\n"
            )
            let answer = try pipe.received()
            #expect(answer.hasPrefix("HTTP/1.1 403 ") && answer.contains("forbidden_origin"), "\(answer)")
            #expect(pipe.servers.isEmpty)
        }
    }

    @Test(
        "a run's creation is repeatable only for a key the server receives: one listed in Connection is replaced by the gateway's; an empty one makes it go once"
    )
    func idempotencyKeyThatNeverArrives() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            let body = #"{"agent":"research","input":"x"}"#
            try pipe.send(
                "POST /v1/agents/runs HTTP/1.1\r\nConnection: Idempotency-Key\r\nIdempotency-Key: mine-1\r\nContent-Length: \(body.utf8.count)\r\n\r\n"
                    + body)
            let sent = try pipe.serverGot(0)
            #expect(!sent.contains("mine-1") && sent.contains("Idempotency-Key: lmx-"), "\(sent)")
            pipe.serverCloses(0)
            #expect(pipe.servers.count == 2, "sent again, with the key the server has")
            try pipe.answer(1, PipelineHarness.ok(#"{"id":"run-1"}"#))
            _ = try pipe.received()

            try pipe.send(
                "POST /v1/agents/runs HTTP/1.1\r\nIdempotency-Key: \r\nContent-Length: \(body.utf8.count)\r\n\r\n"
                    + body)
            _ = try pipe.serverGot(1)
            pipe.serverCloses(1)
            #expect(pipe.servers.count == 2, "not sent again: the server had no key to honour")
            #expect(try pipe.received().hasPrefix("HTTP/1.1 502 "))
        }
    }

    @Test("a body sent a byte at a time is held as one buffer: the budget counts its storage, at most twice its bytes")
    func readAheadHeldOnce() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([])
            var configuration = GatewayConfiguration()
            configuration.holdSeconds = 60
            let pipe = try PipelineHarness(fixture, configuration: configuration)
            defer { pipe.finish() }
            let before = pipe.gateway.readAhead.available
            let size = 16_000
            try pipe.send(
                "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: \(size + 2)\r\n\r\n{")
            for _ in 0..<size { try pipe.client.writeInbound(ByteBuffer(string: " ")) }
            try pipe.send("}")
            pipe.loop.run()
            // Held (no route usable): every byte the request holds is counted.
            let request = try #require(pipe.handler.exchange?.request)
            #expect(request.parts.count == 1)
            let held = request.parts.reduce(0) { $0 + $1.capacity }
            let counted = before - pipe.gateway.readAhead.available
            #expect(held <= counted && counted <= 2 * (size + 2) + 64, "held \(held), counted \(counted)")
        }
    }

    @Test(
        "a login page (Cloudflare Access's redirect) is not the answer: the next route takes a GET; alone, the client gets 502 naming the cause"
    )
    func loginRedirect() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server, Self.other])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            let login =
                "HTTP/1.1 302 Found\r\nLocation: https://team.cloudflareaccess.com/cdn-cgi/access/login/x\r\nContent-Type: text/html\r\nContent-Length: 5\r\n\r\n<a/>\n"
            try pipe.send(PipelineHarness.get())
            _ = try pipe.serverGot(0)
            try pipe.answer(0, login)
            #expect(pipe.connected == ["10.9.0.2:1234", "10.9.0.3:1234"])
            try pipe.answer(1, PipelineHarness.ok(#"{"from":3}"#))
            let answer = try pipe.received()
            #expect(answer.hasPrefix("HTTP/1.1 200 OK") && answer.hasSuffix(#"{"from":3}"#), "\(answer)")

            fixture.publish([Self.server])
            let alone = try PipelineHarness(fixture)
            defer { alone.finish() }
            try alone.send(PipelineHarness.post(#"{"model":"alpha"}"#))
            _ = try alone.serverGot(0)
            try alone.answer(0, login)
            let refused = try alone.received()
            #expect(refused.hasPrefix("HTTP/1.1 502 "), "\(refused)")
            #expect(refused.contains("access_login_required") && refused.contains("lmx-pair"), "\(refused)")
            #expect(!refused.contains("cloudflareaccess") && !refused.contains("<a/>"))
            #expect(alone.client.isActive)
        }
    }

    @Test(
        "the server's own redirect (a trailing slash's 307 on its own host) passes on as it came; an edge's 524 is the gateway's 502 naming the fix"
    )
    func serversOwnRedirect() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server, Self.other])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            for location in ["/v1/models", "http://10.9.0.2:1234/v1/models"] {
                try pipe.send(PipelineHarness.get())
                try pipe.answer(
                    pipe.servers.count - 1,
                    "HTTP/1.1 307 Temporary Redirect\r\nLocation: \(location)\r\nContent-Length: 0\r\n\r\n")
                let answer = try pipe.received()
                #expect(answer.hasPrefix("HTTP/1.1 307 ") && answer.contains("Location: \(location)"), "\(answer)")
            }
            #expect(pipe.connected.allSatisfy { $0 == "10.9.0.2:1234" }, "\(pipe.connected)")
            // (Not marking the route for a 524: ``ForeignAnswer/marksRoute``, ForeignAnswerTests.)
            try pipe.send(PipelineHarness.post(#"{"model":"alpha"}"#))
            try pipe.answer(
                pipe.servers.count - 1,
                "HTTP/1.1 524 \r\nServer: cloudflare\r\nContent-Type: text/html\r\nContent-Length: 6\r\n\r\n<html>")
            let timeout = try pipe.received()
            #expect(timeout.hasPrefix("HTTP/1.1 502 ") && timeout.contains("tunnel_error_page"), "\(timeout)")
            #expect(timeout.contains("stream"), "\(timeout)")
        }
    }

    @Test(
        "a tunnel's HTML error page (530) and a captive portal's page (200 text/html) are answered as the gateway's errors"
    )
    func edgeAndPortalPages() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            let pipe = try PipelineHarness(fixture)
            defer { pipe.finish() }
            try pipe.send(PipelineHarness.post(#"{"model":"alpha"}"#))
            _ = try pipe.serverGot(0)
            try pipe.answer(
                0, "HTTP/1.1 530 \r\nContent-Type: text/html; charset=UTF-8\r\nContent-Length: 6\r\n\r\n<html>")
            let edge = try pipe.received()
            #expect(edge.hasPrefix("HTTP/1.1 502 ") && edge.contains("tunnel_error_page"), "\(edge)")
            try pipe.send(PipelineHarness.get())
            try pipe.answer(
                pipe.servers.count - 1, "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 6\r\n\r\n<html>")
            let portal = try pipe.received()
            #expect(portal.hasPrefix("HTTP/1.1 502 ") && portal.contains("captive_portal"), "\(portal)")
            // A portal's plain text in place of a JSON path's answer; not the server's CORS
            // preflight answer (Starlette's middleware answers it `text/plain` "OK"), nor plain
            // text on a path that is not JSON-only.
            try pipe.send(PipelineHarness.post(#"{"model":"alpha"}"#))
            try pipe.answer(
                pipe.servers.count - 1,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 7\r\n\r\nSign in")
            let text = try pipe.received()
            #expect(text.hasPrefix("HTTP/1.1 502 ") && text.contains("captive_portal"), "\(text)")
            try pipe.send(
                "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nOrigin: http://localhost:3000\r\nAccess-Control-Request-Method: POST\r\n\r\n"
            )
            try pipe.answer(
                pipe.servers.count - 1,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nAccess-Control-Allow-Origin: *\r\nContent-Length: 2\r\n\r\nOK"
            )
            let preflight = try pipe.received()
            #expect(preflight.hasPrefix("HTTP/1.1 200 ") && preflight.hasSuffix("OK"), "\(preflight)")
            try pipe.send("GET /v1/audio/voices HTTP/1.1\r\nHost: localhost\r\n\r\n")
            try pipe.answer(
                pipe.servers.count - 1, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nalloy")
            #expect(try pipe.received().hasPrefix("HTTP/1.1 200 "))
            // The label read as the probes read it: the whole media type (`text/htmlx` is no page).
            try pipe.send(PipelineHarness.get())
            try pipe.answer(
                pipe.servers.count - 1, "HTTP/1.1 200 OK\r\nContent-Type: TEXT/HTMLX\r\nContent-Length: 2\r\n\r\n{}")
            #expect(try pipe.received().hasPrefix("HTTP/1.1 200 "))
            // A second Content-Type naming a page is the page's (a JSON label first hides nothing).
            try pipe.send(PipelineHarness.get())
            try pipe.answer(
                pipe.servers.count - 1,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Type: text/html\r\nContent-Length: 6\r\n\r\n<html>"
            )
            let doubled = try pipe.received()
            #expect(doubled.hasPrefix("HTTP/1.1 502 ") && doubled.contains("captive_portal"), "\(doubled)")
            // A redirect that names no place leads to no page: passed on. A blank Location first
            // hides no portal's behind it.
            try pipe.send(PipelineHarness.get())
            try pipe.answer(pipe.servers.count - 1, "HTTP/1.1 302 Found\r\nContent-Length: 0\r\n\r\n")
            #expect(try pipe.received().hasPrefix("HTTP/1.1 302 "))
            try pipe.send(PipelineHarness.get())
            try pipe.answer(
                pipe.servers.count - 1,
                "HTTP/1.1 302 Found\r\nLocation: \r\nLocation: http://portal.example/login\r\nContent-Length: 0\r\n\r\n"
            )
            let hidden = try pipe.received()
            #expect(hidden.hasPrefix("HTTP/1.1 502 ") && hidden.contains("captive_portal"), "\(hidden)")
            // The pages answered in the gateway's words are counted as the route's errors.
            let counted = fixture.agent.traffic.report().models.reduce(0) { $0 + $1.errors }
            #expect(counted == 5, "\(fixture.agent.traffic.report())")
        }
    }

    /// A head of 101 header lines (more than the front reads: the connection is llhttp's from
    /// there), then `count` GETs pipelined behind it, the nth to `target(n)`.
    static func behindLongHead(_ count: Int, target: (Int) -> String) -> String {
        let many = (0..<101).map { "X-H\($0): v\r\n" }.joined()
        var text = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\(many)\r\n"
        for index in 1...count { text += "GET \(target(index)) HTTP/1.1\r\nHost: x\r\n\r\n" }
        return text
    }

    @Test(
        "pipelined requests behind a head llhttp reads are parsed a slice at a time, one request ahead; that request is answered, then the connection closes (as nginx after a bad request), nothing after it answered"
    )
    func pipelinedBehindLLHTTP() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            let pipe = try PipelineHarness(fixture, generalPath: true)
            defer { pipe.finish() }
            let general = try #require(pipe.generalPath)
            let count = 300
            try pipe.send(Self.behindLongHead(count) { "/v1/n\($0)" })
            #expect(general.heads.count == 1, "one request at a time to the general path")
            #expect((pipe.handler.llhttpQueue?.count ?? 0) <= GatewayConnectionHandler.maxLLHTTPQueued)
            #expect(pipe.front.holdsForLLHTTP)
            general.answerNext("r0")
            let answers = try pipe.received()
            #expect(answers.components(separatedBy: "HTTP/1.1 ").count == 2, "one answer: \(answers.prefix(400))")
            #expect(answers.lowercased().contains("connection: close") && answers.hasSuffix("r0"), "\(answers)")
            #expect(!pipe.client.isActive, "closed after it")
            #expect(general.heads.count == 1, "nothing behind it went to the general path")
        }
    }

    @Test(
        "the benchmark's pipelined flood (400 requests behind a head llhttp reads) holds at most 64 KiB, answers SwiftNIO may hold included, and closes after its first answer"
    )
    func pipelinedFloodBounded() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server])
            let pipe = try PipelineHarness(fixture, generalPath: true)
            defer { pipe.finish() }
            let general = try #require(pipe.generalPath)
            let count = 400
            let text = Self.behindLongHead(count) { _ in "/v1/models" }
            // One read brings it all (17 KB; a socket's reads are at most 32 KiB).
            var read = ByteBufferAllocator().buffer(capacity: 32 << 10)
            read.writeString(text)
            try pipe.client.writeInbound(read)
            pipe.loop.run()
            // What SwiftNIO may hold of the answers while the client reads none of them (the
            // general path writes the next only while the connection is writable).
            let marks = pipe.client.options.lazy.compactMap { $0.value as? ChannelOptions.Types.WriteBufferWaterMark }
                .first
            let answersHeld = try #require(marks, "the general path sets the connection's water marks").high
            let most = pipe.handler.bytesHeld
            general.answerNext("r0")
            _ = try pipe.received()
            #expect(general.heads.count == 1 && !pipe.client.isActive)
            print("pipelined flood: at most \(most) bytes held by the handler, \(answersHeld) of answers by SwiftNIO")
            #expect(most + answersHeld <= WirePropertyTests.bound, "held \(most) + answers \(answersHeld)")
        }
    }

    @Test("a request held for a route goes as soon as the agent's state has one, without a timer")
    func heldRequestWokenByState() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([])
            var configuration = GatewayConfiguration()
            configuration.holdSeconds = 30
            let pipe = try PipelineHarness(fixture, configuration: configuration)
            defer { pipe.finish() }
            try pipe.send(PipelineHarness.get())
            #expect(pipe.servers.isEmpty)
            fixture.publish([Self.server])
            pipe.state.snapshot = fixture.agent.board.snapshot
            pipe.state.snapshotChanged()
            pipe.loop.run()
            #expect(try pipe.serverGot(0).hasPrefix("GET /v1/models"))
        }
    }

    @Test("max_connections_per_route is one cap across the loops' pools: a cap of 1 is 1 in all")
    func capAcrossLoops() throws {
        let loop = EmbeddedEventLoop()
        let tls = try NIOSSLContext(configuration: .makeClientConfiguration())
        let slots = RouteSlots()
        let first = UpstreamPool(eventLoop: loop, tls: tls, slots: slots)
        let second = UpstreamPool(eventLoop: loop, tls: tls, slots: slots)
        var opened: [EmbeddedChannel] = []
        let connector: (UpstreamAddress, TimeAmount) -> EventLoopFuture<any Channel> = { _, _ in
            let channel = EmbeddedChannel(handler: HTTP1Upstream(), loop: loop)
            opened.append(channel)
            return channel.connect(to: try! SocketAddress(ipAddress: "127.0.0.1", port: 1)).map { channel }
        }
        first.connector = connector
        second.connector = connector
        let address = try #require(UpstreamAddress("http://10.9.0.2:1234"))
        #expect(second.hasRoom(address, cap: 1))
        _ = first.connect(address, timeout: .seconds(1))
        loop.run()
        #expect(!second.hasRoom(address, cap: 1), "the other loop's connection counts")
        _ = try opened[0].finish()
        loop.run()
        #expect(second.hasRoom(address, cap: 1), "given back when it closed")
    }

    @Test(
        "a route's cap is checked and taken in one step: loops racing for its last slots open no more than the cap together"
    )
    func capTakenAtomically() async throws {
        let slots = RouteSlots()
        let address = try #require(UpstreamAddress("http://10.9.0.2:1234"))
        let cap = 3
        // Eight threads at once, as eight event loops asking for the route's slots.
        let taken = await withTaskGroup(of: Int.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    var mine = 0
                    for _ in 0..<2_000 where slots.take(address, cap: cap) { mine += 1 }
                    return mine
                }
            }
            return await group.reduce(0, +)
        }
        #expect(taken == cap)
        #expect(slots.count(address) == cap)
        slots.give(address)
        #expect(slots.take(address, cap: cap), "a slot given back is taken again")
        #expect(!slots.take(address, cap: cap))
    }
}
