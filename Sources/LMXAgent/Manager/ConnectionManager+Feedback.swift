import LMXCore
import LMXProbe

// Feedback from the outputs: what the active server says on its `/admin/events` stream
// (followed by `PassiveHealthFollower`), and what the gateway finds.
extension ConnectionManager {
    /// The gateway could not reach a route (refused, reset, timed out): probe it now rather
    /// than at its next turn, so the active endpoint moves on quickly.
    public func gatewayFailed(_ routeID: String, reason: String) {
        guard planner.routes[routeID] != nil, !probing.contains(routeID) else { return }
        let place = planner.routes[routeID].map { ServerTable.printable(planner.place($0).words) } ?? "a route"
        logger.info(
            "The gateway could not reach \(place) (\(reason)): probing it now.", metadata: ["route": "\(routeID)"])
        planner.probeNow(routeID, now: clock.now())
        pump(reselect: false)
    }

    /// A request through the route was answered by a page that is not the server's (a login
    /// page, a tunnel's error page, a captive portal): the route is marked with that verdict and
    /// cause until the server answers its API itself (``ConnectionPlanner/recordForeign(_:for:now:)``).
    public func gatewayFoundNotServer(_ routeID: String, _ foreign: ForeignAnswer) {
        guard planner.routes[routeID] != nil, !stopped else { return }
        let t = clock.now()
        let place = planner.routes[routeID].map { ServerTable.printable(planner.place($0).words) } ?? "a route"
        logger.notice(
            "A request through \(place) was not answered by the server (\(foreign.detail)).",
            metadata: ["route": "\(routeID)"])
        let events = planned(planner.recordForeign(foreign, for: routeID, now: t))
        pump(events, reselect: false)
    }

    func serverEvent(_ event: ServerEvent, routeID: String) {
        guard routeID == planner.activeID, !stopped else { return }
        let t = clock.now()
        planner.noteServerEvent(routeID, now: t)
        switch event.type {
        case "model_loaded", "model_unloaded", "readiness_changed", "config_reloaded", "ttl_evicted":
            if let model = event.model, event.type.hasPrefix("model_") {
                planner.applyModelEvent(routeID, model: model, loaded: event.type == "model_loaded")
            }
            logger.info(
                "The active server announced \(String(event.type.map { $0 == "_" ? " " : $0 })): reading its state again.",
                metadata: ["route": "\(routeID)", "event": "\(event.type)"])
            planner.resync(routeID, now: t)
            pump([.serverEventReceived], reselect: false)
        default:
            publish([.serverEventReceived], now: t)  // heartbeats and events the agent does not use
        }
    }

    /// Returns the pause before reconnecting.
    func eventStreamEnded(_ end: EventStreamEnd, routeID: String, backoff: Double) -> Double {
        guard routeID == planner.activeID, !stopped else { return backoff }
        let t = clock.now()
        switch end {
        case .silent(let seconds):
            let detail = "no heartbeat on /admin/events for \(Int(seconds)) s"
            logger.warning("\(detail): counted as a failed probe; reconnecting", metadata: ["route": "\(routeID)"])
            let events = planned(planner.recordPassiveFailure(routeID, detail: detail, cause: .eventsSilent, now: t))
            planner.probeNow(routeID, now: t)
            pump(events, reselect: false)
            return 0.5
        case .refused(let status):
            logger.notice(
                "the server refused its event stream (HTTP \(status)): relying on probes",
                metadata: ["route": "\(routeID)"])
            return 300
        case .closed(let why):
            logger.info(
                "The active server's event stream closed (\(why)): connecting to it again.",
                metadata: ["route": "\(routeID)"])
            // Whatever happened meanwhile is learned from a full probe after reconnecting.
            planner.resync(routeID, now: t)
            pump(reselect: false)
            return backoff
        }
    }

    /// The route's event stream opened but never delivered a first event (a path that buffers
    /// server-sent events): said once; probes alone watch it, nothing is counted as failing.
    func eventStreamNeverDelivered(routeID: String) {
        logger.notice(
            "no event arrived on /admin/events, not even a heartbeat (the path buffers server-sent events, as quick tunnels do): relying on probes for this route",
            metadata: ["route": "\(routeID)"])
    }

    /// A gateway request is waiting for a usable route: everything is probed now (at most once a
    /// second), rather than at each route's next turn of its backoff.
    func gatewayWaiting() {
        let t = clock.now()
        guard t - lastWaitingRefresh >= 1 else { return }
        lastWaitingRefresh = t
        logger.debug("a gateway request waits for a usable route: probing every endpoint")
        planner.refreshAll(now: t)
        pump()
    }
}
