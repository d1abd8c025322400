/// The connection manager's decisions, with no clock and no I/O: time comes in as `now`
/// (monotonic seconds), probe results come in as reports, and every decision comes out as
/// events and probe schedules. Tests drive it with scripted probes on a test clock.
public struct ConnectionPlanner: Sendable {
    public internal(set) var policy: HealthPolicy
    public internal(set) var routes: [String: RouteState] = [:]
    public internal(set) var activeID: String?
    /// When the active route became active.
    public internal(set) var activeSince: Double?
    /// The route that was active when the agent last stopped: probed first.
    public var lastGoodID: String?
    var random: SplitMix64
    var nextSweep: Double = 0
    /// Instances the user's routes (pairings, configured endpoints, the addresses their tunnels
    /// vouch for) pin or have reported, with the name of the route that owns each: kept current
    /// on every change so that ranking is O(1) per route.
    public internal(set) var instanceOwners: [String: String] = [:]
    public var pinnedInstances: Set<String> { Set(instanceOwners.keys) }
    /// Whether anything is set up (a pairing or a configured endpoint): from then on only
    /// vouched routes are used (trust `paired`).
    public internal(set) var hasUserRoutes = false
    /// Routes already reported as impostors (each is reported once).
    var flaggedImpostors: Set<String> = []
    /// What each tunnel last vouched for, as it listed it (for restarts and reloads).
    public internal(set) var vouches: [String: (baseURLs: [String], instanceID: String?)] = [:]
    /// When the agent was last used (a gateway request in flight or a byte of its traffic);
    /// nil: never (ConnectionPlanner+Usage).
    public internal(set) var lastUseAt: Double?
    /// Clients following the agent's changes (`/v1/watch`).
    public internal(set) var watchers = 0

    public init(policy: HealthPolicy = HealthPolicy(), seed: UInt64 = 0x5EED) {
        self.policy = policy
        self.random = SplitMix64(seed: seed)
    }

    public var active: RouteState? { activeID.flatMap { routes[$0] } }

    public var sortedRoutes: [RouteState] {
        routes.values.sorted { ($0.route.via.rawValue, $0.route.id) < ($1.route.via.rawValue, $1.route.id) }
    }

    // MARK: - Inputs

    public mutating func updatePolicy(_ policy: HealthPolicy, now: Double) -> [PlannerEvent] {
        let keysChanged = policy.lanKeys != self.policy.lanKeys
        self.policy = policy
        var events: [PlannerEvent] = []
        if keysChanged {
            for (tunnelID, vouch) in vouches {
                events += applyVouches(
                    for: tunnelID, advertised: vouch.baseURLs, instanceID: vouch.instanceID, now: now, force: true)
            }
        }
        return events + select(now: now)
    }

    /// Adds a route or refreshes what is known of it (an mDNS re-announcement, a new pairing).
    /// A route that comes back (re)announced is probed at once.
    public mutating func upsert(_ route: Route, instanceID: String? = nil, now: Double) -> [PlannerEvent] {
        if var state = routes[route.id] {
            let wasAnnounced = state.route.announced
            var merged = route
            if state.route.source.isSetUp, !route.source.isSetUp {
                // An announcement of an address the user set up (or its tunnel vouches for)
                // changes nothing but the announcement: never the URL, the scheme, the probe
                // path (a TXT `path` is for announced routes only), the name or the keys.
                merged = state.route
                if route.source == .mdns {
                    merged.announced = route.announced
                    merged.addresses = route.addresses
                }
            } else if route.source.isSetUp, state.route.announced {
                // Set up now, still announced.
                merged.announced = true
                if merged.addresses.isEmpty { merged.addresses = state.route.addresses }
            } else if route.source == .remembered {
                // What the store remembers adds nothing to a route known live (announced again
                // or set up while the store was read): it keeps its source and announcement.
                merged = state.route
            }
            let sourceChanged =
                merged.source != state.route.source || merged.pinnedInstance != state.route.pinnedInstance
                || merged.vouchedBy != state.route.vouchedBy || merged.credentials != state.route.credentials
            state.route = merged
            if state.instanceID == nil { state.instanceID = instanceID }
            // A sign of life (a new announcement, a resolver answer, a pairing imported again):
            // a route that is not known to be up is probed at once, its backoff forgotten.
            if (route.announced && !wasAnnounced || state.health != .up) && !state.inFlight {
                state.nextProbeAt = now
                state.backoff = 0
            }
            if state.route.announced || !state.route.source.isFound {
                state.withdrawnAt = nil
            } else if state.withdrawnAt == nil {
                state.withdrawnAt = now
            }
            routes[route.id] = state
            if sourceChanged {
                refreshUserRoutes()
                return [.routeUpdated(state)] + flagImpostors() + select(now: now)
            }
            return [.routeUpdated(state)]
        }
        var state = RouteState(route: route, now: now)
        state.instanceID = instanceID
        if route.source.isFound, !route.announced { state.withdrawnAt = now }
        routes[route.id] = state
        guard route.source.isSetUp else { return [.routeAdded(state)] + evictFound(now: now) + flagImpostors() }
        refreshUserRoutes()
        return [.routeAdded(state)] + flagImpostors() + select(now: now)
    }

