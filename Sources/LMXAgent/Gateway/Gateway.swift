import AsyncHTTPClient
import Hummingbird
import HummingbirdCore
import LMXCore
import LMXProbe
import Logging
import ServiceLifecycle
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Prometheus
import Synchronization

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import LMXSystem

/// The local OpenAI-compatible gateway: forwards `/v1/*` (and `/admin/*` when enabled) to the
/// active endpoint with that route's credentials, streams answers through as they come, and
/// tries the next usable route only before any byte of an answer has reached the client.
public final class Gateway: Sendable {
    let agent: Agent
    let configuration: GatewayConfiguration
    let logger: Logger
    let metrics: AgentMetrics
    private let lanClient: HTTPClient
    private let wanClient: HTTPClient
    /// Who may use the gateway when `gateway.group` is set.
    private let groupGate: GroupMembership?

    public init(agent: Agent, configuration: GatewayConfiguration, extraCAFile: String?, logger: Logger) throws {
        self.agent = agent
        self.metrics = agent.metrics
        self.configuration = configuration
        self.logger = logger
        let tls = try HTTPClients.tls(extraCAFile: extraCAFile)
        lanClient = HTTPClients.make(tls: tls, connectTimeout: configuration.connectTimeout, idleTimeout: 60)
        wanClient = HTTPClients.make(tls: tls, connectTimeout: max(configuration.connectTimeout, 8), idleTimeout: 60)
        if let group = configuration.group {
            guard Users.groupID(named: group) != nil else {
                throw ConfigurationError("gateway.group: no group named \(group) on this machine")
            }
            groupGate = GroupMembership(group: group)
        } else {
            groupGate = nil
        }
    }

    public func shutdown() async {
        try? await lanClient.shutdown()
        try? await wanClient.shutdown()
    }

    /// The applications to run: the Unix socket always, TCP on loopback when configured.
    public func applications(socketPath: String?) -> [(name: String, app: any Service)] {
        var apps: [(String, any Service)] = []
        let responder = GatewayResponder(gateway: self)
        if let socketPath {
            let limiter = ConnectionLimiter(perUser: 64)
            let app = Application(
                responder: responder,
                // Per user, as on the status socket: one user's idle connections cannot crowd out another's.
                server: HTTPServerBuilder { responder in
                    PerUserLimitedChannel(
                        base: HTTP1Channel(responder: responder, configuration: .init(idleTimeout: .seconds(60))),
                        limiter: limiter)
                },
                configuration: .init(
                    address: .unixDomainSocket(path: socketPath), serverName: nil,
                    availableConnectionsDelegate: .maximum(2048, logger: logger)),
                onServerRunning: { [logger, group = configuration.group] _ in
                    // With a group gate the check is per request (SO_PEERCRED); the file itself
                    // stays connectable, as the status socket is.
                    FileSystem.setMode(socketPath, 0o666)
                    logger.info("gateway serving", metadata: ["socket": "\(socketPath)", "group": "\(group ?? "any local user")"])
                },
                logger: logger)
            apps.append(("gateway-socket", app))
        }
        if let listen = configuration.listen, configuration.group == nil {
            let app = Application(
                responder: responder,
                server: .http1(configuration: .init(idleTimeout: .seconds(60))),
                configuration: .init(
                    address: .hostname(listen.host, port: listen.port), serverName: nil,
                    availableConnectionsDelegate: .maximum(2048, logger: logger)),
                onServerRunning: { [logger] _ in
                    logger.info("gateway serving", metadata: ["url": "http://\(listen.description)"])
                },
                logger: logger)
            apps.append(("gateway-tcp", app))
        }
        return apps
    }

    // MARK: - Forwarding

