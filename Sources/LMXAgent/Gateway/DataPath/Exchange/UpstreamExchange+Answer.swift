import LMXCore
import LMXProbe
import NIOCore
import NIOHTTP1

extension UpstreamExchange {
    // MARK: The answer

    func upstreamRead(_ part: UpstreamAnswerPart) {
        // (A connection tells only the exchange that holds it: ``attach(_:)``, ``detach()``.)
        guard let upstream = connection else { return unexpected("an answer's part with no connection in hand") }
        guard client?.context != nil else { return }
        switch part {
        case .head(let head):
            answerHead(head)
        case .body(let chunk):
            guard request.phase == .answering else { return }
            if request.madeAnswer != nil { request.madeAnswer?.append(contentsOf: chunk.readableBytesView) }
            // Its server is alive: the agent reads this as proof (passive health).
            request.routeCount?.heard(at: .now())
            if let relay = request.relay {
                relay.pass(chunk) { emit(.body($0)) }
            } else {
                emit(.body(chunk))
            }
        case .end:
            guard request.phase == .answering else { return }
            if let relay = request.relay {
                let (rest, cut) = relay.finish(framed: !upstream.handler.endedByClose)
                if cut { return streamLost(error: Gateway.StreamEndedMidEvent()) }
                if let rest { emit(.body(rest)) }
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
            emit(.end)
            client?.flushToClient()
            // The pool keeps the connection only when the whole request went to the server and
            // the parser found the answer whole and the connection reusable (``UpstreamPool/release``).
            perform(request.machine.answerEnd(reusable: upstream.handler.reusable))
        }
    }

    /// The answer's head came: what it is (the server's, a busy one, a page that is not the
    /// server's, a stream opened again) is the exchange's to say.
    private func answerHead(_ head: UpstreamAnswerHead) {
        if head.status < 200 { return }  // 100 Continue and other interim answers (the parser skips them)
        request.routeCount?.heard(at: .now())
        let target = request.target
        // What the rules read of the answer's headers, read with the head.
        let read = head.read
        // A page that is not the server's (a login page, a tunnel's error page, a captive
        // portal): never passed on as if it were the answer; the route is marked with its cause.
        // (The API's paths: `/admin/` may serve a server's own pages. Not a CORS preflight,
        // which a server's middleware answers in plain text before any route of its API.)
        let method = request.head.method
        func recognise(location: String?) -> ForeignAnswer? {
            ForeignAnswer.recognise(
                status: head.status, label: read.label, location: location,
                edge: read.keepAlive.throughCloudflare, server: target.baseURL,
                jsonPath: read.label != .json && (method == .GET || method == .POST)
                    && ForeignAnswer.answersInJSON(path: request.path),
                empty: read.contentLength == 0 || method == .HEAD)
        }
        let foreign =
            request.path.hasPrefix("/v1/") && method != .OPTIONS
            ? recognise(location: read.location) ?? read.otherLocation.flatMap(recognise(location:)) : nil
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
        let resuming = request.machine.resuming
        let action = request.machine.answerHead(
            busyFor: cooldown, status: head.status, stream: relayed, foreign: foreign)
        if let foreign, !resuming {
            gateway.logger.notice(
                "gateway: a route answered with a page that is not the server's",
                metadata: ["route": "\(target.routeID)", "status": "\(head.status)", "cause": "\(foreign.detail)"])
            if foreign.marksRoute {
                let manager = gateway.agent.manager
                let routeID = target.routeID
                Task { await manager.gatewayFoundNotServer(routeID, foreign) }
            }
        }
        switch action {
        case .connect where foreign == nil:
            // Busy (429, 503) before any byte reached the client: another route with the model
            // takes it, on this path (the busy one cools down meanwhile).
            gateway.logger.info(
                "gateway: server busy, trying the next",
                metadata: ["route": "\(target.routeID)", "status": "\(head.status)"])
        case .respond(let refusal):
            gateway.metrics.gatewayFailures.increment()
            // Counted in the traffic figures as the client saw it: an error of the route's.
            switch refusal {
            case .notTheServer:
                gateway.agent.traffic.answered(
                    model: request.model, via: target.via, status: 502, firstByte: nil, answered: false)
            case .busy(let status, _):
                gateway.agent.traffic.answered(
                    model: request.model, via: target.via, status: status, firstByte: nil, answered: true)
            default:
                break
            }
        default:
            break
        }
        perform(action, .answerHead(head, relayed: relayed))
    }

    /// Passes the answer's head on to the client (``GatewayExchange/Action/passAnswer(hold:)``):
    /// the server's headers the rules keep, the framing promised to this client, ours.
    func passAnswer(_ head: UpstreamAnswerHead, relayed: Bool) {
        guard let client, let upstream = connection else { return }
        let target = request.target
        let read = head.read
        if (200..<300).contains(head.status), let instance = target.instanceID {
            if let made = request.madeByRequest { gateway.affinity.record(made, on: instance, user: peer.uid) }
            // An answer that names what the request made (a run's id): read as it passes.
            if request.answerMakes, read.json, let length = read.contentLength, length <= Gateway.madeAnswerLimit {
                request.madeAnswer = []
                request.madeAnswer?.reserveCapacity(length)
            }
        }
        if relayed {
            let relay = EventRelay()
            if request.machine.resumable { relay.makeResumable() }
            request.relay = relay
            watchState()
        }
        let series = TrafficTap(traffic: gateway.agent.traffic, model: request.model, started: request.started)
            .answered(target.via, status: head.status, stream: relayed, recent: state.recentTraffic)
        request.traffic = series
        state.recentTraffic = series
        upstream.keepFor = .seconds(Int64(read.keepAlive.seconds))
        // One framing per answer, kept on every path: a relayed stream may get the gateway's
        // error event or another answer's events after its own, so the client is promised
        // no length for it (chunked, or to HTTP/1.0 the connection's close), whatever the
        // server's length said.
        let length = relayed ? nil : read.contentLength
        let connectionListed = read.connectionListed
        request.keepAlive = request.head.keepAlive
        // GatewayPolicy.downstreamHeaders, one header at a time, copied from the server's
        // bytes straight into the head's (the names and values read strictly by
        // ``UpstreamResponseParser``: tokens, no line breaks or control characters; and ours).
        let bytes = head.bytes.withUnsafeReadableBytes { raw in
            // (Room for a small body, or a stream's first events: gathered after the head,
            // in the same buffer; growing it cost about 1,000 instructions.)
            client.answerHead(
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
                out.add(GatewayConnectionHandler.securityHeaderLines)
                out.header("X-LMX-Via", target.via.rawValue)
            }
        }
        // An answer that comes before the client has sent its whole body (a server that
        // answers without reading it) is held until the body has come, as nginx does: many
        // clients cannot read an answer while they are still writing. Bounded.
        emit(.head(bytes))
    }

    /// The largest answer held while the client is still sending its body; past it, the answer
    /// goes as it comes.
    static let maxHeldAnswer = 1 << 20

    /// Writes a part of the answer to the client, or holds it (``GatewayExchange/holdsAnswer``).
    func emit(_ part: ClientOutput) {
        guard let client, client.context != nil else { return }
        if request.machine.holdsAnswer {
            request.held.hold(part)
            if request.held.bodyBytes <= Self.maxHeldAnswer { return }
            request.machine.answerReleased()
            releaseHeldAnswer()
            return
        }
        client.writeToClient(part, for: request)
    }

    /// Writes what was held of the answer, and holds no more.
    func releaseHeldAnswer() {
        guard !request.held.isEmpty, !request.machine.holdsAnswer, let client, client.context != nil else {
            return
        }
        for part in request.held.take() { client.writeToClient(part, for: request) }
        client.flushToClient()
    }

    /// The gateway's own answer (``GatewayExchange/Refusal/answer``), in the OpenAI error shape,
    /// written as bytes like forwarded answers (SwiftNIO's encoder sees only the general path's);
    /// then the exchange finishes.
    func respond(_ refusal: GatewayExchange.Refusal) {
        guard let client, client.context != nil else { return }
        let (status, code, message, retryAfter) = refusal.answer
        let body = ByteBuffer(
            bytes: Gateway.errorBody(status: status, code: code, message: message, path: request.path))
        request.keepAlive = request.head.keepAlive && request.clientEnded && !request.machine.answerCloses
        // Nothing of a held answer reached the client: the refusal replaces it.
        _ = request.held.take()
        let head = client.answerHead(request, status: .init(statusCode: status), sized: true) { out in
            out.add("Content-Type: application/json\r\nCache-Control: no-store\r\n")
            if let retryAfter {
                out.add("Retry-After: ")
                out.add(decimal: retryAfter)
                out.add("\r\n")
            }
            out.add(GatewayConnectionHandler.securityHeaderLines)
            out.add("Content-Length: ")
            out.add(decimal: body.readableBytes)
            out.add("\r\n")
        }
        client.writeToClient(.head(head), for: request)
        if request.head.method != .HEAD { client.writeToClient(.body(body), for: request) }
        client.writeToClient(.end, for: request)
        client.flushToClient()
        perform(request.machine.responded())
    }

    /// The upstream connection closed or failed while this request held it: the exchange says
    /// what that means where it stands (a failure before the answer, a stream to resume or end,
    /// an answer cut).
    func upstreamClosed(_ error: (any Error)?) {
        guard connection != nil else { return }
        let detail = error.map { Prober.classify($0).detail } ?? "the server closed the connection"
        let beforeAnswer = request.phase == .connecting || request.phase == .forwarding
        let target = request.target
        if beforeAnswer {
            request.leaveRoute()
            detach()?.channel.close(promise: nil)
        }
        let action = request.machine.upstreamClosed(detail: detail)
        if beforeAnswer {
            // (As any failure before the answer: ``failed(detail:error:certainlyNotSent:)``.)
            reportFailure(action, target: target, detail: detail, error: error)
            return perform(action)
        }
        switch action {
        case .streamLost, .resume:
            break
        default:
            // An answer cut in the middle: the client gets what came, then sees its connection
            // close, as from the server.
            request.machine.answerReleased()
            releaseHeldAnswer()
            client?.flushToClient()
        }
        perform(action, .upstreamGone(error: error, detail: detail))
    }

    /// A stream of events lost mid-answer: ended with an `error` event naming the route, and the
    /// agent probes it again.
    func streamLost(error: any Error) {
        guard let client, client.context != nil else { return }
        let target = request.target
        guard let relay = request.relay else {
            // Nothing of the gateway's can be written into this answer: the client sees its
            // connection close short of the answer's end, as from the server.
            return finish(upstream: .close, client: .close)
        }
        detach()?.channel.close(promise: nil)
        emit(.body(relay.lost(target: target, error: error)))
        emit(.end)
        client.flushToClient()
        if let series = request.traffic {
            TrafficTap(traffic: gateway.agent.traffic, model: request.model, started: request.started)
                .streamed(series: series, relay.tally)
        }
        let manager = gateway.agent.manager
        let routeID = target.routeID
        Task { await manager.gatewayFailed(routeID, reason: "a stream was cut mid-answer") }
        perform(request.machine.streamEnded())
    }
}