    /// mDNS no longer announces the route. Liveness is decided by probes, never by mDNS alone, so
    /// the route stays and is re-probed at once: gone servers fail fast, live ones stay.
    public mutating func withdraw(_ routeID: String, now: Double) -> [PlannerEvent] {
        guard var state = routes[routeID], state.route.announced else { return [] }
        state.route.announced = false
        if state.route.source.isFound { state.withdrawnAt = now }
        if !state.inFlight { state.nextProbeAt = now }
        routes[routeID] = state
        return [.routeUpdated(state)]
    }

    /// Removes a route for good (a pairing or manual entry deleted).
    public mutating func remove(_ routeID: String, reason: String, cause: Cause, now: Double) -> [PlannerEvent] {
        guard let state = routes.removeValue(forKey: routeID) else { return [] }
        var events: [PlannerEvent] = [.routeRemoved(state, reason: reason, cause: cause)]
        if vouches.removeValue(forKey: routeID) != nil {
            // A tunnel that goes takes the addresses it vouched for with it.
            for vouched in routes.values where vouched.route.vouchedBy == routeID {
                events += unvouch(vouched.id, reason: "\(state.route.name)'s tunnel was removed", now: now)
            }
        }
        refreshUserRoutes()
        events += select(
            now: now, lost: activeID == routeID ? ("\(describe(state)) is no longer used: \(reason)", cause) : nil)
        return events
    }

    /// Makes one route due now (a pairing just imported or updated).
    public mutating func probeNow(_ routeID: String, now: Double) {
        guard var state = routes[routeID], !state.inFlight else { return }
        state.nextProbeAt = now
        state.backoff = 0
        routes[routeID] = state
    }

    /// Probes a route in full now (its discovery document again): after the server said that
    /// something changed (an `/admin/events` event), or to resync after reconnecting to them.
    public mutating func resync(_ routeID: String, now: Double) {
        guard routes[routeID] != nil else { return }
        routes[routeID]!.lastFullProbeAt = nil
        probeNow(routeID, now: now)
    }

    /// Applies a `model_loaded` / `model_unloaded` event to what is known of a server's models
    /// (a full probe confirms it soon after).
    public mutating func applyModelEvent(_ routeID: String, model: String, loaded: Bool) {
        guard var report = routes[routeID]?.lastReport, var models = report.models,
            let model = ProbeSequence.cleanModels([model]).first
        else { return }
        if loaded {
            if !models.contains(model), models.count < ProbeSequence.maxModels { models.append(model) }
        } else {
            models.removeAll { $0 == model }
        }
        report.models = models
        report.modelCount = models.count
        routes[routeID]!.lastReport = report
    }

    /// Passive health: a silence where a heartbeat was due counts as one failed probe.
    public mutating func recordPassiveFailure(_ routeID: String, detail: String, cause: Cause, now: Double)
        -> [PlannerEvent]
    {
        guard let state = routes[routeID], !state.inFlight else { return [] }
        return record(
            ProbeReport(verdict: .down, latency: 0, detail: detail, cause: cause), for: routeID, full: false, now: now)
    }

    /// Makes every route due now, for a full probe (`POST /v1/refresh`, a reload).
    public mutating func refreshAll(now: Double) {
        for id in routes.keys where !routes[id]!.inFlight {
            routes[id]!.nextProbeAt = now
            routes[id]!.backoff = 0
            routes[id]!.lastFullProbeAt = nil
        }
    }

}
