import LMXCore
import LMXProbe
import LMXSystem
import NIOCore
import NIOHTTP1
import Prometheus

extension GatewayConnectionHandler {
    func requestPart(_ part: ClientRequestParser.Part, of request: ForwardedRequest) {
        switch part {
        case .head, .other:
            return  // not after a head without its end
        case .malformed:
            bodyNotWhole(request, .malformedBody)
        case .body(let chunk):
            let size = chunk.readableBytes
            let action = request.exchange.bodyPart(size: size) {
                request.reservation(from: gateway.readAhead, for: peer).take(size)
            }
            run(action, for: request, part: chunk)
        case .end:
            run(request.exchange.bodyEnd(), for: request)
        }
    }

    /// Does what the exchange said (``GatewayExchange/Action``); `part`: the body part it was
    /// told of, if any.
    func run(_ action: GatewayExchange.Action, for request: ForwardedRequest, part: ByteBuffer? = nil) {
        switch action {
        case .none, .drop, .passAnswer:
            break  // (the answer's head is passed where it is read)
        case .keep(let thenDecide):
            if let part {
                request.add(part)
                request.countStorage(in: gateway.readAhead, for: peer)
            }
            if thenDecide { decide(request) }
        case .decide:
            decide(request)
        case .send:
            if let part { request.upstream?.handler.sendBody(part) }
        case .sendEnd:
            request.upstream?.handler.sendEnd()
            request.upstream?.handler.flush()
            releaseHeldAnswer(request)
        case .connect(let attempt, let fresh):
            let detached = detachUpstream(request)
            detached?.channel.close(promise: nil)
            request.leaveRoute()
            if attempt > 0 || fresh { gateway.metrics.gatewayRetries.increment() }
            self.attempt(request, fresh: fresh)
        case .respond(let refusal):
            respond(request, refusal)
        case .streamLost:
            streamLost(request, error: Gateway.StreamEndedMidEvent())
        case .resume:
            resumeStream(request, routeFailed: true, detail: "a stream was cut mid-answer")
        case .continueAnswer:
            break  // (where the answer's head is read)
        case .finish(let upstream, let client):
            end(request, upstream: upstream, client: client)
        }
    }

    /// The one way an exchange ends: its counts given back, the server's connection pooled or
    /// closed, the client's connection on to its next request, reading the rest of the body, or
    /// closed.
    func end(
        _ request: ForwardedRequest, upstream fate: GatewayExchange.UpstreamFate, client: GatewayExchange.ClientFate
    ) {
        request.releaseCounts()
        unwatchState()
        if let connection = detachUpstream(request) {
            if fate == .pool { state.pool.release(connection) } else { connection.channel.close(promise: nil) }
        }
        switch client {
        case .next:
            releaseHeldAnswer(request)
            finished(request)
        case .readRest:
            resumeReadsIfHeld()  // the rest of the body is read and dropped
        case .close:
            if self.request === request { self.request = nil }
            closeConnection()
        case .gone:
            if self.request === request { self.request = nil }
        }
    }

    /// Told of each change of the agent's state (``routesChanged()``) while a request waits for
    /// a route or streams an answer.
    func watchState() {
        guard !watchesState else { return }
        watchesState = true
        state.watchStreams(self)
    }

    func unwatchState() {
        guard watchesState else { return }
        watchesState = false
        state.unwatchStreams(self)
    }

    /// The request's server connection, no longer its (nor telling this handler of its events).
    func detachUpstream(_ request: ForwardedRequest) -> UpstreamConnection? {
        guard let connection = request.upstream else { return nil }
        connection.handler.owner = nil
        request.upstream = nil
        return connection
    }

    // MARK: Forwarding

