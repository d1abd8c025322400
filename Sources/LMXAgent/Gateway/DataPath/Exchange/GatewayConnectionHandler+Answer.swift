import LMXCore
import LMXProbe
import LMXSystem
import NIOCore
import NIOHTTP1
import Prometheus

extension GatewayConnectionHandler {
    // MARK: The answer

    func upstreamRead(_ part: UpstreamResponseParser.Part) {
        guard let request, context != nil, let upstream = request.upstream else { return }
        switch part {
        case .head(let head):
            if head.status < 200 { return }  // 100 Continue and other interim answers (the parser skips them)
            request.routeCount?.heard(at: .now())
            let target = request.target
            // What the rules read of the answer's headers, read with the head.
            let read = head.read
            // A page that is not the server's (a login page, a tunnel's error page, a captive
            // portal): never passed on as if it were the answer; the route is marked with its cause.
            // (The API's paths: `/admin/` may serve a server's own pages.)
            let foreign =
                request.path.hasPrefix("/v1/")
                ? ForeignAnswer.recognise(
                    status: head.status, html: read.html, location: read.location,
                    edge: read.keepAlive.throughCloudflare, server: target.baseURL) : nil
            let cooldown =
                foreign != nil
                ? nil
                : RouteLoad.busyCooldown(
                    code: head.status, retryAfter: read.retryAfter, cap: gateway.configuration.busyCooldownMax)
            if let cooldown { gateway.load.coolDown(target.routeKey, seconds: cooldown) }
            // An event stream the gateway reads as it passes (and may end with its own error event,
            // or continue from another answer): never one in a content coding it does not read,
            // which is passed on untouched, as any other body.
            let relayed = read.eventStream && !read.encoded
            let resuming = request.exchange.resuming
            let action = request.exchange.answerHead(
                busyFor: cooldown, status: head.status, stream: relayed, foreign: foreign)
            if let foreign, !resuming {
                gateway.logger.notice(
                    "gateway: a route answered with a page that is not the server's",
                    metadata: ["route": "\(target.routeID)", "status": "\(head.status)", "cause": "\(foreign.detail)"])
            }
            if let foreign, !resuming, foreign.marksRoute {
                let manager = gateway.agent.manager
                let routeID = target.routeID
                Task { await manager.gatewayFoundNotServer(routeID, foreign) }
            }
            switch action {
            case .continueAnswer:
                // A stream opened again: the client has its head; the events go on.
                upstream.keepFor = .seconds(Int64(read.keepAlive.seconds))
                request.lastUpstreamByte = .now()
                return
            case .streamLost:
                return streamLost(request, error: Gateway.StreamEndedMidEvent())
            default:
                break
            }
            if case .connect = action {
                // Busy (429, 503), or a page that is not the server's, before any byte reached the
                // client: another route with the model takes it, on this path (a busy one cools
                // down meanwhile).
                if foreign == nil {
                    gateway.logger.info(
                        "gateway: server busy, trying the next",
                        metadata: ["route": "\(target.routeID)", "status": "\(head.status)"])
                }
                return run(action, for: request)
            }
            if case .respond = action {
                gateway.metrics.gatewayFailures.increment()
                return run(action, for: request)
            }
            guard case .passAnswer = action else { return }
            if (200..<300).contains(head.status), target.instanceID != nil {
                if let made = request.madeByRequest, let instance = target.instanceID {
                    gateway.affinity.record(made, on: instance, user: peer.uid)
                }
                // An answer that names what the request made (a run's id): read as it passes.
                if request.answerMakes, read.json, let length = read.contentLength,
                    length <= Gateway.madeAnswerLimit
                {
                    request.madeAnswer = []
                    request.madeAnswer?.reserveCapacity(length)
                }
            }
            let events = relayed
            if events {
                let relay = EventRelay()
                if request.exchange.resumable { relay.makeResumable() }
                request.relay = relay
                request.lastUpstreamByte = .now()
                watchState()
            }
            let series = TrafficTap(
                traffic: gateway.agent.traffic, model: request.model, started: request.started
            )
            .answered(target.via, status: head.status, stream: events, recent: state.recentTraffic)
            request.traffic = series
            state.recentTraffic = series
            // GatewayPolicy.downstreamHeaders, one header at a time, copied from the server's
            // bytes straight into the head's (the names and values read strictly by
            // ``UpstreamResponseParser``: tokens, no line breaks or control characters; and ours).
            upstream.keepFor = .seconds(Int64(read.keepAlive.seconds))
            // One framing per answer, kept on every path: a relayed stream may get the gateway's
            // error event or another answer's events after its own, so the client is promised
            // no length for it (chunked, or to HTTP/1.0 the connection's close), whatever the
            // server's length said.
            let length = relayed ? nil : read.contentLength
            let connectionListed = read.connectionListed
            request.keepAlive = request.head.keepAlive
            let bytes = head.bytes.withUnsafeReadableBytes { raw in
                // (Room for a small body, or a stream's first events: gathered after the head,
                // in the same buffer; growing it cost about 1,000 instructions.)
                answerHead(
                    request, status: .init(statusCode: head.status), sized: length != nil,
                    estimate: raw.count + 320 + min(length ?? 1024, HTTP1Bytes.gatherLimit)
                ) { out in
                    for field in head.fields where field.kept {
                        let name = UnsafeRawBufferPointer(rebasing: raw[field.name])
                        if !connectionListed.isEmpty,
                            !GatewayPolicy.keepsDownstream(nameBytes: name, connectionListed: connectionListed)
                        {
                            continue
                        }
                        out.add(name)
                        out.add(": ")
                        out.add(UnsafeRawBufferPointer(rebasing: raw[field.value]))
                        out.add("\r\n")
                    }
                    if let length {
                        out.add("Content-Length: ")
                        out.add(decimal: length)
                        out.add("\r\n")
                    }
                    out.add(Self.securityHeaderLines)
                    out.header("X-LMX-Via", target.via.rawValue)
                }
            }
            // An answer that comes before the client has sent its whole body (a server that
            // answers without reading it) is held until the body has come, as nginx does: many
            // clients cannot read an answer while they are still writing. Bounded.
            emit(.head(bytes), for: request)
        case .body(let chunk):
            guard request.phase == .answering else { return }
            if request.madeAnswer != nil { request.madeAnswer?.append(contentsOf: chunk.readableBytesView) }
            // Its server is alive: the agent reads this as proof (passive health).
            let now = NIODeadline.now()
            request.routeCount?.heard(at: now)
            if let relay = request.relay {
                request.lastUpstreamByte = now
                relay.pass(chunk) { emit(.body($0), for: request) }
            } else {
                emit(.body(chunk), for: request)
            }
        case .end:
            guard request.phase == .answering else { return }
            if let relay = request.relay {
                let (rest, cut) = relay.finish(framed: !upstream.handler.endedByClose)
                if cut { return streamLost(request, error: Gateway.StreamEndedMidEvent()) }
                if let rest { emit(.body(rest), for: request) }
                if let series = request.traffic {
                    TrafficTap(traffic: gateway.agent.traffic, model: request.model, started: request.started)
                        .streamed(series: series, relay.tally)
                }
            }
            if let bytes = request.madeAnswer, let instance = request.target.instanceID,
                let made = ServerAffinity.madeByAnswer(bytes, path: request.path)
            {
                // Recorded before the answer reaches the client, which may name it next.
                gateway.affinity.record(made, on: instance, user: peer.uid)
            }
            emit(.end, for: request)
            flushToClient()
            // The pool keeps the connection only when the whole request went to the server and
            // the parser found the answer whole and the connection reusable (``UpstreamPool/release``).
            run(request.exchange.answerEnd(reusable: upstream.handler.reusable), for: request)
        }
    }

