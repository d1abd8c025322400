// Use: what the gateway's own traffic and the agent's clients say, as opposed to what probes
// find. Probing follows use (Envoy's `no_traffic_interval` beside its outlier detection): an idle
// agent asks its server almost nothing; traffic is itself the proof of life while it flows, and
// a route whose last proof is old is checked before it is handed out.

/// What the gateway's own traffic says of one route at a look.
public struct RouteTraffic: Sendable, Hashable {
    /// The gateway's requests in flight on the route.
    public var inFlight: Int
    /// When a byte last came from the route's server (planner seconds); nil: never.
    public var heardAt: Double?

    public init(inFlight: Int, heardAt: Double?) {
        self.inFlight = inFlight
        self.heardAt = heardAt
    }
}

extension ConnectionPlanner {
    /// Full probes of the active route while idle: one check in this many (with the default
    /// `idle_interval` of 10 s, a full probe a minute: the active server gets 8 requests a minute).
    public static let idleFullEvery = 6.0
    /// Full probes of a healthy standby: one check in this many (with the default
    /// `wan_standby_interval` of 90 s, a full probe every 15 minutes: under a request a minute).
    public static let standbyFullEvery = 10.0
    /// A route whose last proof is older than this is checked before it is handed out
    /// (`/v1/active`, `lmx-status --url`).
    public static let freshFor = 1.0

    /// Whether nothing uses the agent now: no gateway traffic for `idle_after`, no `/v1/watch`
    /// client. Probes then follow the idle schedule.
    public func isIdle(now: Double) -> Bool {
        guard watchers == 0 else { return false }
        guard let lastUseAt else { return true }
        return now - lastUseAt >= policy.idleAfter
    }

    /// Clients following the agent's changes (`/v1/watch`): while any does, the agent is in use.
    public mutating func setWatchers(_ count: Int, now: Double) {
        let wasIdle = isIdle(now: now)
        watchers = max(0, count)
        if wasIdle, !isIdle(now: now) { tighten(now: now) }
    }

    /// What the gateway's traffic says of `routeID` (read by the manager before each decision):
    /// requests in flight and a byte heard are use, and a byte heard is proof of life.
    public mutating func noteTraffic(_ routeID: String, _ traffic: RouteTraffic, now: Double) {
        guard var state = routes[routeID] else { return }
        let wasIdle = isIdle(now: now)
        state.gatewayInFlight = max(0, traffic.inFlight)
        if let heard = traffic.heardAt, heard > (state.trafficAt ?? -.infinity) {
            state.trafficAt = min(heard, now)
            lastUseAt = max(lastUseAt ?? -.infinity, min(heard, now))
        }
        if traffic.inFlight > 0 { lastUseAt = now }
        routes[routeID] = state
        if wasIdle, !isIdle(now: now) { tighten(now: now) }
    }

    /// A request came to the gateway: the agent is in use from now.
    public mutating func noteUse(now: Double) {
        let wasIdle = isIdle(now: now)
        lastUseAt = now
        if wasIdle { tighten(now: now) }
    }

    /// The server spoke on its event stream (a heartbeat or an event): proof of life.
    public mutating func noteServerEvent(_ routeID: String, now: Double) {
        routes[routeID]?.eventAt = now
    }

    /// In use again after an idle time: the active route goes back to its close watch.
    mutating func tighten(now: Double) {
        guard let id = activeID, var state = routes[id], !state.inFlight else { return }
        state.nextProbeAt = min(state.nextProbeAt, now + policy.activeInterval)
        routes[id] = state
    }

    /// Asks for a check of `routeID` now unless its last proof is at most ``freshFor`` old or a
    /// probe of it is running: a LAN route connects quickly (``pathReturnConnectTimeout``; a tunnel
    /// within ``freshTunnelConnectTimeout``) and its failure decides alone, so a route that vanished while
    /// nobody looked is not handed out.
    /// - Returns: whether a check was made due (the caller waits for it).
    public mutating func checkFresh(_ routeID: String, now: Double) -> Bool {
        guard var state = routes[routeID], !state.inFlight else { return false }
        if let proof = state.lastProofAt, now - proof <= Self.freshFor { return false }
        state.freshCheck = true
        state.nextProbeAt = now
        state.backoff = 0
        routes[routeID] = state
        return true
    }

    /// A failed probe of a route that carries the gateway's traffic: a server that answers its
    /// health paths slowly (or not within the timeout) while it streams to us is busy, not gone.
    /// Only a probe that timed out counts so (a refusal or reset is an answer), and only when a
    /// byte came from the server since the probe started, or a request of the gateway is on the
    /// route and the server's host still accepted a new connection (its kernel answers for a busy
    /// server, not for one that vanished: a black hole still fails over).
    func isBusyNotGone(_ state: RouteState, _ report: ProbeReport, startedAt: Double?) -> Bool {
        guard !report.verdict.isAlive, report.timedOut == true, state.health == .up, state.offNetwork == nil else {
            return false
        }
        if let heard = state.trafficAt, let startedAt, heard >= startedAt { return true }
        return state.gatewayInFlight > 0 && report.connectionAccepted == true
    }

    /// Whether a probe of `routeID` that timed out should be followed by a connection check
    /// (``ProbeReport/connectionAccepted``): the gateway has a request on the route.
    public func wantsConnectionCheck(_ routeID: String) -> Bool {
        (routes[routeID]?.gatewayInFlight ?? 0) > 0
    }

    /// Whether the next probe of `state` may be a quick check (`/readyz` only): a healthy route
    /// with nothing in question whose last full probe is recent enough for its role.
    func mayCheckQuickly(_ state: RouteState, now: Double) -> Bool {
        guard state.health == .up, state.badStreak == 0, let lastFull = state.lastFullProbeAt else { return false }
        if state.id == activeID {
            let every = isIdle(now: now) ? policy.idleInterval * Self.idleFullEvery : policy.stableInterval
            return now - lastFull < max(every, policy.stableInterval)
        }
        // Standbys: WAN ones always, LAN ones while idle (in use, a LAN standby is probed in full
        // every `stable_interval`, ready to take over).
        guard state.condition == .normal, !isPendingUpgrade(state),
            state.route.via == .wan || isIdle(now: now)
        else { return false }
        return now - lastFull < policy.wanStandbyInterval * Self.standbyFullEvery
    }
}
