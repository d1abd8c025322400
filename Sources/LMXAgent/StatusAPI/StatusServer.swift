import Hummingbird
import HummingbirdCore
import LMXCore
import LMXSystem
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The status API over the agent's Unix socket: JSON under `/v1`, NDJSON for `/v1/watch`,
/// Prometheus text at `/metrics`. Read endpoints answer any local user; `POST /v1/refresh`
/// answers only root and the daemon's own user.
public enum StatusServer {
    /// Seconds one write to a `/v1/watch` client may wait before the client is dropped.
    static let watchWriteTimeout: Double = 10

    static let jsonHeaders: HTTPFields = [.contentType: "application/json", .cacheControl: "no-store"]

    /// Who is asking: the peer's user id (the kernel's `SO_PEERCRED` on the socket).
    public typealias PeerIdentity = @Sendable (AgentRequestContext) async -> UInt32?

    public static func router(agent: Agent, peer: @escaping PeerIdentity = { await $0.peerUID() }) -> Router<
        AgentRequestContext
    > {
        let router = Router(context: AgentRequestContext.self)
        router.addMiddleware { ErrorShapeMiddleware() }
        let board = agent.board

        /// Changing requests answer only root and the daemon's own user.
        @Sendable func forbidden(_ context: AgentRequestContext, _ what: String) async -> Response? {
            if let uid = await peer(context), Users.isAdministrator(uid) { return nil }
            return json(
                StatusAPI.ErrorBody(error: "forbidden", reason: "only root or the agent's own user may \(what)"),
                status: .forbidden)
        }

        router.get("/v1/active") { _, _ -> Response in
            // Never a dead route handed out: one not proved alive within the last second is
            // checked first (a quick connection; on the LAN well under 300 ms).
            await agent.manager.ensureFreshActive()
            let snapshot = board.snapshot
            if let active = snapshot.activeEndpoint(now: board.now()) { return json(active) }
            return json(
                StatusAPI.ErrorBody(error: "no-active-endpoint", reason: snapshot.noActiveReason),
                status: .serviceUnavailable)
        }
        // Large answers: a few at a time per user (the rest get 429 and retry), here and on the
        // dashboard together.
        let gate = agent.largeAnswers
        @Sendable func large(_ context: AgentRequestContext, _ build: () -> Response) async -> Response {
            await gate.run(for: await peer(context)) { build() } ?? LargeAnswerGate.busy()
        }
        router.get("/v1/status") { _, context in
            await large(context) {
                var status = board.snapshot.status(seq: agent.watch.seq, now: board.now())
                if status.gateway != nil { status.traffic = agent.traffic.report().models }
                return json(status)
            }
        }
        router.get("/v1/resolve") { request, _ -> Response in
            guard let model = request.uri.queryParameters.get("model"), !model.isEmpty, model.utf8.count <= 256 else {
                return json(
                    StatusAPI.ErrorBody(error: "bad-request", reason: "give the model: /v1/resolve?model=NAME"),
                    status: .badRequest)
            }
            let resolved = board.snapshot.resolve(model: model, now: board.now())
            return json(resolved, status: resolved.endpoint == nil ? .serviceUnavailable : .ok)
        }
        router.get("/v1/servers") { _, context in
            await large(context) { json(board.snapshot.candidates(now: board.now())) }
        }
        router.get("/v1/events") { request, _ -> Response in
            let limit = request.uri.queryParameters.get("limit", as: Int.self).map { min(max($0, 1), 1000) } ?? 100
            return json(await agent.events(limit: limit))
        }
        router.post("/v1/refresh") { _, context -> Response in
            if let denied = await forbidden(context, "ask for a refresh") { return denied }
            await agent.manager.refresh()
            return json(["refreshing": true], status: .accepted)
        }
        router.get("/v1/pairings") { _, _ -> Response in
            do {
                return json(try await agent.pairingSummaries())
            } catch {
                return json(
                    StatusAPI.ErrorBody(error: "store", reason: "could not read pairings: \(error)"),
                    status: .internalServerError)
            }
        }
        router.post("/v1/pairings") { request, context -> Response in
            if let denied = await forbidden(context, "import a pairing") { return denied }
            let body = try await request.body.collect(upTo: PairingUpload.maxBytes)
            guard let upload = try? JSONDecoder().decode(PairingUpload.self, from: Data(buffer: body)) else {
                return json(
                    StatusAPI.ErrorBody(
                        error: "bad-request", reason: "expected {\"payloads\": [\"opta-lmx://pair?…\", …]}"),
                    status: .badRequest)
            }
            let pairings: [Pairing]
            do {
                pairings = try upload.pairings(now: SystemClock.unixTime())
            } catch {
                return json(
                    StatusAPI.ErrorBody(error: "invalid-pairing", reason: "\(error)"), status: .unprocessableContent)
            }
            do {
                let results = try await agent.manager.importPairings(pairings)
                return json(
                    results.map { PairingImportResult(pairing: $0.stored.summary, updated: $0.isUpdate) },
                    status: .created)
            } catch {
                return json(
                    StatusAPI.ErrorBody(error: "store", reason: "could not save the pairing: \(error)"),
                    status: .internalServerError)
            }
        }
        router.delete("/v1/pairings/:id") { _, context -> Response in
            if let denied = await forbidden(context, "remove a pairing") { return denied }
            let id = context.parameters.get("id") ?? ""
            do {
                guard let removed = try await agent.manager.removePairing(id) else {
                    return json(
                        StatusAPI.ErrorBody(error: "not-found", reason: "no pairing \(id); see lmx-pair list"),
                        status: .notFound)
                }
                return json(removed.summary)
            } catch {
                return json(
                    StatusAPI.ErrorBody(error: "store", reason: "could not remove the pairing: \(error)"),
                    status: .internalServerError)
            }
        }
        router.get("/v1/watch") { request, context -> Response in
            let since = request.uri.queryParameters.get("since", as: UInt64.self)
            guard let subscription = await gate.run(for: await peer(context), { agent.watch.watch(since: since) })
            else {
                return LargeAnswerGate.busy()
            }
            // A client follows the changes: the agent is in use (its active route watched closely).
            await agent.manager.watchersChanged()
            return Response(
                status: .ok, headers: [.contentType: "application/x-ndjson", .cacheControl: "no-store"],
                body: watchBody(subscription, hub: agent.watch, channel: context.channel))
        }
        router.get("/v1/traffic") { _, _ -> Response in json(agent.traffic.report()) }
        router.get("/v1/history") { request, context -> Response in
            await history(request, agent: agent, uid: await peer(context))
        }
        router.get("/metrics") { _, _ -> Response in
            Response(
                status: .ok, headers: [.contentType: "text/plain; version=0.0.4"],
                body: .init(byteBuffer: ByteBuffer(string: await agent.metricsText())))
        }
        return router
    }