    /// The largest answer held while the client is still sending its body; past it, the answer
    /// goes as it comes.
    static let maxHeldAnswer = 1 << 20

    /// Writes a part of the answer to the client, or holds it (see ``ForwardedRequest/holdsAnswer``).
    func emit(_ part: ClientOutput, for request: ForwardedRequest) {
        guard context != nil else { return }
        if request.exchange.holdsAnswer {
            if case .body(let bytes) = part { request.heldBytes += bytes.readableBytes }
            request.hold(part)
            if request.heldBytes <= Self.maxHeldAnswer { return }
            request.exchange.answerReleased()
            releaseHeldAnswer(request)
            return
        }
        writeToClient(part, for: request)
    }

    /// The head of an answer of the data path, as bytes: the status line, the headers `write`
    /// writes, and the framing for this client — chunked only when the answer has no length and
    /// the client speaks HTTP/1.1; to an HTTP/1.0 client such a body runs until the connection
    /// closes; nothing after the head of an answer to `HEAD`, or of a 204 or 304.
    func answerHead(
        _ request: ForwardedRequest, status: HTTPResponseStatus, sized: Bool, estimate: Int = 512,
        headers write: (inout HeadLines) -> Void
    ) -> ByteBuffer {
        let code = status.code
        let bodiless = request.head.method == .HEAD || code == 204 || code == 304 || code < 200
        request.chunkedToClient = !bodiless && !sized && request.head.minor >= 1
        if !bodiless, !sized, !request.chunkedToClient { request.keepAlive = false }
        let chunked = request.chunkedToClient
        let keepAlive = request.keepAlive
        return HeadLines.make(context?.channel.allocator ?? ByteBufferAllocator(), estimate: estimate) { out in
            out.add("HTTP/1.1 ")
            out.add(decimal: Int(code))
            out.add(" ")
            out.add(status.reasonPhrase)
            out.add("\r\n")
            write(&out)
            if chunked { out.add("Transfer-Encoding: chunked\r\n") }
            if !keepAlive { out.add("Connection: close\r\n") }
            out.add("\r\n")
        }
    }

