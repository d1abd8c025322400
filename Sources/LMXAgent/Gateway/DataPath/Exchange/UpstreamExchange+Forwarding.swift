import LMXCore
import LMXProbe
import NIOCore
import NIOHTTP1

extension UpstreamExchange {
    // MARK: Deciding

    /// The request's body has come (or as much as is read ahead): what the routes are chosen
    /// by is read from it (the model, an object's server, a run's key), then it is routed.
    func decide() {
        let method = request.head.method.rawValue
        let path = request.path
        // The body so far, as one array: only when the model is not in its first part alone (a
        // prefix with the whole field reads as the whole body does), or the path may name an
        // object whose field is read from the body.
        var joined: [UInt8]?
        func body() -> [UInt8] {
            if let joined { return joined }
            var bytes: [UInt8] = []
            bytes.reserveCapacity(request.machine.received)
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
                return perform(request.machine.respond(.ambiguous(key: ambiguous)))
            }
            model = first.withUnsafeReadableBytes { ModelField.find(in: $0) }
            if model == nil, request.parts.count > 1 { model = ModelField.find(in: body()) }
        }
        request.model = model
        // (GatewayPolicy.clientKeyHeaders, looked up as literals.)
        request.clientHasKey = request.head.contains(.authorization) || request.head.contains(.xAPIKey)
        if request.mayConcern {
            // An object that lives on one server (an agent run, a RAG collection, a stored
            // response) is asked of that server only, by whichever route reaches it now; the
            // table is the client's user's own.
            let bytes = method == "POST" ? body() : []
            if let named = ServerAffinity.named(method: method, path: path, body: bytes),
                let owner = gateway.affinity.owner(of: named, user: peer.uid)
            {
                request.server = (owner, named)
            }
            request.madeByRequest = ServerAffinity.madeByRequest(method: method, path: path, body: bytes)
            request.answerMakes = ServerAffinity.answerMakes(method: method, path: path)
            // A run is made once, whatever happens to the connection: the server honours an
            // `Idempotency-Key` (the same key and body return the run it made), so the request
            // carries one — the client's, or 128 random bits of the gateway's — and may go again.
            // Repeatable only for a key the server will receive: one the client lists in
            // `Connection` is dropped at this hop (ours is added), an empty or doubled one is
            // passed on but honours nothing (the request goes once).
            if ServerAffinity.createsRun(method: method, path: path) {
                let listed =
                    request.head.contains(.connection)
                    ? GatewayPolicy.connectionListed(request.head.all("connection")) ?? [] : []
                switch ServerAffinity.runKey(
                    keys: request.head.all("idempotency-key").map(\.value), connectionListed: listed)
                {
                case .client: request.machine.repeatable = true
                case .added:
                    request.addedIdempotencyKey = Self.newIdempotencyKey()
                    request.machine.repeatable = true
                case .none: break
                }
            }
        }
        route()
    }

    /// 128 random bits (the system's generator: getrandom), as 32 hex digits.
    static func newIdempotencyKey() -> String {
        var generator = SystemRandomNumberGenerator()
        let high = generator.next() as UInt64
        let low = generator.next() as UInt64
        let digits = String(high, radix: 16) + "-" + String(low, radix: 16)
        return "lmx-" + digits
    }

    /// Plans the request's routes and sends it to the first; while no route is usable it is
    /// held (``hold()``) and planned again. A refusal of the plan's (a model only untrusted
    /// servers have, a key the request needs) is answered in its words.
    func route() {
        let plan = state.plan(
            model: request.model, clientHasKey: request.clientHasKey, server: request.server?.instance,
            limit: gateway.configuration.attempts)
        if case .refuse(let status, let code, let message) = plan {
            gateway.metrics.gatewayFailures.increment()
            let refusal = GatewayExchange.Refusal.refused(status: status, code: code, message: message)
            return perform(request.machine.respond(refusal))
        }
        guard case .forward(let routes) = plan else { return handOver() }
        if state.noteRequest() {
            // The first request after a quiet time: the agent is in use again.
            let manager = gateway.agent.manager
            Task { await manager.gatewayInUse() }
        }
        if routes.isEmpty { return hold() }
        var targets = gateway.load.order(routes)
        if !request.clientEnded { targets = Array(targets.prefix(1)) }
        // Only routes the data path connects to (not a link-local address with its interface, or
        // a URL with a path).
        guard let first = targets.first, let address = state.address(first.baseURL) else { return handOver() }
        // Keys are written as they are (upstream heads are not checked again: the client's
        // headers were parsed as headers, the rest is ours).
        guard targets.allSatisfy({ $0.credentials.isHeaderSafe }) else {
            let refusal = GatewayExchange.Refusal.refused(
                status: 502, code: "route_key_unusable",
                message:
                    "the key configured for this server has characters an HTTP header cannot carry; pair the server or set its key again"
            )
            return perform(request.machine.respond(refusal))
        }
        // One cap on connections to a route (gateway.max_connections_per_route, counted across
        // the loops: RouteSlots): past it the request waits for one of them to come free.
        guard state.pool.hasRoom(address, cap: gateway.configuration.maxConnectionsPerRoute) else {
            return waitForRoom(address)
        }
        wait = .none
        request.targets = targets
        request.countInFlight(gateway.metrics.gatewayInFlight)
        gateway.metrics.gatewayRequests.increment()
        // (Each route's server: a request sent again by its key after it may have reached one
        // goes again to that server only, by its other route.)
        perform(request.machine.routed(servers: targets.map(\.instanceID)))
    }

    /// The request goes to the general path as it came (the plan says the data path does not
    /// take it): the client's connection hands it over.
    func handOver() {
        unwatchState()
        wait = .none
        client?.handOver(self)
    }

    /// No route is usable (mid-failover, just after a wake): the request waits up to
    /// `gateway.hold_seconds` for one, planned again each time the loop's copy of the agent's
    /// state changes (``routesChanged()``), while the agent probes every endpoint (asked at
    /// once, then each second); then 503 with why. Reads from the client wait meanwhile; a
    /// client that leaves drops it.
    func hold() {
        guard current else { return }
        let now = NIODeadline.now()
        let until: NIODeadline
        var nudge = NIODeadline.distantPast
        switch wait {
        case .route(let held, let next):
            until = held
            nudge = next
        case .room(let held), .resume(let held, _, _, _):
            until = held
        case .none:
            request.machine.hold()
            until = now + .milliseconds(Int64(gateway.configuration.holdSeconds * 1000))
            nudge = now
        }
        guard now < until else {
            wait = .none
            gateway.metrics.gatewayFailures.increment()
            let holdSeconds = gateway.configuration.holdSeconds
            let refusal: GatewayExchange.Refusal =
                if let server = request.server {
                    // Never another server: it does not have the object, and would say so with a
                    // 404 that reads as if the object did not exist.
                    .serverUnreachable(
                        object: "\(server.object)",
                        server: ServerTable.printable(state.snapshot.serverName(server.instance)),
                        holdSeconds: holdSeconds)
                } else {
                    .noEndpoint(holdSeconds: holdSeconds, reason: state.snapshot.noActiveReason)
                }
            return perform(request.machine.respond(refusal))
        }
        if now >= nudge {
            nudge = now + .seconds(1)
            let manager = gateway.agent.manager
            Task { await manager.gatewayWaiting() }
        }
        wait = .route(until: until, nudge: nudge)
        // Woken by the next state (``routesChanged()``), or at the next nudge or the hold's end.
        watchState()
        state.loop.assumeIsolated().scheduleTask(deadline: min(nudge, until)) { [self] in
            guard self.current, case .route = self.wait, !self.request.machine.resuming else { return }
            self.route()
        }
    }

    /// Every connection the loop may open to the route is in use: the request waits (reads from
    /// the client held) until one is given back or closes, for `gateway.hold_seconds` at most;
    /// then 503.
    func waitForRoom(_ address: UpstreamAddress) {
        guard current else { return }
        let now = NIODeadline.now()
        let until: NIODeadline
        if let held = wait.until {
            until = held
        } else {
            request.machine.hold()
            until = now + .milliseconds(Int64(gateway.configuration.holdSeconds * 1000))
        }
        guard now < until else {
            wait = .none
            gateway.metrics.gatewayFailures.increment()
            let refusal = GatewayExchange.Refusal.connectionsFull(
                limit: gateway.configuration.maxConnectionsPerRoute, holdSeconds: gateway.configuration.holdSeconds)
            return perform(request.machine.respond(refusal))
        }
        wait = .room(until: until)
        // (Held weakly: a request whose client left is not kept by the pool's list of waiters.)
        state.pool.waitForRoom(address) { [weak self] in
            guard let self, self.current, self.request.phase == .waiting else { return false }
            self.route()
            return true
        }
        state.loop.assumeIsolated().scheduleTask(deadline: until) { [self] in
            guard self.current, self.request.phase == .waiting else { return }
            self.route()
        }
    }

    // MARK: Forwarding

    /// Sends the request to the route its exchange tries now, over a kept connection unless
    /// `fresh` (``GatewayExchange/Action/connect(attempt:fresh:)``).
    func connect(fresh: Bool) {
        guard current, request.machine.attempt < request.targets.count else { return }
        let target = request.target
        guard let address = state.address(target.baseURL) else {
            return failed(detail: "the route's address is not usable here", error: nil, certainlyNotSent: true)
        }
        // The next route after a failure or a busy answer: within its cap too (the first was
        // waited for: ``waitForRoom(_:)``).
        if !fresh, request.machine.attempt > 0,
            !state.pool.hasRoom(address, cap: gateway.configuration.maxConnectionsPerRoute)
        {
            return failed(
                detail: "every connection the gateway may open to the route is busy", error: nil,
                certainlyNotSent: true)
        }
        request.countOnRoute(state.routeCount(target.routeKey, in: gateway.load))
        let lan = target.via == .lan
        if !fresh, let connection = state.pool.takeIdle(address) {
            return send(over: connection, target: target, kept: true)
        }
        // A route this loop has no connection to (the first request after an idle time) is
        // checked by the connection itself: a LAN server answers a connection within
        // milliseconds, so one that does not within `quickConnect` is passed over for the next
        // route before any byte of the request is sent.
        let unproven = lan && state.pool.openCount(address) == 0
        let configured = gateway.configuration.connectTimeout
        let timeout = lan ? (unproven ? min(configured, Self.quickConnect) : configured) : max(configured, 8)
        let pool = state.pool
        // Within the route's cap where the room was looked at (the first route, ``route()``; the
        // next, above): the count is checked again and raised in one step (``RouteSlots``).
        let capped = !fresh && !request.machine.resuming
        guard
            let opening = pool.connect(
                address, timeout: .milliseconds(Int64(timeout * 1000)),
                cap: capped ? gateway.configuration.maxConnectionsPerRoute : .max)
        else {
            // Another loop took the route's last slot since: the first route is waited for,
            // the next one is a failure as above.
            request.leaveRoute()
            if request.machine.attempt == 0 { return waitForRoom(address) }
            return failed(
                detail: "every connection the gateway may open to the route is busy", error: nil,
                certainlyNotSent: true)
        }
        let serial = beginOpening()
        opening.assumeIsolated().whenComplete {
            [self] result in
            var waited = false
            if case .opening(serial) = self.link, self.current, self.request.phase == .connecting { waited = true }
            switch result {
            case .success(let channel):
                guard waited, let connection = try? pool.adopt(channel, address: address) else {
                    channel.close(promise: nil)
                    return
                }
                self.gateway.metrics.gatewayUpstreamConnections[target.via]?.increment()
                self.send(over: connection, target: target, kept: false)
            case .failure(let error):
                guard waited else { return }
                let failure = Prober.classify(error)
                self.failed(detail: failure.detail, error: error, certainlyNotSent: true)
            }
        }
    }

    /// The connect timeout to a LAN route the loop has no connection to.
    static let quickConnect = 0.3

    /// The request goes on `connection` (`kept`: one kept from an earlier answer): its head, the
    /// body read so far, its end if it came.
    func send(over connection: UpstreamConnection, target: GatewayTarget, kept: Bool) {
        attach(connection)
        request.machine.sent(onKeptConnection: kept)
        let handler = connection.handler
        // Which of the client's headers go on (``GatewayPolicy/upstreamHeaders``), decided on their
        // names' bytes. (The route's rule for `/v1/` paths, made once, when it applies: nearly
        // always. Any other path, `/admin/…` with its own key, gets the rule of its own path.)
        let listed =
            request.head.contains(.connection)
            ? GatewayPolicy.connectionListed(request.head.all("connection")) ?? [] : []
        // A stream the gateway may open again is read event by event (``EventRelay``): its server
        // is asked for it uncompressed (the client's `Accept-Encoding` replaced by `identity`).
        // Any other answer is read only if it comes uncompressed, else passed on untouched.
        let identity = request.machine.resumable
        let rule =
            listed.isEmpty && !identity && request.path.hasPrefix("/v1/") && !Credentials.isOpen(path: request.path)
            ? target.inferenceRule
            : GatewayPolicy.UpstreamHeaderRule(
                connectionListed: identity ? listed + ["accept-encoding"] : listed, credentials: target.credentials,
                path: request.path)
        // The body's framing: its length when known (all of it read, or declared), else chunked.
        let length: Int? =
            request.clientEnded
            ? (request.machine.received > 0 || !Self.bodilessMethod(request.head.method)
                ? request.machine.received : nil)
            : (request.machine.declaredLength > 0 ? request.machine.declaredLength : nil)
        handler.send(
            UpstreamRequest(
                head: request.head, authority: connection.address.authority, rule: rule, identity: identity,
                idempotencyKey: request.addedIdempotencyKey, length: length,
                chunked: !request.clientEnded && length == nil,
                // (Room for a small body too: its parts are gathered after the head, in the same buffer.)
                bodyRoom: request.machine.received <= HTTP1Bytes.gatherLimit ? request.machine.received : 0))
        for part in request.parts { handler.sendBody(part) }
        if request.clientEnded {
            handler.sendEnd()
        } else {
            // Sent on as it arrives: nothing of it is kept, and the request can never go again.
            request.dropBody()
        }
        handler.flush()
        client?.resumeReadsIfHeld()
    }

    /// Methods whose requests carry no body unless they say so (no `Content-Length: 0` added).
    static func bodilessMethod(_ method: HTTPMethod) -> Bool {
        switch method {
        case .GET, .HEAD, .OPTIONS, .DELETE: true
        default: false
        }
    }

    /// The route failed before any byte of an answer (the connection could not be made or
    /// taken): the exchange says whether it goes again (``RetryRule``) or is answered 502.
    func failed(detail: String, error: (any Error)?, certainlyNotSent: Bool) {
        let target = request.target
        request.leaveRoute()
        detach()?.channel.close(promise: nil)
        let action = request.machine.failed(certainlyNotSent: certainlyNotSent, detail: detail)
        reportFailure(action, target: target, detail: detail, error: error)
        perform(action)
    }

    /// Says how a route failed before answering, by what the exchange does next: a kept
    /// connection that closed unanswered is only logged; any other failure is the agent's to
    /// hear of, and a 502 is counted.
    func reportFailure(_ action: GatewayExchange.Action, target: GatewayTarget, detail: String, error: (any Error)?) {
        if case .connect(_, fresh: true) = action {
            // A kept connection that ended with no answer most likely closed idle as the request
            // went, which says nothing about the route.
            gateway.logger.info(
                "gateway: a kept connection closed unanswered; the request goes again on a new one",
                metadata: ["route": "\(target.routeID)", "reason": "\(detail)"])
            return
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
    }
}