    /// A watch subscription's lines as an answer's body: the first lines, then each change. A
    /// watcher that stops reading is cut off once a write has waited `watchWriteTimeout`, so it
    /// never holds a connection, its buffers and a descriptor for good.
    static func watchBody(
        _ subscription: (first: [[UInt8]], stream: AsyncStream<[UInt8]>, id: UInt64), hub: WatchHub,
        channel: any Channel
    ) -> ResponseBody {
        // A watcher that closes its connection is gone at once, not at the next write that
        // fails (a heartbeat, 15 s later): connections opened and closed in a loop hold nothing.
        channel.closeFuture.whenComplete { _ in hub.unwatch(subscription.id) }
        return ResponseBody { writer in
            defer { hub.unwatch(subscription.id) }
            func send(_ line: [UInt8]) async throws {
                let deadline = Task {
                    try await Task.sleep(for: .seconds(watchWriteTimeout))
                    channel.close(promise: nil)
                }
                defer { deadline.cancel() }
                try await writer.write(ByteBuffer(bytes: line))
            }
            for line in subscription.first { try await send(line) }
            for await line in subscription.stream { try await send(line) }
            try await writer.finish(nil)
        }
    }

    /// `/v1/history?since=&until=&step=`, on the status socket and the dashboard alike: a query
    /// that cannot be read is a 400 naming the value; a large answer waits its turn (`gate`).
    static func history(_ request: Request, agent: Agent, uid: UInt32?) async -> Response {
        let parameters = request.uri.queryParameters
        let query: History.Query
        do {
            query = try History.Query.parse(
                since: parameters.get("since"), until: parameters.get("until"), step: parameters.get("step"),
                now: SystemClock.realtime())
        } catch {
            return json(StatusAPI.ErrorBody(error: "bad-request", reason: error.description), status: .badRequest)
        }
        do {
            return try await agent.largeAnswers.run(for: uid) { json(try await agent.history(query)) }
                ?? LargeAnswerGate.busy()
        } catch {
            return json(
                StatusAPI.ErrorBody(error: "store", reason: "could not read the history: \(error)"),
                status: .internalServerError)
        }
    }