    /// ``GatewayPolicy/securityHeaders`` as header lines, made once.
    static let securityHeaderLines: [UInt8] = GatewayPolicy.securityHeaders.flatMap { name, value in
        Array("\(name): \(value)\r\n".utf8)
    }

    /// Writes a part of an answer of the data path to the client as bytes, past SwiftNIO's HTTP/1
    /// response encoder (through its context): the encoder frames only the general path's
    /// answers, to requests llhttp read (``ClientFront``).
    /// Small parts are gathered and written as one at the flush (``flushToClient()``).
    func writeToClient(_ part: ClientOutput, for request: ForwardedRequest) {
        guard let output = rawOutput else { return }
        clientUnflushed = true
        let chunked = request.chunkedToClient
        switch part {
        case .head(let bytes):
            withGathered { $0.add(head: bytes) }
        case .body(let bytes):
            answerBytesWritten &+= bytes.readableBytes
            withGathered { $0.add(bytes, chunked: chunked, to: output) }
        case .end:
            if chunked { withGathered { $0.add(HTTP1Bytes.lastChunk, chunked: false, to: output) } }
        }
    }

    /// Sends what was written to the client.
    func flushToClient() {
        // Not again when nothing was written since (an answer that ends in a read batch is
        // flushed as it ends, and the batch's end would flush nothing through the pipeline).
        guard clientUnflushed else { return }
        clientUnflushed = false
        if let rawOutput { withGathered { $0.write(to: rawOutput) } }
        context?.flush()
    }

    /// `change` made to what is gathered, moved out of the handler into a local and back.
    func withGathered(_ change: (inout Gathered) -> Void) {
        var gathered = Gathered()
        swap(&gathered, &self.gathered)
        change(&gathered)
        swap(&gathered, &self.gathered)
    }

    /// Writes what was held of the answer, and holds no more.
    func releaseHeldAnswer(_ request: ForwardedRequest) {
        guard !request.heldAnswer.isEmpty, !request.exchange.holdsAnswer, context != nil else { return }
        let held = request.heldAnswer
        request.heldAnswer = []
        request.heldBytes = 0
        for part in held { writeToClient(part, for: request) }
        flushToClient()
    }

    func upstreamReadComplete() {
        flushToClient()
    }

    func upstreamWritable() {
        resumeReadsIfHeld()
    }

    /// The upstream connection closed or failed while this request held it.
    func upstreamClosed(_ error: (any Error)?) {
        guard let request, request.upstream != nil else { return }
        let detail = error.map { Prober.classify($0).detail } ?? "the server closed the connection"
        if request.phase == .connecting || request.phase == .forwarding {
            return failed(request, detail: detail, error: error, certainlyNotSent: false)
        }
        let action = request.exchange.upstreamClosed(detail: detail)
        if case .streamLost = action {
            return streamLost(request, error: error ?? Gateway.StreamEndedMidEvent())
        }
        if case .resume = action {
            return resumeStream(request, routeFailed: true, detail: detail)
        }
        // An answer cut in the middle: the client gets what came, then sees its connection
        // close, as from the server.
        request.exchange.answerReleased()
        releaseHeldAnswer(request)
        flushToClient()
        run(action, for: request)
    }

    /// A stream of events lost mid-answer: ended with an `error` event naming the route, and the
    /// agent probes it again.
    func streamLost(_ request: ForwardedRequest, error: any Error) {
        guard context != nil else { return }
        let target = request.target
        guard let relay = request.relay else {
            // Nothing of the gateway's can be written into this answer: the client sees its
            // connection close short of the answer's end, as from the server.
            return end(request, upstream: .close, client: .close)
        }
        detachUpstream(request)?.channel.close(promise: nil)
        emit(.body(relay.lost(target: target, error: error)), for: request)
        emit(.end, for: request)
        flushToClient()
        if let series = request.traffic {
            TrafficTap(traffic: gateway.agent.traffic, model: request.model, started: request.started)
                .streamed(series: series, relay.tally)
        }
        let manager = gateway.agent.manager
        let routeID = target.routeID
        Task { await manager.gatewayFailed(routeID, reason: "a stream was cut mid-answer") }
        run(request.exchange.streamEnded(), for: request)
    }
}
