import AsyncHTTPClient
import Hummingbird
import HummingbirdCore
import LMXCore
import LMXProbe
import LMXSystem
import NIOCore
import NIOHTTP1
import Synchronization

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

extension Gateway {
    func forward(_ request: Request, context: AgentRequestContext) async -> Response {
        if let resource = DashboardPolicy.resource(path: request.uri.path) {
            return await dashboard.respond(
                resource, request: request, context: context, localhostIsOurs: listeners.localhostIsOurs)
        }
        let method = request.method.rawValue
        let clientHeaders = request.headers.map { (name: $0.name.canonicalName, value: $0.value) }
        if let refusal = GatewayPolicy.refusal(
            method: method, path: request.uri.path, authority: request.head.authority, headers: clientHeaders,
            adminEnabled: configuration.admin, overTCP: context.isTCP, localhostIsOurs: listeners.localhostIsOurs)
        {
            metrics.gatewayRefused.increment()
            return Self.error(refusal.status, code: refusal.code, message: refusal.message)
        }
        // Who is asking, when it matters: the group gate, and a body read ahead (its share of
        // the read-ahead budget is per user).
        let hasBody = !["GET", "HEAD", "OPTIONS", "DELETE"].contains(method) || request.headers[.contentLength] != nil
        let uid: UInt32? =
            groupGate != nil || hasBody || ServerAffinity.mayConcern(path: request.uri.path)
            ? await context.peerUID() : nil
        if let groupGate {
            let allowed = uid.flatMap(groupGate.allows)
            if uid != nil, allowed == nil {
                logger.warning(
                    "gateway.group: no group named \(groupGate.group) any more; only root and the agent's user are served"
                )
            }
            guard allowed == true else {
                metrics.gatewayRefused.increment()
                return Self.error(
                    403, code: "forbidden",
                    message: "only members of the group \(configuration.group ?? "") may use this gateway")
            }
        }
        let tooLarge = Self.error(
            413, code: "request_too_large",
            message: GatewayExchange.Refusal.tooLarge(limit: configuration.maxRequestBytes).answer.message)
        if let declared = request.headers[.contentLength].flatMap(OutsideInput.contentLength),
            declared > configuration.maxRequestBytes
        {
            metrics.gatewayRefused.increment()
            return tooLarge
        }
        // Read ahead: up to `read_ahead_bytes`, within the budget all requests share. A body
        // that ends within it can be sent again (a busy server, a route gone before answering);
        // a longer one streams through as it comes (still capped), to the best route only.
        var iterator = request.body.makeAsyncIterator()
        var prefix: [ByteBuffer] = []
        var prefixBytes = 0
        var ended = false
        let reservation = readAhead.reservation(for: uid)
        defer { withExtendedLifetime(reservation) {} }  // held until the answer's head is in
        do {
            while prefixBytes < configuration.readAheadBytes {
                guard let chunk = try await iterator.next() else {
                    ended = true
                    break
                }
                prefixBytes += chunk.readableBytes
                prefix.append(chunk)
                if !reservation.take(chunk.readableBytes) { break }  // the budget is spent: stream the rest
            }
        } catch {
            return Self.error(400, code: "bad_request", message: "the request body could not be read")
        }
        if prefixBytes > configuration.maxRequestBytes {
            metrics.gatewayRefused.increment()
            return tooLarge
        }
        var body = ByteBuffer()
        var streamed: StreamedBody?
        if ended {
            for var chunk in prefix { body.writeBuffer(&chunk) }
        } else {
            streamed = StreamedBody(
                prefix: prefix, rest: UnsafeSendableIterator(iterator), limit: configuration.maxRequestBytes)
        }
        // Routed by the JSON `model` field, like the server itself: to a server that has it.
        // One contiguous copy of what was read ahead (memcpy per chunk), scanned once.
        var model: String?
        var bytes: [UInt8] = []
        if method == "POST" {
            bytes.reserveCapacity(prefixBytes)
            for chunk in prefix { bytes.append(contentsOf: chunk.readableBytesView) }
            if let ambiguous = JSONBodyKeys.ambiguous(in: bytes) {
                metrics.gatewayRefused.increment()
                return Self.error(400, code: "ambiguous_body", message: Self.ambiguousBodyMessage(key: ambiguous))
            }
            model = ModelField.find(in: bytes)
        }
        // An object that lives on one server (an agent run, a RAG collection, a stored response)
        // is asked of that server only, by whichever route reaches it now.
        let path = request.uri.path
        let named = ServerAffinity.named(method: method, path: path, body: bytes)
        let owner = named.flatMap { object in
            affinity.owner(of: object, user: uid).map { (instance: $0, object: object) }
        }
        let madeByRequest = ServerAffinity.madeByRequest(method: method, path: path, body: bytes)
        let answerMakes = ServerAffinity.answerMakes(method: method, path: path)
        let clientHasKey = GatewayPolicy.clientHasKey(clientHeaders)
        var targets: [GatewayTarget]
        switch await plan(model: model, clientHasKey: clientHasKey, server: owner) {
        case .forward(let routes):
            targets = load.order(routes)
        case .refuse(let status, let code, let message):
            // (Not a failure when the client left while the request was held.)
            if !Task.isCancelled { metrics.gatewayFailures.increment() }
            var response = Self.error(status, code: code, message: message)
            if status == 503 { response.headers[.retryAfter] = "2" }
            return response
        }
        if streamed != nil { targets = Array(targets.prefix(1)) }
        metrics.gatewayRequests.increment()
        // Counted until the answer's body is done or dropped (a client that went away).
        let inFlight = InFlightToken(metrics.gatewayInFlight)
        let started = SystemClock.monotonic()
        var lastFailure = ""
        var lastBusy: (status: HTTPResponseStatus, headers: HTTPHeaders, body: ByteBuffer, target: GatewayTarget)?
        for (index, target) in targets.enumerated() {
            if index > 0 { metrics.gatewayRetries.increment() }
            var outgoing = Self.upstreamRequest(
                target: target, method: method, uri: request.uri, headers: clientHeaders, body: body)
            if let streamed {
                let length = request.headers[.contentLength].flatMap(OutsideInput.contentLength)
                outgoing.body = .stream(streamed, length: length.map { .known(Int64($0)) } ?? .unknown)
            }
            let routeToken = load.started(target.routeKey)
            // The client's connection pool stays open until the answer has streamed through.
            let lease = (target.via == .lan ? lanClient : wanClient).lease(server: target.baseURL)
            do {
                // No overall deadline: a long generation is normal; the client decides when to
                // give up (closing its connection cancels the upstream request).
                var upstream = try await lease.client.execute(outgoing, timeout: .hours(24))
                if (200..<300).contains(upstream.status.code), let instance = target.instanceID {
                    if let madeByRequest { affinity.record(madeByRequest, on: instance, user: uid) }
                    if answerMakes {
                        upstream = await learnMade(from: upstream, path: path, instance: instance, user: uid)
                    }
                }
                // All slots busy (429) or overloaded (503): before any byte reached the client,
                // another server with the model may take it; the busy one cools down meanwhile.
                if let cooldown = RouteLoad.busyCooldown(upstream, cap: configuration.busyCooldownMax) {
                    load.coolDown(target.routeKey, seconds: cooldown)
                    if RetryRule.decide(
                        .busy, method: method, bodyWhole: streamed == nil, attempt: index, routes: targets.count,
                        resentOnNewConnection: false) == .nextRoute
                    {
                        logger.info(
                            "gateway: server busy, trying the next",
                            metadata: ["route": "\(target.routeID)", "status": "\(upstream.status.code)"])
                        let answer = (try? await upstream.body.collect(upTo: 1 << 20)) ?? ByteBuffer()
                        lastBusy = (upstream.status, upstream.headers, answer, target)
                        continue
                    }
                }
                return Self.passThrough(
                    upstream, target: target, holding: [inFlight, routeToken, lease],
                    requestBody: streamed.map { ($0.rest, context.channel) },
                    traffic: TrafficTap(traffic: agent.traffic, model: model, started: started)
                ) { [agent] routeID in
                    await agent.manager.gatewayFailed(routeID, reason: "a stream was cut mid-answer")
                }
            } catch {
                if error is RequestBodyTooLarge {
                    metrics.gatewayRefused.increment()
                    return tooLarge
                }
                if let error = error as? HTTPClientError, error == .getConnectionFromPoolTimeout {
                    // Waiting for one of our own connections is not the route's failure.
                    lastFailure = "every connection to the route is busy (gateway.max_connections_per_route)"
                    continue
                }
                let failure = Prober.classify(error)
                lastFailure = failure.detail
                await agent.manager.gatewayFailed(target.routeID, reason: failure.detail)
                let next = RetryRule.decide(
                    Self.certainlyNotSent(error, failure) ? .notSent : .failedBeforeAnswer, method: method,
                    bodyWhole: streamed == nil, attempt: index, routes: targets.count, resentOnNewConnection: false)
                logger.notice(
                    "gateway: route failed before answering",
                    metadata: [
                        "route": "\(target.routeID)", "reason": "\(failure.detail)", "retry": "\(next == .nextRoute)",
                    ])
                if next != .nextRoute { break }
            }
        }
        if let busy = lastBusy {
            // Every other candidate failed too: the client sees the busy server's own answer.
            var headers = Self.secured(Self.fields(busy.headers) ?? HTTPFields())
            if let via = HTTPFields.Element.Name("X-LMX-Via") { headers[via] = busy.target.via.rawValue }
            return Response(
                status: HTTPResponse.Status(code: Int(busy.status.code)), headers: headers,
                body: .init(byteBuffer: busy.body))
        }
        metrics.gatewayFailures.increment()
        if let last = targets.last {
            agent.traffic.answered(model: model, via: last.via, status: 502, firstByte: nil, answered: false)
        }
        return Self.error(
            502, code: "upstream_unreachable",
            message: "the Opta LMX server could not be reached (\(lastFailure)); the agent is probing it again")
    }