    static func json<T: Encodable>(_ value: T, status: HTTPResponse.Status = .ok) -> Response {
        var bytes = (try? StatusAPI.encoder.encode(value)).map { Array($0) } ?? Array("{}".utf8)
        bytes.append(0x0A)
        return Response(status: status, headers: jsonHeaders, body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
    }

    /// Builds the application bound to `socketPath`.
    public static func application(
        agent: Agent, socketPath: String, logger: Logger,
        limiter: ConnectionLimiter = ConnectionLimiter(perUser: 64),
        onRunning: @escaping @Sendable () async -> Void
    ) -> some Service {
        QuietApplication(
            responder: router(agent: agent).buildResponder(),
            // Idle connections (slow or half-sent requests) are closed; watch streams write a
            // heartbeat more often than this.
            server: HTTPServerBuilder { responder in
                PerUserLimitedChannel(
                    base: HTTP1Channel(responder: responder, configuration: .init(idleTimeout: .seconds(30))),
                    limiter: limiter)
            },
            configuration: .init(
                address: .unixDomainSocket(path: socketPath), serverName: "lmx-agentd",
                availableConnectionsDelegate: .maximum(4096, logger: logger)),
            onServerRunning: { _ in
                // Any local user may read the status; changes are checked per request.
                FileSystem.setMode(socketPath, 0o666)
                await onRunning()
            },
            logger: logger)
    }
}

extension StatusServer {
    /// `/metrics` alone over TCP (`--metrics-address`), for a Prometheus server to scrape.
    public static func metricsApplication(agent: Agent, address: HostPort, logger: Logger) -> some Service {
        let router = Router()
        router.get("/metrics") { _, _ -> Response in
            Response(
                status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(string: await agent.metricsText())))
        }
        return QuietApplication(
            responder: router.buildResponder(),
            server: .http1(configuration: .init(idleTimeout: .seconds(60))),
            configuration: .init(address: .hostname(address.host, port: address.port), serverName: nil),
            onServerRunning: { _ in
                logger.info("Prometheus metrics are served at http://\(address.description)/metrics.")
            },
            logger: logger)
    }
}

/// Renders every error as the API's one JSON shape.
struct ErrorShapeMiddleware: RouterMiddleware {
    typealias Context = AgentRequestContext

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws
        -> Response
    {
        do {
            return try await next(request, context)
        } catch let error as HTTPError {
            let code = error.status
            let name =
                code == .notFound ? "not-found" : code == .methodNotAllowed ? "method-not-allowed" : "bad-request"
            let reason =
                code == .notFound
                ? "no such endpoint: \(request.method.rawValue) \(request.uri.path); see /v1/status"
                : error.body ?? "\(code.code) \(code.reasonPhrase)"
            return StatusServer.json(StatusAPI.ErrorBody(error: name, reason: reason), status: code)
        }
    }
}
