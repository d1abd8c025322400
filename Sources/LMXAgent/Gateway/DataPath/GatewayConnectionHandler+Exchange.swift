import LMXCore
import LMXProbe
import LMXSystem
import NIOCore
import NIOHTTP1
import Prometheus

extension GatewayConnectionHandler {
    // MARK: Deciding

    /// The requests this handler forwards itself: plain `/v1/` requests with nothing that needs
    /// the general path's waits or checks (`length`: the body's, as the front read it). Its path
    /// (the target without the query) when it is one; nil for the others. (No path under `/v1/`
    /// is the dashboard's: ``DashboardPolicy/resource(path:)``.)
    func takes(_ head: ClientHead, length: Int) -> (path: String, mayConcern: Bool)? {
        guard !llhttpOnly, gateway.groupGate == nil, let path = Self.plainV1Path(head.uri) else { return nil }
        // (Most paths can concern no object: told in one pass, and the request keeps the answer.)
        let mayConcern = ServerAffinity.mayConcern(path: path)
        guard !mayConcern || !ServerAffinity.answerMakes(method: head.method.rawValue, path: path) else { return nil }
        // `Expect: 100-continue` (one, from an HTTP/1.1 client) is answered here as the request is
        // taken (``sendContinue()``), as nginx does; any other expectation goes to the general path.
        if head.contains(.expect) {
            guard head.minor == 1, head.all("expect").count == 1,
                head.first(.expect)?.lowercased() == "100-continue"
            else { return nil }
        }
        // (The rules read a few headers by name, all of them known ones: when none but Host came,
        // as from API clients, they are not looked for one by one.)
        let header: (String) -> String? = head.contains(anyOf: Self.refusalHeaderBits) ? head.first : { _ in nil }
        if GatewayPolicy.refusal(
            method: head.method.rawValue, path: path, authority: head.first(.host), header: header,
            adminEnabled: gateway.configuration.admin, overTCP: overTCP,
            localhostIsOurs: gateway.listeners.localhostIsOurs) != nil
        {
            return nil
        }
        return length <= gateway.configuration.maxRequestBytes ? (path, mayConcern) : nil
    }

    /// The headers the policy reads (``GatewayPolicy/refusalHeaders``) but Host, which it is
    /// given, as the head's bits.
    /// (Should the policy read a header that is not a known one, every request looks them up.)
    static let refusalHeaderBits = ClientHead.bits(of: GatewayPolicy.refusalHeaders.subtracting(["host"])) ?? .max

    /// The path (the target without its query) of a `/v1/` target with no percent-encoding,
    /// fragment or dot-dot anywhere (those go to the general path, which reads them as the policy
    /// does); nil for any other target. One pass over the bytes (walking `String.UTF8View` cost
    /// about 30 instructions a byte).
    static func plainV1Path(_ uri: String) -> String? {
        var uri = uri
        // Where the path ends (the query's `?`, or the end); nil: not a plain `/v1/` target.
        let end = uri.withUTF8 { bytes -> Int? in
            guard bytes.count >= 4, bytes[0] == UInt8(ascii: "/"), bytes[1] == UInt8(ascii: "v"),
                bytes[2] == UInt8(ascii: "1"), bytes[3] == UInt8(ascii: "/")
            else { return nil }
            var previousDot = false
            var query: Int?
            for index in bytes.indices {
                let byte = bytes[index]
                if byte == UInt8(ascii: "%") || byte == UInt8(ascii: "#") { return nil }
                let dot = byte == UInt8(ascii: ".")
                if dot, previousDot { return nil }
                previousDot = dot
                if byte == UInt8(ascii: "?"), query == nil { query = index }
            }
            return query ?? bytes.count
        }
        guard let end else { return nil }
        return end == uri.utf8.count ? uri : String(decoding: uri.utf8.prefix(end), as: UTF8.self)
    }