    /// The routes for a request; while none is usable (mid-failover, just after resume), waits
    /// up to `gateway.hold_seconds` for one before answering 503 with why.
    /// `server`: the server the request must reach, and the object of its that the request names.
    func plan(model: String?, clientHasKey: Bool, server: (instance: String, object: ServerObject)? = nil) async
        -> GatewayPlan
    {
        let deadline = ContinuousClock.now + .milliseconds(Int64(configuration.holdSeconds * 1000))
        var nextNudge = ContinuousClock.now
        while true {
            let snapshot = agent.board.snapshot
            let plan = snapshot.gatewayPlan(
                limit: configuration.attempts, model: model, clientHasKey: clientHasKey, server: server?.instance)
            if case .forward(let routes) = plan, routes.isEmpty {
                if ContinuousClock.now < deadline, !Task.isCancelled {
                    // The agent probes everything at once when a request starts waiting, and
                    // again each second it goes on waiting.
                    if ContinuousClock.now >= nextNudge {
                        await agent.manager.gatewayWaiting()
                        nextNudge = ContinuousClock.now + .seconds(1)
                    }
                    try? await Task.sleep(for: .milliseconds(25))
                    continue
                }
                if let server {
                    // Never another server: it does not have the object, and would say so with a
                    // 404 that reads as if the object did not exist.
                    return .refuse(
                        status: 503, code: "server_unreachable",
                        message: GatewayExchange.Refusal.serverUnreachable(
                            object: "\(server.object)",
                            server: ServerTable.printable(snapshot.serverName(server.instance)),
                            holdSeconds: configuration.holdSeconds
                        ).answer.message)
                }
                return .refuse(
                    status: 503, code: "no_endpoint",
                    message: Self.noEndpointMessage(
                        holdSeconds: configuration.holdSeconds, reason: snapshot.noActiveReason))
            }
            return plan
        }
    }