    /// Sends the request to the route its exchange tries now (at `known`, when its address was
    /// just read), over a kept connection unless `fresh`.
    func attempt(_ request: ForwardedRequest, fresh: Bool, address known: UpstreamAddress? = nil) {
        guard self.request === request, request.exchange.attempt < request.targets.count else { return }
        let target = request.target
        guard let address = known ?? state.address(target.baseURL) else {
            return failed(request, detail: "the route's address is not usable here", error: nil, certainlyNotSent: true)
        }
        // The next route after a failure or a busy answer: within its cap too (the first was
        // waited for: ``waitForRoom(_:address:)``).
        if !fresh, request.exchange.attempt > 0,
            !state.pool.hasRoom(address, cap: gateway.configuration.maxConnectionsPerRoute)
        {
            return failed(
                request, detail: "every connection the gateway may open to the route is busy", error: nil,
                certainlyNotSent: true)
        }
        request.countOnRoute(state.routeCount(target.routeKey, in: gateway.load))
        let lan = target.via == .lan
        if !fresh, let connection = state.pool.takeIdle(address) {
            return send(request, over: connection, target: target, kept: true)
        }
        // A route this loop has no connection to (the first request after an idle time) is
        // checked by the connection itself: a LAN server answers a connection within
        // milliseconds, so one that does not within `quickConnect` is passed over for the next
        // route before any byte of the request is sent.
        let unproven = lan && state.pool.openCount(address) == 0
        let timeout =
            lan
            ? (unproven
                ? min(gateway.configuration.connectTimeout, Self.quickConnect) : gateway.configuration.connectTimeout)
            : max(gateway.configuration.connectTimeout, 8)
        let pool = state.pool
        let attempt = request.exchange.attempt
        pool.connect(address, timeout: .milliseconds(Int64(timeout * 1000))).assumeIsolated().whenComplete {
            [self] result in
            let current =
                self.request === request && request.exchange.attempt == attempt && request.phase == .connecting
            switch result {
            case .success(let channel):
                guard current, let connection = try? pool.adopt(channel, address: address) else {
                    channel.close(promise: nil)
                    return
                }
                self.gateway.metrics.gatewayUpstreamConnections[target.via]?.increment()
                self.send(request, over: connection, target: target, kept: false)
            case .failure(let error):
                guard current else { return }
                let failure = Prober.classify(error)
                self.failed(request, detail: failure.detail, error: error, certainlyNotSent: true)
            }
        }
    }

    func send(_ request: ForwardedRequest, over connection: UpstreamConnection, target: GatewayTarget, kept: Bool) {
        request.upstream = connection
        request.exchange.sent(onKeptConnection: kept)
        connection.handler.owner = self
        // The request's head written straight into bytes: the names are the client's (read as
        // tokens, their values as visible ASCII by ``ClientRequestParser``), the route's (checked
        // by `isHeaderSafe` before the request was taken) and ours.
        let handler = connection.handler
        // Which of the client's headers go on (``GatewayPolicy/upstreamHeaders``), decided on their
        // names' bytes; the kept lines are copied from the client's bytes.
        // (The route's rule for `/v1/` paths, made once, when it applies: nearly always.)
        let listed =
            request.head.contains(.connection)
            ? GatewayPolicy.connectionListed(request.head.all("connection")) ?? [] : []
        // A stream the gateway may open again is read event by event (``EventRelay``): its server
        // is asked for it uncompressed (the client's `Accept-Encoding` replaced by `identity`).
        // Any other answer is read only if it comes uncompressed, else passed on untouched.
        let identity = request.exchange.resumable
        let rule =
            listed.isEmpty && !identity && !Credentials.isOpen(path: request.path)
            ? target.inferenceRule
            : GatewayPolicy.UpstreamHeaderRule(
                connectionListed: identity ? listed + ["accept-encoding"] : listed, credentials: target.credentials,
                path: request.path)
        // The body's framing: its length when known (all of it read, or declared), else chunked.
        let length: Int? =
            request.clientEnded
            ? (request.exchange.received > 0 || !Self.bodilessMethod(request.head.method)
                ? request.exchange.received : nil)
            : (request.exchange.declaredLength > 0 ? request.exchange.declaredLength : nil)
        let chunked = !request.clientEnded && length == nil
        // (Room for a small body too: its parts are gathered after the head, in the same buffer.)
        let body = request.exchange.received <= HTTP1Bytes.gatherLimit ? request.exchange.received : 0
        let bytes = HeadLines.make(
            context?.channel.allocator ?? ByteBufferAllocator(), estimate: request.head.raw.readableBytes + 512 + body
        ) { out in
            out.add(request.head.method.rawValue)
            out.add(" ")
            out.add(request.head.uri)
            out.add(" HTTP/1.1\r\nHost: ")
            out.add(connection.address.authority)
            out.add("\r\n")
            out.clientHeaders(request.head, keeping: rule, userAgent: Gateway.userAgent)
            if identity { out.add("Accept-Encoding: identity\r\n") }
            if let key = request.addedIdempotencyKey {
                out.add("Idempotency-Key: ")
                out.add(key)
                out.add("\r\n")
            }
            if let length {
                out.add("Content-Length: ")
                out.add(decimal: length)
                out.add("\r\n")
            } else if chunked {
                out.add("Transfer-Encoding: chunked\r\n")
            }
            out.add("\r\n")
        }
        // (Let go of here: the body parts that follow are added to the same buffer, which must be
        // held by nothing else, or the first of them copies it.)
        handler.sendHead(consume bytes, toHEAD: request.head.method == .HEAD, chunkedBody: chunked)
        for part in request.parts { handler.sendBody(part) }
        if request.clientEnded {
            handler.sendEnd()
        } else {
            // Sent on as it arrives: nothing of it is kept, and the request can never go again.
            request.dropBody()
        }
        handler.flush()
        resumeReadsIfHeld()
    }

