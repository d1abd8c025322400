import LMXCore
import LMXProbe
import LMXSystem
import NIOCore
import NIOHTTP1
import Prometheus

extension GatewayConnectionHandler {
    // MARK: Deciding

    /// What becomes of a request whose head came: every request but the dashboard's is forwarded
    /// or refused here (the policy says which: `/v1/`, and `/admin/` with `gateway.admin`, are
    /// forwarded); the dashboard's are answered by the general path. With
    /// `gateway.group`, a user the gate has no fresh answer for is looked up first, off the
    /// event loop (``lookUpGroup(_:uid:gate:)``).
    func takes(_ head: ClientHead, length: Int) -> Taken {
        guard let target = Self.forwardedTarget(head.uri) else { return .generalPath }
        guard case .path(let path) = target else {
            return .refuse(
                head.uri,
                .refused(
                    status: 400, code: "bad_target",
                    message: "a request target carries no fragment (#...): send the path and query alone"))
        }
        if let gate = gateway.groupGate {
            let member: Bool
            if let uid = peer.uid {
                guard let known = groupMember(uid, gate) else { return .lookUpGroup(uid, gate) }
                member = known
            } else {
                member = false
            }
            if !member {
                return .refuse(
                    path,
                    .refused(
                        status: 403, code: "forbidden",
                        message: "only members of the group \(gate.group) may use this gateway"))
            }
        }
        // (Most paths can concern no object: told in one pass.)
        let mayConcern = ServerAffinity.mayConcern(path: path)
        // (The rules read a few headers by name, all of them known ones: when none but Host came,
        // as from API clients, they are not looked for one by one.)
        let header: (String) -> String? = head.contains(anyOf: Self.refusalHeaderBits) ? head.first : { _ in nil }
        if let refusal = GatewayPolicy.refusal(
            method: head.method.rawValue, path: path, authority: head.first(.host), header: header,
            adminEnabled: gateway.configuration.admin, overTCP: overTCP,
            localhostIsOurs: gateway.listeners.localhostIsOurs)
        {
            return .refuse(path, .refused(status: refusal.status, code: refusal.code, message: refusal.message))
        }
        guard length <= gateway.configuration.maxRequestBytes else {
            return .refuse(path, .tooLarge(limit: gateway.configuration.maxRequestBytes))
        }
        return .forward(path, mayConcern: mayConcern)
    }

    /// What becomes of a request whose head came (``takes(_:length:)``).
    enum Taken {
        /// Forwarded by this handler.
        case forward(String, mayConcern: Bool)
        /// Refused by this handler, in the policy's words.
        case refuse(String, GatewayExchange.Refusal)
        /// `gateway.group`: the user's membership must be looked up before the request is taken.
        case lookUpGroup(UInt32, GroupMembership)
        /// Answered by the general path: the dashboard's.
        case generalPath
    }

    /// What the client's `Expect` asks (HTTP/1.0 clients' are ignored, as RFC 9110 says).
    enum Expectation { case none, continue100, unmet }

    static func expectation(_ head: ClientHead) -> Expectation {
        guard head.contains(.expect), head.minor == 1 else { return .none }
        let all = head.all("expect")
        return all.count == 1 && all[0].value.lowercased() == "100-continue" ? .continue100 : .unmet
    }

    /// The headers the policy reads (``GatewayPolicy/refusalHeaders``) but Host, which it is
    /// given, as the head's bits.
    /// (Should the policy read a header that is not a known one, every request looks them up.)
    static let refusalHeaderBits = ClientHead.bits(of: GatewayPolicy.refusalHeaders.subtracting(["host"])) ?? .max

    /// A target the data path takes: its path (the target without its query), or one that
    /// carries a fragment (refused).
    enum ForwardedTarget: Equatable {
        case path(String)
        case fragment
    }