    /// Failures where the request certainly never reached the server (refused, no route to the
    /// host, name resolution, no connection made in time): safe to send elsewhere even when it is
    /// not idempotent. Never after TLS or read errors: the request may have gone.
    static func certainlyNotSent(_ error: any Error, _ failure: ProbeTransportFailure) -> Bool {
        switch failure {
        case .refused, .unreachable, .nameResolution: return true
        case .timeout:
            if let error = error as? HTTPClientError, error == .connectTimeout { return true }
            if let error = error as? ChannelError, case .connectTimeout = error { return true }
            return false
        case .tls, .reset, .other: return false
        }
    }

    /// The request as the route receives it: path and query only (an absolute-form target's
    /// scheme and authority are never forwarded), the client's headers minus hop-by-hop ones and
    /// cookies, the route's credentials.
    static func upstreamRequest(
        target: GatewayTarget, method: String, uri: URI, headers: [(name: String, value: String)], body: ByteBuffer
    ) -> HTTPClientRequest {
        var outgoing = HTTPClientRequest(url: target.baseURL + uri.path + (uri.query.map { "?" + $0 } ?? ""))
        outgoing.method = HTTPMethod(rawValue: method)
        for header in GatewayPolicy.upstreamHeaders(
            client: headers, credentials: target.credentials, path: uri.path,
            userAgent: userAgent)
        {
            outgoing.headers.add(name: header.name, value: header.value)
        }
        if body.readableBytes > 0 || !["GET", "HEAD", "OPTIONS", "DELETE"].contains(method) {
            outgoing.body = .bytes(body)
        }
        return outgoing
    }

    /// `fields` with the security headers set (replacing any of the same name).
    static func secured(_ fields: HTTPFields) -> HTTPFields {
        var fields = fields
        for (name, value) in GatewayPolicy.securityHeaders {
            if let field = HTTPFields.Element.Name(name) { fields[field] = value }
        }
        return fields
    }

