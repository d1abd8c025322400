import Testing

@testable import LMXCore

/// The data path's exchange as a value: events in, actions out, without a channel.
@Suite("Gateway exchange: one request's life as events and actions")
struct GatewayExchangeTests {
    func exchange(_ method: String = "POST", length: Int = 10, readAhead: Int = 256, max: Int = 1000)
        -> GatewayExchange
    {
        GatewayExchange(method: method, declaredLength: length, maxBodyBytes: max, readAheadBytes: readAhead)
    }

    @Test("a small body is read ahead whole, decided at its end, sent, answered, the connection pooled")
    func plain() {
        var e = exchange()
        #expect(e.bodyPart(size: 4) { true } == .keep(thenDecide: false))
        #expect(e.bodyPart(size: 6) { true } == .keep(thenDecide: false))  // the last byte: its end follows
        #expect(e.bodyEnd() == .decide)
        #expect(e.routed(routes: 2) == .connect(attempt: 0, fresh: false))
        e.sent(onKeptConnection: false)
        #expect(e.bodyWhole && e.phase == .forwarding)
        #expect(e.answerHead(busyFor: nil, status: 200, stream: false) == .passAnswer(hold: false))
        #expect(e.answerEnd(reusable: true) == .finish(upstream: .pool, client: .next))
        #expect(e.phase == .finished)
        // Nothing after the finish does anything: one way to end.
        #expect(e.clientGone() == .none)
        #expect(e.answerEnd(reusable: true) == .none)
    }

    @Test("past the read-ahead (or the shared budget) the request is decided at once; its body then goes as it comes")
    func readAhead() {
        var e = exchange(length: 100, readAhead: 16)
        #expect(e.bodyPart(size: 8) { true } == .keep(thenDecide: false))
        #expect(e.bodyPart(size: 8) { true } == .keep(thenDecide: true))
        _ = e.routed(routes: 1)
        e.sent(onKeptConnection: true)
        #expect(!e.bodyWhole, "passed on: it can never go again")
        #expect(e.bodyPart(size: 50) { true } == .send)
        var budget = exchange(length: 100, readAhead: 64)
        #expect(budget.bodyPart(size: 8) { false } == .keep(thenDecide: true))
    }

    @Test("an answer before the upload ends is held; the upload's end sends the end and releases it")
    func heldAnswer() {
        var e = exchange(length: 100, readAhead: 16)
        _ = e.bodyPart(size: 20) { true }
        _ = e.routed(routes: 1)
        e.sent(onKeptConnection: false)
        #expect(e.answerHead(busyFor: nil, status: 200, stream: false) == .passAnswer(hold: true))
        #expect(e.holdsAnswer)
        #expect(e.bodyPart(size: 30) { true } == .send)
        // The answer ends before the body: the server's connection is never reused.
        #expect(e.answerEnd(reusable: true) == .finish(upstream: .close, client: .readRest))
        #expect(e.bodyPart(size: 50) { true } == .drop)
        #expect(e.bodyEnd() == .finish(upstream: .none, client: .next))
        #expect(!e.holdsAnswer)
    }

    @Test(
        "a kept connection closed before answering: a GET goes again once on a new connection, then to the next route; a POST with its body passed on is answered 502"
    )
    func keptConnectionClosed() {
        var get = exchange("GET", length: 0)
        #expect(get.bodyEnd() == .decide)
        _ = get.routed(routes: 2)
        get.sent(onKeptConnection: true)
        #expect(get.upstreamClosed(detail: "closed") == .connect(attempt: 0, fresh: true))
        get.sent(onKeptConnection: false)
        #expect(get.upstreamClosed(detail: "closed") == .connect(attempt: 1, fresh: false))
        get.sent(onKeptConnection: false)
        #expect(get.upstreamClosed(detail: "closed") == .respond(.unreachable(detail: "closed")))
        #expect(get.responded() == .finish(upstream: .close, client: .next))

        var put = exchange("PUT", length: 100, readAhead: 16)
        _ = put.bodyPart(size: 20) { true }
        _ = put.routed(routes: 2)
        put.sent(onKeptConnection: true)
        #expect(put.upstreamClosed(detail: "reset") == .respond(.unreachable(detail: "reset")))
        // Its body had not all come: the client cannot send another request cleanly.
        #expect(put.responded() == .finish(upstream: .close, client: .close))
    }