    /// The path of a target (the target without its query), or `.fragment` for one that
    /// carries a fragment; nil for the dashboard's (``DashboardPolicy/resource(path:)``), which
    /// the general path answers. Every other target is the data path's, to forward or refuse:
    /// what the path may hold (dot segments, encoded separators, a path outside `/v1/`, `/admin/`
    /// while `gateway.admin` is off) is the policy's to say
    /// (``GatewayPolicy/refusal(method:path:authority:header:adminEnabled:overTCP:localhostIsOurs:)``).
    /// One pass over the bytes (walking `String.UTF8View` cost about 30 instructions a byte).
    static func forwardedTarget(_ uri: String) -> ForwardedTarget? {
        var uri = uri
        // Where the path ends (the query's `?`, or the end), -1 for a fragment; and whether the
        // target is under `/v1/` (no dashboard path is).
        let (end, v1) = uri.withUTF8 { bytes -> (Int, Bool) in
            let v1 =
                bytes.count >= 4 && bytes[0] == UInt8(ascii: "/") && bytes[1] == UInt8(ascii: "v")
                && bytes[2] == UInt8(ascii: "1") && bytes[3] == UInt8(ascii: "/")
            var query: Int?
            for index in bytes.indices {
                let byte = bytes[index]
                if byte == UInt8(ascii: "#") { return (-1, v1) }
                if byte == UInt8(ascii: "?"), query == nil { query = index }
            }
            return (query ?? bytes.count, v1)
        }
        if end < 0 { return .fragment }
        let path = end == uri.utf8.count ? uri : String(decoding: uri.utf8.prefix(end), as: UTF8.self)
        if !v1, DashboardPolicy.resource(path: path) != nil { return nil }
        return .path(path)
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
                case .client: request.exchange.repeatable = true
                case .added:
                    request.addedIdempotencyKey = Self.newIdempotencyKey()
                    request.exchange.repeatable = true
                case .none: break
                }
            }
        }
        route(request)
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
    /// held (``hold(_:)``) and planned again. A refusal of the plan's (a model only untrusted
    /// servers have, a key the request needs) is answered in its words.
    func route(_ request: ForwardedRequest) {
        let plan = state.plan(
            model: request.model, clientHasKey: request.clientHasKey, server: request.server?.instance,
            limit: gateway.configuration.attempts)
        if case .refuse(let status, let code, let message) = plan {
            gateway.metrics.gatewayFailures.increment()
            let refusal = GatewayExchange.Refusal.refused(status: status, code: code, message: message)
            return run(request.exchange.respond(refusal), for: request)
        }
        guard case .forward(let routes) = plan else { return handOver(request) }
        if state.noteRequest() {
            // The first request after a quiet time: the agent is in use again.
            let manager = gateway.agent.manager
            Task { await manager.gatewayInUse() }
        }
        if routes.isEmpty { return hold(request) }
        var targets = gateway.load.order(routes)
        if !request.clientEnded { targets = Array(targets.prefix(1)) }
        // Only routes the data path connects to (not a link-local address with its interface, or
        // a URL with a path).
        guard let first = targets.first, let address = state.address(first.baseURL) else { return handOver(request) }
        // Keys are written as they are (upstream heads are not checked again: the client's
        // headers were parsed as headers, the rest is ours).
        guard targets.allSatisfy({ $0.credentials.isHeaderSafe }) else {
            let refusal = GatewayExchange.Refusal.refused(
                status: 502, code: "route_key_unusable",
                message:
                    "the key configured for this server has characters an HTTP header cannot carry; pair the server or set its key again"
            )
            return run(request.exchange.respond(refusal), for: request)
        }
        // One cap on connections to a route (gateway.max_connections_per_route, counted across
        // the loops: RouteSlots): past it the request waits for one of them to come free.
        guard state.pool.hasRoom(address, cap: gateway.configuration.maxConnectionsPerRoute) else {
            return waitForRoom(request, address: address)
        }
        request.targets = targets
        request.countInFlight(gateway.metrics.gatewayInFlight)
        gateway.metrics.gatewayRequests.increment()
        // (Each route's server: a request sent again by its key after it may have reached one
        // goes again to that server only, by its other route.)
        _ = request.exchange.routed(servers: targets.map(\.instanceID))
        attempt(request, fresh: false, address: address)
    }

    /// No route is usable (mid-failover, just after a wake): the request waits up to
    /// `gateway.hold_seconds` for one, planned again each time the loop's copy of the agent's
    /// state changes (``routesChanged()``), while the agent probes every endpoint (asked at
    /// once, then each second); then 503 with why. Reads from the client wait meanwhile; a
    /// client that leaves drops it.
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
            return run(request.exchange.respond(refusal), for: request)
        }
        if now >= request.nextNudge {
            request.nextNudge = now + .seconds(1)
            let manager = gateway.agent.manager
            Task { await manager.gatewayWaiting() }
        }
        // Woken by the next state (``routesChanged()``), or at the next nudge or the hold's end.
        watchState()
        context.eventLoop.assumeIsolated().scheduleTask(deadline: min(request.nextNudge, request.heldUntil)) {
            [self] in
            guard self.request === request, request.phase == .waiting, !request.exchange.resuming else { return }
            self.route(request)
        }
    }

    /// Every connection the loop may open to the route is in use: the request waits (reads from
    /// the client held) until one is given back or closes, for `gateway.hold_seconds` at most;
    /// then 503.
    func waitForRoom(_ request: ForwardedRequest, address: UpstreamAddress) {
        guard let context else { return }
        let now = NIODeadline.now()
        if request.phase != .waiting {
            request.exchange.hold()
            request.heldUntil = now + .milliseconds(Int64(gateway.configuration.holdSeconds * 1000))
        }
        guard now < request.heldUntil else {
            gateway.metrics.gatewayFailures.increment()
            let refusal = GatewayExchange.Refusal.connectionsFull(
                limit: gateway.configuration.maxConnectionsPerRoute, holdSeconds: gateway.configuration.holdSeconds)
            return run(request.exchange.respond(refusal), for: request)
        }
        // (Held weakly: a request whose client left is not kept by the pool's list of waiters.)
        state.pool.waitForRoom(address) { [weak self, weak request] in
            guard let self, let request, self.request === request, request.phase == .waiting else { return false }
            self.route(request)
            return true
        }
        context.eventLoop.assumeIsolated().scheduleTask(deadline: request.heldUntil) { [self] in
            guard self.request === request, request.phase == .waiting else { return }
            self.route(request)
        }
    }

    /// The request goes to the general path as it came: its bytes (head, the body so far) to
    /// llhttp, the rest as it arrives; then the requests read after it.
    func handOver(_ request: ForwardedRequest) {
        self.request = nil
        handOver(
            raw: request.head.raw, parts: request.parts, ended: request.clientEnded,
            chunked: request.exchange.declaredLength == ClientRequestParser.chunked)
        drainQueue()
    }

    func handOver(raw: ByteBuffer, parts: [ByteBuffer], ended: Bool, chunked: Bool) {
        guard let front, ensureGeneralPath() else { return }
        // llhttp reads it (its parts come back through channelRead, to the general path); a
        // chunked body framed again as chunks.
        front.toLLHTTP(raw)
        for part in parts { front.toLLHTTP(chunked ? HTTP1Bytes.chunkFramed(part) : part) }
        if ended, chunked { front.toLLHTTP(HTTP1Bytes.lastChunk) }
        life.handedToLLHTTP(ended: ended)
        replayingChunked = chunked
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
}