    /// Why a request held for `hold_seconds` is answered 503 `no_endpoint`.
    static func noEndpointMessage(holdSeconds: Double, reason: String) -> String {
        GatewayExchange.Refusal.noEndpoint(holdSeconds: holdSeconds, reason: reason).answer.message
    }

    /// Why a body naming a key the gateway reads twice (or with escapes) is refused.
    static func ambiguousBodyMessage(key: String) -> String {
        GatewayExchange.Refusal.ambiguous(key: key).answer.message
    }

    /// What the gateway sends upstream as `User-Agent` when the client sends none.
    static let userAgent = "lmx-agent/\(StatusAPI.version)"

    /// An error in the OpenAI API's shape, so clients show the message.
    static func error(_ status: Int, code: String, message: String) -> Response {
        Response(
            status: HTTPResponse.Status(code: status),
            headers: secured([.contentType: "application/json", .cacheControl: "no-store"]),
            body: .init(byteBuffer: ByteBuffer(bytes: errorBody(code: code, message: message))))
    }

    /// The JSON of an error in the OpenAI API's shape, with a final newline.
    /// The gateway's own error in the shape the request's API reads: Anthropic's
    /// (`{"type": "error", "error": {"type": …, "message": …}}`) on `/v1/messages`, where the
    /// Anthropic SDKs read it; OpenAI's everywhere else.
    static func errorBody(status: Int, code: String, message: String, path: String) -> [UInt8] {
        guard path == "/v1/messages" || path.hasPrefix("/v1/messages/") else {
            return errorBody(code: code, message: message)
        }
        struct Body: Encodable {
            struct Detail: Encodable {
                var type: String
                var message: String
                var code: String
            }
            var type = "error"
            var error: Detail
        }
        let type =
            switch status {
            case 400: "invalid_request_error"
            case 401: "authentication_error"
            case 403: "permission_error"
            case 404: "not_found_error"
            case 413: "request_too_large"
            case 429: "rate_limit_error"
            case 503, 529: "overloaded_error"
            default: "api_error"
            }
        let body = Body(error: .init(type: type, message: message, code: code))
        var bytes = (try? StatusAPI.encoder.encode(body)).map { Array($0) } ?? Array("{}".utf8)
        bytes.append(0x0A)
        return bytes
    }

    static func errorBody(code: String, message: String) -> [UInt8] {
        struct Body: Encodable {
            struct Detail: Encodable {
                var message: String
                var type: String
                var code: String
            }
            var error: Detail
        }
        let body = Body(error: .init(message: message, type: "lmx_gateway_error", code: code))
        var bytes = (try? StatusAPI.encoder.encode(body)).map { Array($0) } ?? Array("{}".utf8)
        bytes.append(0x0A)
        return bytes
    }
}

extension Gateway {
    /// The largest answer read whole to learn the object it made (an agent run, a response):
    /// these are small JSON objects; a larger or unsized answer streams through unread.
    static let madeAnswerLimit = 1 << 20

    /// Reads a small JSON answer that made an object, records the object against `instance`, and
    /// gives the answer back whole, unchanged.
    func learnMade(
        from upstream: HTTPClientResponse, path: String, instance: String, user: UInt32?
    ) async -> HTTPClientResponse {
        let json = upstream.headers.first(name: "content-type")?.lowercased().hasPrefix("application/json") == true
        guard json, let length = upstream.headers.first(name: "content-length").flatMap(OutsideInput.contentLength),
            length <= Self.madeAnswerLimit
        else { return upstream }
        guard let answer = try? await upstream.body.collect(upTo: Self.madeAnswerLimit) else {
            // Cut while read: the client gets the same cut answer.
            return HTTPClientResponse(status: .badGateway, headers: [:], body: .bytes(ByteBuffer()))
        }
        if let made = ServerAffinity.madeByAnswer(Array(answer.readableBytesView), path: path) {
            affinity.record(made, on: instance, user: user)
        }
        return HTTPClientResponse(
            version: upstream.version, status: upstream.status, headers: upstream.headers, body: .bytes(answer))
    }
}

/// The gateway's ``AffinityTable``, shared by its requests, on the monotonic clock; per local
/// user (the uid of the client's connection).
final class ServerAffinityBook: Sendable {
    private let table = Mutex(AffinityTable())

    func record(_ object: ServerObject, on instance: String, user: UInt32?) {
        let now = SystemClock.monotonic()
        table.withLock { $0.record(object, on: instance, user: user, now: now) }
    }

    func owner(of object: ServerObject, user: UInt32?) -> String? {
        let now = SystemClock.monotonic()
        return table.withLock { $0.owner(of: object, user: user, now: now) }
    }
}