    func requestPart(_ part: ClientRequestParser.Part, of request: ForwardedRequest) {
        switch part {
        case .head, .other:
            return  // not after a head without its end
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
            if let part { request.add(part) }
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

    /// The request's server connection, no longer its (nor telling this handler of its events).
    func detachUpstream(_ request: ForwardedRequest) -> UpstreamConnection? {
        guard let connection = request.upstream else { return nil }
        connection.handler.owner = nil
        request.upstream = nil
        return connection
    }

    func decide(_ request: ForwardedRequest) {
        let method = request.head.method.rawValue
        let path = request.path
        // The body so far, as one array: only when the model is not in its first part alone (a
        // prefix with the whole field reads as the whole body does), or the path may name an
        // object whose field is read from the body.
        var joined: [UInt8]?
        func body() -> [UInt8] {
            if let joined { return joined }
            var bytes: [UInt8] = []
            bytes.reserveCapacity(request.exchange.received)
            for chunk in request.parts { bytes.append(contentsOf: chunk.readableBytesView) }
            joined = bytes
            return bytes
        }
        var model: String?
        if method == "POST", let first = request.parts.first {
            // A key the gateway reads, named twice or spelled with escapes, would be read
            // differently by the server (JSONBodyKeys): refused, never guessed.
            let ambiguous =
                request.parts.count == 1
                ? first.withUnsafeReadableBytes { JSONBodyKeys.ambiguous(in: $0) } : JSONBodyKeys.ambiguous(in: body())
            if let ambiguous {
                gateway.metrics.gatewayRefused.increment()
                return run(request.exchange.respond(.ambiguous(key: ambiguous)), for: request)
            }
            model = first.withUnsafeReadableBytes { ModelField.find(in: $0) }
            if model == nil, request.parts.count > 1 { model = ModelField.find(in: body()) }
        }
        let mayConcern = request.mayConcern
        if mayConcern, ServerAffinity.named(method: method, path: path, body: method == "POST" ? body() : []) != nil {
            return handOver(request)
        }
        request.model = model
        // (GatewayPolicy.clientKeyHeaders, looked up as literals.)
        request.clientHasKey = request.head.contains(.authorization) || request.head.contains(.xAPIKey)
        if mayConcern {
            request.madeByRequest = ServerAffinity.madeByRequest(
                method: method, path: path, body: method == "POST" ? body() : [])
        }
        route(request)
    }

    /// Plans the request's routes and sends it to the first; while no route is usable it is
    /// held (``hold(_:)``) and planned again. A refusal of the plan's (a model only untrusted
    /// servers have, a key the request needs) is worded by the general path.
    func route(_ request: ForwardedRequest) {
        let plan = state.plan(
            model: request.model, clientHasKey: request.clientHasKey, limit: gateway.configuration.attempts)
        guard case .forward(let routes) = plan else { return handOver(request) }
        if routes.isEmpty { return hold(request) }
        var targets = gateway.load.order(routes)
        if !request.clientEnded { targets = Array(targets.prefix(1)) }
        // Only routes the data path connects to, while the loop has connections to spare, and
        // whose keys can be written as they are (upstream heads are not checked again: the
        // client's headers were parsed as headers, the rest is ours).
        guard let first = targets.first, let address = state.address(first.baseURL),
            state.pool.openCount(address) < dataPath.connectionsPerLoop,
            targets.allSatisfy({ $0.credentials.isHeaderSafe })
        else { return handOver(request) }
        request.targets = targets
        request.countInFlight(gateway.metrics.gatewayInFlight)
        gateway.metrics.gatewayRequests.increment()
        _ = request.exchange.routed(routes: targets.count)
        attempt(request, fresh: false, address: address)
    }

    /// No route is usable (mid-failover, just after a wake): the request waits up to
    /// `gateway.hold_seconds` for one, planned again every 25 ms on the loop's copy of the
    /// agent's state, while the agent probes every endpoint (asked at once, then each second);
    /// then 503 with why. Reads from the client wait meanwhile; a client that leaves drops it.
    func hold(_ request: ForwardedRequest) {
        guard let context else { return }
        let now = NIODeadline.now()
        if request.phase != .waiting {
            request.exchange.hold()
            request.heldUntil = now + .milliseconds(Int64(gateway.configuration.holdSeconds * 1000))
            request.nextNudge = now
        }
        guard now < request.heldUntil else {
            gateway.metrics.gatewayFailures.increment()
            let refusal = GatewayExchange.Refusal.noEndpoint(
                holdSeconds: gateway.configuration.holdSeconds, reason: state.snapshot.noActiveReason)
            return run(request.exchange.respond(refusal), for: request)
        }
        if now >= request.nextNudge {
            request.nextNudge = now + .seconds(1)
            let manager = gateway.agent.manager
            Task { await manager.gatewayWaiting() }
        }
        context.eventLoop.assumeIsolated().scheduleTask(in: .milliseconds(25)) { [self] in
            guard self.request === request, request.phase == .waiting else { return }
            self.route(request)
        }
    }

    /// The request goes to the general path as it came: its bytes (head, the body so far) to
    /// llhttp, the rest as it arrives; then the requests read after it.
    func handOver(_ request: ForwardedRequest) {
        self.request = nil
        handOver(raw: request.head.raw, parts: request.parts, ended: request.clientEnded)
        drainQueue()
    }

    func handOver(raw: ByteBuffer, parts: [ByteBuffer], ended: Bool) {
        guard let front, ensureGeneralPath() else { return }
        // llhttp reads it (its parts come back through channelRead, to the general path).
        front.toLLHTTP(raw)
        for part in parts { front.toLLHTTP(part) }
        replaying = !ended
        endReadBatchIfFired()
    }

    /// The general path's handlers deliver what they were given when a read batch ends: parts
    /// given to them outside a read of the client's (a queued request handled once the one before
    /// it ended, a busy server's handover during its answer) get an end of their own.
    func endReadBatchIfFired() {
        guard firedRead, let context else { return }
        firedRead = false
        context.fireChannelReadComplete()
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
        request.countOnRoute(state.routeCount(target.routeKey, in: gateway.load))
        if !fresh, let connection = state.pool.takeIdle(address) {
            return send(request, over: connection, target: target, kept: true)
        }
        let timeout =
            target.via == .lan ? gateway.configuration.connectTimeout : max(gateway.configuration.connectTimeout, 8)
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
        let rule =
            listed.isEmpty && !Credentials.isOpen(path: request.path)
            ? target.inferenceRule
            : GatewayPolicy.UpstreamHeaderRule(
                connectionListed: listed, credentials: target.credentials, path: request.path)
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
            request.parts = []
        }
        handler.flush()
        resumeReadsIfHeld()
    }

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
        let body = ByteBuffer(bytes: Gateway.errorBody(code: code, message: message))
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
