import Hummingbird
import HummingbirdCore
import LMXCore
import NIOCore

/// The read-only dashboard at the gateway's root: one page, its script, style and icon (built
/// into the binary: no CDN, no build step), and the status API's read endpoints under
/// `/dashboard/api/` for the page to follow (`watch` is the agent's change stream). Who may load
/// it is ``DashboardPolicy``'s decision; it shows what any local user can read from the status
/// socket, nothing more.
struct Dashboard: Sendable {
    let agent: Agent

    func respond(
        _ resource: DashboardPolicy.Resource, request: Request, context: AgentRequestContext, localhostIsOurs: Bool
    ) async -> Response {
        let headers = request.headers.map { (name: $0.name.canonicalName, value: $0.value) }
        if let refusal = DashboardPolicy.refusal(
            method: request.method.rawValue, authority: request.head.authority, headers: headers,
            overTCP: context.isTCP,
            localPort: context.channel.localAddress?.port, localhostIsOurs: localhostIsOurs)
        {
            agent.metrics.gatewayRefused.increment()
            var response = Self.json(
                StatusAPI.ErrorBody(error: refusal.code, reason: refusal.message),
                status: HTTPResponse.Status(code: refusal.status))
            if refusal.status == 405 { response.headers[.allow] = "GET" }
            return response
        }
        let board = agent.board
        switch resource {
        case .page: return Self.asset(PackageResources.index_html, type: "text/html; charset=utf-8")
        case .script: return Self.asset(PackageResources.app_js, type: "text/javascript; charset=utf-8")
        case .style: return Self.asset(PackageResources.app_css, type: "text/css; charset=utf-8")
        case .icon: return Self.asset(PackageResources.icon_svg, type: "image/svg+xml")
        case .missing:
            return Self.json(
                StatusAPI.ErrorBody(
                    error: "not-found", reason: "no such dashboard resource: \(request.uri.path.prefix(100))"),
                status: .notFound)
        case .status:
            return await large(context) { Self.json(board.snapshot.status(seq: agent.watch.seq, now: board.now())) }
        case .events:
            let limit = request.uri.queryParameters.get("limit", as: Int.self).map { min(max($0, 1), 200) } ?? 50
            return Self.json(await agent.events(limit: limit))
        case .pairings:
            guard let pairings = try? await agent.pairingSummaries() else {
                return Self.json(
                    StatusAPI.ErrorBody(error: "store", reason: "could not read pairings"), status: .internalServerError
                )
            }
            return Self.json(pairings)
        case .traffic:
            return Self.json(agent.traffic.report())
        case .history:
            return Self.secured(await StatusServer.history(request, agent: agent, uid: await context.peerUID()))
        case .watch:
            let since = request.uri.queryParameters.get("since", as: UInt64.self)
            guard
                let subscription = await agent.largeAnswers.run(
                    for: await context.peerUID(), { agent.watch.watch(since: since) })
            else {
                return Self.secured(LargeAnswerGate.busy())
            }
            return Self.secured(
                Response(
                    status: .ok, headers: [.contentType: "application/x-ndjson"],
                    body: StatusServer.watchBody(subscription, hub: agent.watch, channel: context.channel)))
        }
    }

    private func large(_ context: AgentRequestContext, _ build: () -> Response) async -> Response {
        await agent.largeAnswers.run(for: await context.peerUID()) { build() } ?? Self.secured(LargeAnswerGate.busy())
    }

    static func asset(_ bytes: [UInt8], type: String) -> Response {
        secured(Response(status: .ok, headers: [.contentType: type], body: .init(byteBuffer: ByteBuffer(bytes: bytes))))
    }

    static func json<T: Encodable>(_ value: T, status: HTTPResponse.Status = .ok) -> Response {
        secured(StatusServer.json(value, status: status))
    }

    /// The dashboard's headers set on `response` (replacing any of the same name).
    static func secured(_ response: Response) -> Response {
        var response = response
        for (name, value) in DashboardPolicy.headers {
            if let field = HTTPFields.Element.Name(name) { response.headers[field] = value }
        }
        return response
    }
}