    @Test("a POST whose connection failed after it went is never sent twice; one never sent goes to the next route")
    func notIdempotent() {
        var sentOnce = exchange()
        _ = sentOnce.bodyPart(size: 10) { true }
        _ = sentOnce.bodyEnd()
        _ = sentOnce.routed(routes: 3)
        sentOnce.sent(onKeptConnection: false)
        #expect(sentOnce.upstreamClosed(detail: "reset") == .respond(.unreachable(detail: "reset")))

        var neverSent = exchange()
        _ = neverSent.bodyPart(size: 10) { true }
        _ = neverSent.bodyEnd()
        _ = neverSent.routed(routes: 2)
        #expect(neverSent.failed(certainlyNotSent: true, detail: "refused") == .connect(attempt: 1, fresh: false))
        #expect(
            neverSent.failed(certainlyNotSent: true, detail: "refused") == .respond(.unreachable(detail: "refused")))
    }

    @Test("busy hand-over: 429 with another route left goes there; the last busy answer passes as it is")
    func busy() {
        var e = exchange()
        _ = e.bodyPart(size: 10) { true }
        _ = e.bodyEnd()
        _ = e.routed(routes: 2)
        e.sent(onKeptConnection: false)
        #expect(e.answerHead(busyFor: 2.5, status: 429, stream: false) == .connect(attempt: 1, fresh: false))
        e.sent(onKeptConnection: false)
        #expect(e.answerHead(busyFor: 5, status: 503, stream: false) == .passAnswer(hold: false))
        // A busy server, then the next one unreachable: the busy answer in the gateway's words.
        var f = exchange()
        _ = f.bodyPart(size: 10) { true }
        _ = f.bodyEnd()
        _ = f.routed(routes: 2)
        f.sent(onKeptConnection: false)
        _ = f.answerHead(busyFor: 2.5, status: 429, stream: false)
        #expect(f.failed(certainlyNotSent: true, detail: "refused") == .respond(.busy(status: 429, retryAfter: 3)))
        let answer = GatewayExchange.Refusal.busy(status: 429, retryAfter: 3).answer
        #expect(answer.status == 429 && answer.retryAfter == 3 && answer.code == "server_busy")
    }

    @Test(
        "a stream cut mid-answer: the stream-lost event, then the end; a plain answer cut: the client's connection closes"
    )
    func cut() {
        var stream = exchange("GET", length: 0)
        _ = stream.bodyEnd()
        _ = stream.routed(routes: 1)
        stream.sent(onKeptConnection: false)
        _ = stream.answerHead(busyFor: nil, status: 200, stream: true)
        #expect(stream.upstreamClosed(detail: "reset") == .streamLost)
        #expect(stream.streamEnded() == .finish(upstream: .close, client: .next))

        var plain = exchange("GET", length: 0)
        _ = plain.bodyEnd()
        _ = plain.routed(routes: 1)
        plain.sent(onKeptConnection: false)
        _ = plain.answerHead(busyFor: nil, status: 200, stream: false)
        #expect(plain.upstreamClosed(detail: "reset") == .finish(upstream: .none, client: .close))
    }

    @Test(
        "a body too large, stalled or cut: answered unless the answer has begun to go out, then the connection closes")
    func bodyNotWhole() {
        var big = exchange(length: 2000, readAhead: 16, max: 1000)
        _ = big.bodyPart(size: 20) { true }
        _ = big.routed(routes: 1)
        big.sent(onKeptConnection: false)
        #expect(big.bodyPart(size: 990) { true } == .respond(.tooLarge(limit: 1000)))
        #expect(big.responded() == .finish(upstream: .close, client: .close))

        var held = exchange(length: 100, readAhead: 16)
        _ = held.bodyPart(size: 20) { true }
        _ = held.routed(routes: 1)
        held.sent(onKeptConnection: false)
        _ = held.answerHead(busyFor: nil, status: 200, stream: false)  // held: nothing went out
        #expect(held.bodyNotWhole(.timeout(seconds: 60)) == .respond(.timeout(seconds: 60)))

        var going = exchange(length: 100, readAhead: 16)
        _ = going.bodyPart(size: 20) { true }
        _ = going.routed(routes: 1)
        going.sent(onKeptConnection: false)
        _ = going.answerHead(busyFor: nil, status: 200, stream: false)
        _ = going.bodyPart(size: 30) { true }
        // (past the held bound the handler releases it)
        going.answerReleased()
        #expect(
            going.bodyNotWhole(.incomplete(received: 20, declared: 100)) == .finish(upstream: .close, client: .close))
        #expect(GatewayExchange.Refusal.timeout(seconds: 60).answer.status == 408)
        #expect(GatewayExchange.Refusal.incomplete(received: 1, declared: 2).answer.status == 400)
        #expect(GatewayExchange.Refusal.noEndpoint(holdSeconds: 5, reason: "x").answer.retryAfter == 2)
    }

    @Test("the client gone at any point: everything let go once")
    func clientGone() {
        var e = exchange()
        _ = e.bodyPart(size: 4) { true }
        #expect(e.clientGone() == .finish(upstream: .close, client: .gone))
        #expect(e.clientGone() == .none)
        #expect(e.bodyEnd() == .none)
    }

    @Test(
        "a refusal before anything is sent: the body read and dropped, then answered, the connection kept; at once: closed"
    )
    func refusing() {
        let forbidden = GatewayExchange.Refusal.refused(status: 403, code: "forbidden_origin", message: "no")
        var e = exchange(length: 10)
        #expect(e.refuse(forbidden, atOnce: false) == .none)
        #expect(e.bodyPart(size: 10) { true } == .drop)
        #expect(e.bodyEnd() == .respond(forbidden))
        #expect(e.responded() == .finish(upstream: .close, client: .next))
        var big = exchange(length: 5000, max: 1000)
        #expect(big.refuse(.tooLarge(limit: 1000), atOnce: true) == .respond(.tooLarge(limit: 1000)))
        #expect(big.responded() == .finish(upstream: .close, client: .close))
        // A refused body that outgrows the limit as it comes (chunked) is answered then.
        var chunked = exchange(length: -1, max: 100)
        _ = chunked.refuse(forbidden, atOnce: false)
        #expect(chunked.bodyPart(size: 101) { true } == .respond(.tooLarge(limit: 100)))
    }

    @Test(
        "a run's creation with its key: sent again after any failure, first on a new connection, then only to the server it may have reached"
    )
    func repeatableGoesBackToItsServer() {
        var e = exchange()
        _ = e.bodyPart(size: 10) { true }
        _ = e.bodyEnd()
        e.repeatable = true
        _ = e.routed(servers: ["A", "B", "A"])
        e.sent(onKeptConnection: false)
        #expect(e.failed(certainlyNotSent: false, detail: "reset") == .connect(attempt: 0, fresh: true))
        e.sent(onKeptConnection: false)
        // Server A may have made it: its other route, never B.
        #expect(e.failed(certainlyNotSent: false, detail: "reset") == .connect(attempt: 2, fresh: false))
        e.sent(onKeptConnection: false)
        #expect(e.failed(certainlyNotSent: false, detail: "reset") == .respond(.unreachable(detail: "reset")))
        // Never reached a server: any server may take it.
        var f = exchange()
        _ = f.bodyPart(size: 10) { true }
        _ = f.bodyEnd()
        f.repeatable = true
        _ = f.routed(servers: ["A", "B"])
        #expect(f.failed(certainlyNotSent: true, detail: "refused") == .connect(attempt: 1, fresh: false))
        // Without a key, a POST that may have arrived is never sent again.
        var g = exchange()
        _ = g.bodyPart(size: 10) { true }
        _ = g.bodyEnd()
        _ = g.routed(servers: ["A", "A"])
        g.sent(onKeptConnection: false)
        #expect(g.failed(certainlyNotSent: false, detail: "reset") == .respond(.unreachable(detail: "reset")))
    }

    @Test(
        "a run's stream cut: opened again, its new answer continues the client's; a route that fails or answers otherwise ends it with the event; a chat stream is only lost"
    )
    func resumeStream() {
        var x = GatewayExchange(method: "GET", declaredLength: 0, maxBodyBytes: 1 << 20, readAheadBytes: 1024)
        x.resumable = true
        #expect(x.bodyEnd() == .decide)
        _ = x.routed(servers: ["a", "a"])
        x.sent(onKeptConnection: false)
        #expect(x.answerHead(busyFor: nil, status: 200, stream: true) == .passAnswer(hold: false))
        #expect(x.upstreamClosed(detail: "cut") == .resume)
        x.resume()
        #expect(x.phase == .waiting && x.resuming)
        #expect(x.routed(servers: ["a"]) == .connect(attempt: 0, fresh: false))
        x.sent(onKeptConnection: false)
        #expect(x.answerHead(busyFor: nil, status: 200, stream: true) == .continueAnswer)
        #expect(x.phase == .answering && !x.resuming)
        // Cut again; the route tried next refuses the connection: the stream ends with its event.
        #expect(x.upstreamClosed(detail: "cut") == .resume)
        x.resume()
        _ = x.routed(servers: ["a"])
        #expect(x.failed(certainlyNotSent: true, detail: "refused") == .streamLost)
        #expect(x.phase == .answering)
        #expect(x.streamEnded() == .finish(upstream: .close, client: .next))

        // Opened again, but answered 404: the stream ends with its event.
        var y = Self.runStreamAnswering()
        y.resume()
        _ = y.routed(servers: ["a"])
        y.sent(onKeptConnection: false)
        #expect(y.answerHead(busyFor: nil, status: 404, stream: false) == .streamLost)
        // No route within the hold.
        var z = Self.runStreamAnswering()
        z.resume()
        #expect(z.resumeFailed() == .streamLost && z.phase == .answering)

        // A chat completion's stream is never opened again.
        var chat = GatewayExchange(method: "POST", declaredLength: 2, maxBodyBytes: 1 << 20, readAheadBytes: 1024)
        _ = chat.bodyPart(size: 2) { true }
        _ = chat.bodyEnd()
        _ = chat.routed(servers: ["a"])
        chat.sent(onKeptConnection: false)
        _ = chat.answerHead(busyFor: nil, status: 200, stream: true)
        #expect(chat.upstreamClosed(detail: "cut") == .streamLost)
        chat.resume()
        #expect(!chat.resuming, "not resumable: resume() does nothing")
    }

    @Test(
        "the state carries what each stage needs: resuming only until the new answer, the kept connection only while the request is out, the answer's kind only while it goes, the refusal only while the body is dropped"
    )
    func statesCarryTheirData() {
        var x = Self.runStreamAnswering()
        #expect(x.state == .answering(.server(stream: true, held: false)))
        #expect(x.upstreamClosed(detail: "cut") == .resume)
        x.resume()
        #expect(x.state == .waiting(resuming: true))
        _ = x.routed(servers: ["a"])
        #expect(x.state == .connecting(resuming: true))
        x.sent(onKeptConnection: true)
        #expect(x.state == .forwarding(resuming: true, kept: true) && x.onKeptConnection)
        #expect(x.answerHead(busyFor: nil, status: 200, stream: true) == .continueAnswer)
        #expect(x.state == .answering(.server(stream: true, held: false)) && !x.onKeptConnection && !x.resuming)

        // An upload answered early: the answer held until the body has come, then released.
        var upload = GatewayExchange(method: "POST", declaredLength: 100, maxBodyBytes: 1 << 20, readAheadBytes: 10)
        #expect(upload.bodyPart(size: 20) { true } == .keep(thenDecide: true))
        #expect(upload.body == .coming)
        _ = upload.routed(servers: [nil])
        upload.sent(onKeptConnection: false)
        #expect(upload.body == .passing && upload.bodyPassedOn && !upload.bodyWhole)
        #expect(upload.answerHead(busyFor: nil, status: 200, stream: false) == .passAnswer(hold: true))
        #expect(upload.state == .answering(.server(stream: false, held: true)) && upload.holdsAnswer)
        #expect(upload.bodyEnd() == .sendEnd)
        #expect(upload.state == .answering(.server(stream: false, held: false)) && upload.body == .sent)

        // A refusal waits with the body being dropped, then answers as the gateway's own.
        var refused = GatewayExchange(method: "POST", declaredLength: 5, maxBodyBytes: 1 << 20, readAheadBytes: 10)
        #expect(refused.refuse(.malformedBody, atOnce: false) == .none)
        #expect(refused.state == .refusing(.malformedBody, closing: false) && refused.refusal == .malformedBody)
        #expect(refused.bodyPart(size: 5) { true } == .drop)
        #expect(refused.bodyEnd() == .respond(.malformedBody))
        #expect(
            refused.state == .answering(.gateway(closing: false)) && refused.refusal == nil && refused.body == .whole)
        #expect(!refused.answerCloses)
        // Writing it closed the connection, which finished the exchange first: it finishes once.
        #expect(refused.clientGone() == .finish(upstream: .close, client: .gone))
        #expect(refused.responded() == .none && refused.state == .finished)

        // Answered, its body read, the connection goes on to the next request...
        var kept = GatewayExchange(method: "POST", declaredLength: 5, maxBodyBytes: 1 << 20, readAheadBytes: 10)
        #expect(kept.refuse(.malformedBody, atOnce: false) == .none)
        #expect(kept.bodyEnd() == .respond(.malformedBody))
        #expect(kept.responded() == .finish(upstream: .close, client: .next))
        // ...unless the refusal closes it (a head without Host): at once, even with no body.
        var closing = GatewayExchange(method: "GET", declaredLength: 0, maxBodyBytes: 1 << 20, readAheadBytes: 10)
        let badRequest = GatewayExchange.Refusal.refused(status: 400, code: "bad_request", message: "no Host")
        #expect(closing.refuse(badRequest, atOnce: false, closing: true) == .none)
        #expect(closing.state == .refusing(badRequest, closing: true))
        #expect(closing.bodyEnd() == .respond(badRequest) && closing.answerCloses)
        #expect(closing.responded() == .finish(upstream: .close, client: .close))
        var atOnce = GatewayExchange(method: "POST", declaredLength: 50, maxBodyBytes: 1 << 20, readAheadBytes: 10)
        #expect(atOnce.refuse(badRequest, atOnce: true, closing: true) == .respond(badRequest))
        #expect(atOnce.answerCloses && atOnce.responded() == .finish(upstream: .close, client: .close))
    }

    /// A run's event stream whose answer is passing to the client.
    static func runStreamAnswering() -> GatewayExchange {
        var x = GatewayExchange(method: "GET", declaredLength: 0, maxBodyBytes: 1 << 20, readAheadBytes: 1024)
        x.resumable = true
        _ = x.bodyEnd()
        _ = x.routed(servers: ["a"])
        x.sent(onKeptConnection: false)
        _ = x.answerHead(busyFor: nil, status: 200, stream: true)
        return x
    }

    @Test("which streams go on: a run's events only; what becomes of a stream as the agent's state changes")
    func streamContinuation() {
        #expect(StreamContinuation.resumable(method: "GET", path: "/v1/agents/runs/run-1/events"))
        for (method, path) in [
            ("POST", "/v1/agents/runs/run-1/events"), ("GET", "/v1/agents/runs/run-1"),
            ("GET", "/v1/agents/runs//events"), ("GET", "/v1/chat/completions"),
            ("GET", "/v1/agents/runs/run-1/events/x"),
        ] {
            #expect(!StreamContinuation.resumable(method: method, path: path), "\(method) \(path)")
        }
    }
}