    func forward(_ request: Request, context: AgentRequestContext) async -> Response {
        let overTCP = context.isTCP
        let method = request.method.rawValue
        let path = request.uri.path
        let clientHeaders = request.headers.map { (name: $0.name.canonicalName, value: $0.value) }
        if let refusal = GatewayPolicy.refusal(
            method: method, path: path, authority: request.head.authority, headers: clientHeaders,
            adminEnabled: configuration.admin, overTCP: overTCP)
        {
            metrics.gatewayRefused.increment()
            return Self.error(refusal.status, code: refusal.code, message: refusal.message)
        }
        if let groupGate {
            let uid = await context.peerUID()
            let allowed = uid.flatMap(groupGate.allows)
            if uid != nil, allowed == nil {
                logger.warning("gateway.group: no group named \(groupGate.group) any more; only root and the agent's user are served")
            }
            guard allowed == true else {
                metrics.gatewayRefused.increment()
                return Self.error(403, code: "forbidden", message: "only members of the group \(configuration.group ?? "") may use this gateway")
            }
        }
        let tooLarge = Self.error(
            413, code: "request_too_large", message: "request bodies are limited to \(configuration.maxRequestBytes) bytes (gateway.max_request_bytes)")
        if let declared = request.headers[.contentLength].flatMap(Int.init), declared > configuration.maxRequestBytes {
            metrics.gatewayRefused.increment()
            return tooLarge
        }
        // A body up to `bufferedBodyBytes` is read whole: such a request can be sent again to
        // another route and routed by its `model`. A larger one streams through as it comes
        // (still capped), to the best route, and is never repeated.
        var iterator = request.body.makeAsyncIterator()
        var prefix: [ByteBuffer] = []
        var prefixBytes = 0
        var ended = false
        do {
            while prefixBytes <= Self.bufferedBodyBytes {
                guard let chunk = try await iterator.next() else {
                    ended = true
                    break
                }
                prefixBytes += chunk.readableBytes
                prefix.append(chunk)
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
            streamed = StreamedBody(prefix: prefix, rest: UnsafeSendableIterator(iterator), limit: configuration.maxRequestBytes)
        }
        // Routed by the JSON `model` field, like the server itself: to a server that has it.
        let model = method == "POST" && streamed == nil ? Self.modelField(body) : nil
        let clientHasKey = clientHeaders.contains { ["authorization", "x-api-key"].contains($0.name.lowercased()) }
        var targets: [GatewayTarget]
        switch agent.board.snapshot.gatewayPlan(limit: configuration.attempts, model: model, clientHasKey: clientHasKey) {
        case .forward(let routes):
            targets = routes
        case .refuse(let status, let code, let message):
            metrics.gatewayFailures.increment()
            return Self.error(status, code: code, message: message)
        }
        if streamed != nil { targets = Array(targets.prefix(1)) }
        guard !targets.isEmpty else {
            metrics.gatewayFailures.increment()
            let reason = agent.board.snapshot.noActiveReason
            var response = Self.error(503, code: "no_endpoint", message: "no Opta LMX endpoint is usable now: \(reason)")
            response.headers[.retryAfter] = "2"
            return response
        }
        metrics.gatewayRequests.increment()
        // Counted until the answer's body is done or dropped (a client that went away).
        let inFlight = InFlightToken(metrics.gatewayInFlight)
        var lastFailure = ""
        for (index, target) in targets.enumerated() {
            if index > 0 { metrics.gatewayRetries.increment() }
            var outgoing = Self.upstreamRequest(
                target: target, method: method, uri: request.uri, headers: clientHeaders, body: body)
            if let streamed {
                let length = request.headers[.contentLength].flatMap(Int.init)
                outgoing.body = .stream(streamed, length: length.map { .known(Int64($0)) } ?? .unknown)
            }
            let client = target.via == .lan ? lanClient : wanClient
            do {
                // No overall deadline: a long generation is normal; the client decides when to
                // give up (closing its connection cancels the upstream request).
                let upstream = try await client.execute(outgoing, timeout: .hours(24))
                return Self.passThrough(upstream, target: target, holding: inFlight)
            } catch {
                if error is RequestBodyTooLarge {
                    metrics.gatewayRefused.increment()
                    return tooLarge
                }
                let failure = Prober.classify(error)
                lastFailure = failure.detail
                await agent.manager.gatewayFailed(target.routeID, reason: failure.detail)
                let canRetry = GatewayPolicy.isIdempotent(method) || Self.failedBeforeSending(error, failure)
                logger.notice(
                    "gateway: route failed before answering",
                    metadata: ["route": "\(target.routeID)", "reason": "\(failure.detail)", "retry": "\(canRetry && index + 1 < targets.count)"])
                if !canRetry { break }
            }
        }
        metrics.gatewayFailures.increment()
        return Self.error(502, code: "upstream_unreachable", message: "the Opta LMX server could not be reached (\(lastFailure)); the agent is probing it again")
    }

    /// Request bodies up to this size are read whole before forwarding (retry, routing by model).
    static let bufferedBodyBytes = 1024 * 1024

    /// The `model` of a JSON request body (OpenAI requests name it at the top level).
    static func modelField(_ body: ByteBuffer) -> String? {
        guard body.readableBytes > 0, body.readableBytes <= 4 * 1024 * 1024 else { return nil }
        struct Model: Decodable { var model: String? }
        let bytes = body.readableBytesView
        guard bytes.first(where: { $0 != 0x20 && $0 != 0x0A && $0 != 0x0D && $0 != 0x09 }) == UInt8(ascii: "{") else { return nil }
        return (try? JSONDecoder().decode(Model.self, from: Data(bytes)))?.model
    }

    /// Connection-level failures where the request cannot have reached the server: safe to send
    /// elsewhere even when it is not idempotent.
    static func failedBeforeSending(_ error: any Error, _ failure: ProbeTransportFailure) -> Bool {
        if let error = error as? HTTPClientError, error == .connectTimeout { return true }
        if let error = error as? ChannelError, case .connectTimeout = error { return true }
        if error is NIOConnectionError { return true }
        switch failure {
        case .refused, .unreachable, .nameResolution, .tls: return true
        case .reset, .timeout, .other: return false
        }
    }

    static func upstreamRequest(
        target: GatewayTarget, method: String, uri: URI, headers: [(name: String, value: String)], body: ByteBuffer
    ) -> HTTPClientRequest {
        var outgoing = HTTPClientRequest(url: target.baseURL + uri.description)
        outgoing.method = HTTPMethod(rawValue: method)
        for header in GatewayPolicy.upstreamHeaders(
            client: headers, credentials: target.credentials, path: uri.path, userAgent: "lmx-agent/\(StatusAPI.version)")
        {
            outgoing.headers.add(name: header.name, value: header.value)
        }
        if body.readableBytes > 0 || !["GET", "HEAD", "OPTIONS", "DELETE"].contains(method) {
            outgoing.body = .bytes(body)
        }
        return outgoing
    }

    /// The server's answer as it comes: status and headers, then each chunk as soon as it
    /// arrives (server-sent events are never held back).
    static func passThrough(_ upstream: HTTPClientResponse, target: GatewayTarget, holding token: InFlightToken) -> Response {
        var headers = HTTPFields()
        for (name, value) in GatewayPolicy.downstreamHeaders(upstream.headers.map { (name: $0.name, value: $0.value) }) {
            if let field = HTTPFields.Element.Name(name) { headers[values: field].append(value) }
        }
        if let via = HTTPFields.Element.Name("X-LMX-Via") { headers[via] = target.via.rawValue }
        let length = upstream.headers.first(name: "content-length").flatMap(Int.init)
        let body = upstream.body
        let response = ResponseBody(contentLength: length) { writer in
            withExtendedLifetime(token) {}
            for try await chunk in body {
                try await writer.write(chunk)
            }
            try await writer.finish(nil)
        }
        return Response(status: HTTPResponse.Status(code: Int(upstream.status.code)), headers: headers, body: response)
    }

    /// An error in the OpenAI API's shape, so clients show the message.
    static func error(_ status: Int, code: String, message: String) -> Response {
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
        return Response(
            status: HTTPResponse.Status(code: status),
            headers: [.contentType: "application/json", .cacheControl: "no-store"],
            body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
    }
}

/// A request body past its first megabyte: what was read, then the rest as the client sends it,
/// failing once it passes the cap.
struct StreamedBody: AsyncSequence, Sendable {
    typealias Element = ByteBuffer
    let prefix: [ByteBuffer]
    let rest: UnsafeSendableIterator
    let limit: Int

    struct AsyncIterator: AsyncIteratorProtocol {
        var prefix: [ByteBuffer]
        let rest: UnsafeSendableIterator
        let limit: Int
        var total = 0

        mutating func next() async throws -> ByteBuffer? {
            let chunk: ByteBuffer?
            if !prefix.isEmpty {
                chunk = prefix.removeFirst()
            } else {
                chunk = try await rest.next()
            }
            guard let chunk else { return nil }
            total += chunk.readableBytes
            if total > limit { throw RequestBodyTooLarge() }
            return chunk
        }
    }

    func makeAsyncIterator() -> AsyncIterator { AsyncIterator(prefix: prefix, rest: rest, limit: limit) }
}

struct RequestBodyTooLarge: Error {}

/// The request body's iterator, handed to the HTTP client that reads it from one task at a time
/// (the body is consumed once, in order).
final class UnsafeSendableIterator: @unchecked Sendable {
    private var iterator: RequestBody.AsyncIterator

    init(_ iterator: RequestBody.AsyncIterator) { self.iterator = iterator }

    func next() async throws -> ByteBuffer? { try await iterator.next() }
}

/// One request in flight, for the gauge: released with the answer's body (or with the request
/// when no answer is passed on).
final class InFlightToken: Sendable {
    let gauge: Gauge

    init(_ gauge: Gauge) {
        self.gauge = gauge
        gauge.increment()
    }

    deinit { gauge.decrement() }
}

struct GatewayResponder: HTTPResponder {
    typealias Context = AgentRequestContext
    let gateway: Gateway

    func respond(to request: Request, context: AgentRequestContext) async throws -> Response {
        await gateway.forward(request, context: context)
    }
}

extension AgentRequestContext {
    /// Came in over TCP (the loopback listener), not the Unix socket.
    var isTCP: Bool {
        switch channel.localAddress {
        case .v4, .v6: true
        default: false
        }
    }
}