    /// The connect timeout to a LAN route the loop has no connection to.
    static let quickConnect = 0.3

    /// Methods whose requests carry no body unless they say so (no `Content-Length: 0` added).
    static func bodilessMethod(_ method: HTTPMethod) -> Bool {
        switch method {
        case .GET, .HEAD, .OPTIONS, .DELETE: true
        default: false
        }
    }

    /// The route failed before any byte of an answer: the exchange says whether it goes again
    /// (``RetryRule``) or is answered 502.
    func failed(_ request: ForwardedRequest, detail: String, error: (any Error)?, certainlyNotSent: Bool) {
        let target = request.target
        request.leaveRoute()
        detachUpstream(request)?.channel.close(promise: nil)
        let action = request.exchange.failed(certainlyNotSent: certainlyNotSent, detail: detail)
        if case .connect(_, fresh: true) = action {
            // A kept connection that ended with no answer most likely closed idle as the request
            // went, which says nothing about the route.
            gateway.logger.info(
                "gateway: a kept connection closed unanswered; the request goes again on a new one",
                metadata: ["route": "\(target.routeID)", "reason": "\(detail)"])
            return run(action, for: request)
        }
        let manager = gateway.agent.manager
        let routeID = target.routeID
        Task { await manager.gatewayFailed(routeID, reason: detail) }
        var retry = false
        if case .connect = action { retry = true }
        gateway.logger.notice(
            "gateway: route failed before answering",
            metadata: [
                "route": "\(routeID)", "reason": "\(detail)", "retry": "\(retry)",
                // The system call and errno behind the summary (no request data in it).
                "error": "\(error.map { String(String(describing: $0).prefix(300)) } ?? "-")",
            ])
        if case .respond = action {
            gateway.metrics.gatewayFailures.increment()
            gateway.agent.traffic.answered(
                model: request.model, via: target.via, status: 502, firstByte: nil, answered: false)
        }
        run(action, for: request)
    }

    /// The gateway's own answer (``GatewayExchange/Refusal/answer``), in the OpenAI error shape,
    /// written as bytes like forwarded answers (SwiftNIO's encoder sees only the general path's);
    /// then the exchange finishes.
    func respond(_ request: ForwardedRequest, _ refusal: GatewayExchange.Refusal) {
        guard context != nil else { return }
        let (status, code, message, retryAfter) = refusal.answer
        let body = ByteBuffer(
            bytes: Gateway.errorBody(status: status, code: code, message: message, path: request.path))
        request.keepAlive = request.head.keepAlive && request.clientEnded
        // Nothing of a held answer reached the client: the refusal replaces it.
        request.heldAnswer = []
        request.heldBytes = 0
        let head = answerHead(request, status: .init(statusCode: status), sized: true) { out in
            out.add("Content-Type: application/json\r\nCache-Control: no-store\r\n")
            if let retryAfter {
                out.add("Retry-After: ")
                out.add(decimal: retryAfter)
                out.add("\r\n")
            }
            out.add(Self.securityHeaderLines)
            out.add("Content-Length: ")
            out.add(decimal: body.readableBytes)
            out.add("\r\n")
        }
        writeToClient(.head(head), for: request)
        if request.head.method != .HEAD { writeToClient(.body(body), for: request) }
        writeToClient(.end, for: request)
        flushToClient()
        run(request.exchange.responded(), for: request)
    }

    /// The request's body will not reach the server whole (too large, cut, stalled).
    func bodyNotWhole(_ request: ForwardedRequest, _ refusal: GatewayExchange.Refusal) {
        if case .tooLarge = refusal { gateway.metrics.gatewayRefused.increment() }
        run(request.exchange.bodyNotWhole(refusal), for: request)
    }
}
