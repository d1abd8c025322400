import LMXCore
import NIOCore

extension UpstreamExchange {
    // MARK: Streams across a path switch (StreamContinuation)

    /// The agent's state changed while this exchange waits for a route or streams an answer: a
    /// request held is planned again; a stream on a route the agent knows is gone, or whose
    /// server is now best reached by another route, is opened again there when it can be (a
    /// run's events). A chat completion's stream is judged by its own connection: it ends now
    /// only when this machine lost the path to its route (a link, address or route event); a
    /// probe verdict alone never cuts it — a server that answers its probes slowly while it
    /// streams (a long prompt's prefill) is busy, not gone. A stream to a server that vanished
    /// without a word ends when its connection fails: the kernel's keepalive on the server's
    /// connection (``UpstreamPool/connect(_:timeout:)``) finds a silent peer within seconds.
    func routesChanged() {
        guard current else { return unwatchState() }
        if request.phase == .waiting {
            // Held for a route (or for the stream's server's): planned again on the new state.
            return request.machine.resuming ? rerouteStream() : route()
        }
        guard request.phase == .answering, request.machine.isStream, request.relay != nil, !request.targets.isEmpty
        else { return }
        let target = request.target
        // (The loop's plan for the server, made once per state whatever the number of streams.)
        var first: String?
        if let instance = target.instanceID,
            case .forward(let routes) = state.plan(
                model: nil, clientHasKey: request.clientHasKey, server: instance, limit: gateway.configuration.attempts)
        {
            first = routes.first?.routeID
        }
        switch state.snapshot.streamFate(routeID: target.routeID, serverFirstRoute: first) {
        case .stay:
            return
        case .moved:
            guard request.machine.resumable else { return }
            if let left = leftFailed, NIODeadline.now() < left.until, first == left.key.id {
                // The route that cut this stream a moment ago, still first only because no probe
                // has failed it yet: the stream stays where it went on.
                return
            }
            resumeStream(routeFailed: false, detail: "its server is reached by another route now")
        case .lost(let pathGone):
            if request.machine.resumable {
                return resumeStream(routeFailed: false, detail: "the agent found its route gone")
            }
            if pathGone { streamLost(error: RouteGone()) }
        }
    }

    struct RouteGone: Error {}

    /// Opens the request's stream again by its server's other route (or the same one, once it is
    /// usable again): its answer's head is dropped, its events continue the client's stream, the
    /// first dropped when the client already has it. `routeFailed`: the route cut the stream (the
    /// agent hears of it); otherwise the agent already knows.
    func resumeStream(routeFailed: Bool, detail: String) {
        guard client?.context != nil, let relay = request.relay else { return }
        let target = request.target
        detach()?.channel.close(promise: nil)
        request.leaveRoute()
        if relay.sawDone {
            // Cut after its last event: the stream is whole; it ends as it would have.
            emit(.end)
            client?.flushToClient()
            return perform(request.machine.answerEnd(reusable: false))
        }
        let now = NIODeadline.now()
        if routeFailed {
            let manager = gateway.agent.manager
            let routeID = target.routeID
            Task { await manager.gatewayFailed(routeID, reason: detail) }
            leftFailed = (target.routeKey, now + Self.failedRouteShunned)
        }
        resumes += 1
        if request.server == nil, let instance = target.instanceID,
            let object = ServerAffinity.named(method: "GET", path: request.path, body: [])
        {
            request.server = (instance, object)
        }
        guard resumes <= StreamContinuation.maxResumes, request.server != nil else {
            return streamLost(error: RouteGone())
        }
        gateway.metrics.gatewayStreamsResumed.increment()
        gateway.logger.info(
            "gateway: a run's event stream goes on by another route",
            metadata: ["route": "\(target.routeID)", "reason": "\(detail)"])
        request.machine.resume()
        if let closer = relay.resumed() { emit(.body(closer)) }
        // A route that cut the stream is avoided for a second; one left only because another is
        // better now is not: it stays the fallback should the better one not connect.
        wait = .resume(
            until: now + .milliseconds(Int64(gateway.configuration.holdSeconds * 1000)), nudge: now,
            avoid: routeFailed ? target.routeKey : nil, avoidUntil: routeFailed ? now + .seconds(1) : now)
        rerouteStream()
    }

    /// How long a stream is not moved back to the route that cut it while the agent still ranks
    /// that route first (a probe marks a dead route down within a few seconds).
    static let failedRouteShunned = TimeAmount.seconds(10)

    /// The stream's server's routes, the one it left last unless it is the only one (and a
    /// second has passed); while none is usable, planned again at each change of the agent's
    /// state (``routesChanged()``) and each second, for `gateway.hold_seconds`, then the stream
    /// ends with the stream-lost event.
    func rerouteStream() {
        guard current, request.machine.resuming, request.phase == .waiting, let server = request.server,
            case .resume(let until, var nudge, let avoid, let avoidUntil) = wait
        else { return }
        let now = NIODeadline.now()
        var routes: [GatewayTarget] = []
        if case .forward(let all) = state.plan(
            model: nil, clientHasKey: request.clientHasKey, server: server.instance,
            limit: gateway.configuration.attempts)
        {
            routes = all.filter { $0.routeKey != avoid }
            if routes.isEmpty, now >= avoidUntil { routes = all }
        }
        routes = routes.filter { $0.credentials.isHeaderSafe && state.address($0.baseURL) != nil }
        guard !routes.isEmpty else {
            guard now < until else {
                wait = .none
                return perform(request.machine.resumeFailed(), .lost(RouteGone()))
            }
            if now >= nudge {
                nudge = now + .seconds(1)
                let manager = gateway.agent.manager
                Task { await manager.gatewayWaiting() }
            }
            wait = .resume(until: until, nudge: nudge, avoid: avoid, avoidUntil: avoidUntil)
            watchState()
            // (And when the route it left may be taken again, if that is still to come.)
            let wake = min(nudge, until, avoidUntil > now ? avoidUntil : .distantFuture)
            state.loop.assumeIsolated().scheduleTask(deadline: wake) { [self] in
                self.rerouteStream()
            }
            return
        }
        wait = .none
        request.targets = routes
        perform(request.machine.routed(servers: routes.map(\.instanceID)))
    }
}
