/// Established health of a route, after hysteresis.
public enum RouteHealth: String, Sendable, Hashable, Codable {
    /// Never probed yet.
    case unknown
    /// Alive (ready, not ready or overloaded).
    case up
    /// Not usable (down, tunnel down, auth rejected, wrong service).
    case down
}

/// Immutable shared storage for the bulky parts of a route's state: the planner passes over every
/// route after every probe, and a copy then costs one retain instead of one per string.
final class Shared<Value: Hashable & Sendable>: Hashable, Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
    static func == (lhs: Shared, rhs: Shared) -> Bool { lhs === rhs || lhs.value == rhs.value }
    func hash(into hasher: inout Hasher) { hasher.combine(value) }
}

/// A route and everything the agent knows about its health.
public struct RouteState: Sendable, Hashable, Identifiable {
    private var routeStorage: Shared<Route>
    private var reportStorage: Shared<ProbeReport>?

    public var route: Route {
        get { routeStorage.value }
        set { routeStorage = Shared(newValue) }
    }
    public var health: RouteHealth = .unknown
    /// The established verdict: changes class (alive ↔ not) only through hysteresis.
    public var verdict: HealthVerdict?
    public var lastReport: ProbeReport? {
        get { reportStorage?.value }
        set { reportStorage = newValue.map(Shared.init) }
    }
    public var lastProbeAt: Double?
    public var goodStreak = 0
    public var badStreak = 0
    /// Since when every probe has been good (nil after any bad one).
    public var healthySince: Double?
    /// Since when the route is in its current health.
    public var healthSince: Double?
    public var nextProbeAt: Double
    public var inFlight = false
    /// Exponentially smoothed probe latency, seconds.
    public var smoothedLatency: Double?
    /// When the last good probe finished: a route good within `restartWatch` is watched for
    /// its return on a short schedule instead of backing off.
    public var lastGoodAt: Double?
    public var probeCount = 0
    public var failureCount = 0
    /// When the last full probe (healthz, discovery document, readyz) finished.
    public var lastFullProbeAt: Double?
    var backoff: Double = 0
    /// The server's `instance_id`, learned from its discovery document (or remembered).
    public var instanceID: String?

    public let id: String

    init(route: Route, now: Double) {
        self.routeStorage = Shared(route)
        self.id = route.id
        self.nextProbeAt = now
    }
}

/// One probe to run.
public struct ProbeTask: Sendable, Hashable {
    public var route: Route
    /// `false`: a quick liveness check (`/readyz` only) of the active route between full probes.
    public var full: Bool
}

/// Something the planner decided that the world should hear about.
public enum PlannerEvent: Sendable, Hashable {
    case routeAdded(RouteState)
    case routeRemoved(RouteState, reason: String)
    /// Established health or verdict changed.
    case healthChanged(RouteState, from: HealthVerdict?, reason: String)
    /// Any other change of what is shown for a route (latency, last probe, announcement).
    case routeUpdated(RouteState)
    case activeChanged(from: RouteState?, to: RouteState?, reason: String)
    /// An announcer claims the `instance_id` of a server the user set up (`owner` is its name)
    /// from an address that server does not vouch for. Sent once per route.
    case impostor(RouteState, owner: String)
    /// A tunnel's discovery document changed the LAN addresses it vouches for (to be kept
    /// with the pairing, so they hold across restarts and while the tunnel is down).
    case vouchesChanged(tunnelID: String, baseURLs: [String], instanceID: String?)
}

/// The connection manager's decisions, with no clock and no I/O: time comes in as `now`
/// (monotonic seconds), probe results come in as reports, and every decision comes out as
/// events and probe schedules. Tests drive it with scripted probes on a test clock.
public struct ConnectionPlanner: Sendable {
    public private(set) var policy: HealthPolicy
    public private(set) var routes: [String: RouteState] = [:]
    public private(set) var activeID: String?
    /// When the active route became active.
    public private(set) var activeSince: Double?
    /// The route that was active when the agent last stopped: probed first.
    public var lastGoodID: String?
    private var random: SplitMix64
    private var nextSweep: Double = 0
    /// Instances the user's routes (pairings, configured endpoints, the addresses their tunnels
    /// vouch for) pin or have reported, with the name of the route that owns each: kept current
    /// on every change so that ranking is O(1) per route.
    public private(set) var instanceOwners: [String: String] = [:]
    public var pinnedInstances: Set<String> { Set(instanceOwners.keys) }
    /// Whether anything is set up (a pairing or a configured endpoint): from then on only
    /// vouched routes are used (trust `paired`).
    public private(set) var hasUserRoutes = false
    /// Routes already reported as impostors (each is reported once).
    private var flaggedImpostors: Set<String> = []
    /// What each tunnel last vouched for, as it listed it (for restarts and reloads).
    public private(set) var vouches: [String: (baseURLs: [String], instanceID: String?)] = [:]

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
                events += applyVouches(for: tunnelID, advertised: vouch.baseURLs, instanceID: vouch.instanceID, now: now, force: true)
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
                // A remembered route keeps its stronger source once announced again.
                merged.source = state.route.source
            }
            let sourceChanged = merged.source != state.route.source || merged.pinnedInstance != state.route.pinnedInstance
                || merged.vouchedBy != state.route.vouchedBy || merged.credentials != state.route.credentials
            state.route = merged
            if state.instanceID == nil { state.instanceID = instanceID }
            // A sign of life (a new announcement, a resolver answer, a pairing imported again):
            // a route that is not known to be up is probed at once, its backoff forgotten.
            if (route.announced && !wasAnnounced || state.health != .up) && !state.inFlight {
                state.nextProbeAt = now
                state.backoff = 0
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
        routes[route.id] = state
        guard route.source.isSetUp else { return [.routeAdded(state)] + flagImpostors() }
        refreshUserRoutes()
        return [.routeAdded(state)] + flagImpostors() + select(now: now)
    }

    /// Recomputes what the trust policy protects: every pairing, and configured endpoints that
    /// name their instance; trusted are the instances those routes pin or have reported.
    private mutating func refreshUserRoutes() {
        var owners: [String: String] = [:]
        var setUp = false
        for state in routes.values.sorted(by: { $0.id < $1.id }) where state.route.source.isSetUp {
            setUp = true
            if let pin = state.route.pinnedInstance, owners[pin] == nil { owners[pin] = state.route.name }
            if let learned = state.instanceID, owners[learned] == nil { owners[learned] = state.route.name }
        }
        instanceOwners = owners
        hasUserRoutes = setUp
    }

    /// Announced routes that newly claim a set-up server's instance: each reported once (and
    /// again only after it stopped claiming it).
    private mutating func flagImpostors() -> [PlannerEvent] {
        var events: [PlannerEvent] = []
        for id in flaggedImpostors where routes[id].map({ trust(of: $0) != .impostor }) ?? true {
            flaggedImpostors.remove(id)
        }
        guard !instanceOwners.isEmpty else { return [] }
        for state in routes.values where !state.route.source.isSetUp {
            guard let instance = state.instanceID, let owner = instanceOwners[instance], !flaggedImpostors.contains(state.id)
            else { continue }
            flaggedImpostors.insert(state.id)
            events.append(.impostor(state, owner: owner))
        }
        return events
    }

    // MARK: - Vouching

    /// Applies what a tunnel says about its server's LAN addresses (its discovery document's
    /// `endpoints`, read over HTTPS with a verified certificate): each vouched address becomes a
    /// LAN route of the same server, with the server's own keys (`lan_keys`), pinned to the
    /// instance the tunnel reported, probed at once; addresses it no longer lists go (back to
    /// plain announcements when mDNS still announces them). Addresses the user wrote stay as
    /// they are. Only HTTPS tunnels the user set up vouch.
    /// - Parameters:
    ///   - advertised: the document's URLs as sent (`ProbeReport.advertisedBaseURLs`).
    ///   - force: rebuild the routes even when the list did not change (keys policy changed).
    public mutating func applyVouches(
        for tunnelID: String, advertised: [String], instanceID: String?, now: Double, force: Bool = false
    ) -> [PlannerEvent] {
        guard let tunnel = routes[tunnelID]?.route, tunnel.via == .wan, tunnel.source.isSetUp,
            tunnel.baseURL.hasPrefix("https://")
        else { return [] }
        let wanted = TunnelVouch.lanBaseURLs(advertised)
        let instance = tunnel.pinnedInstance ?? instanceID
        let previous = vouches[tunnelID]
        let changed = previous.map { TunnelVouch.lanBaseURLs($0.baseURLs) != wanted || $0.instanceID != instance } ?? true
        guard changed || force else { return [] }
        vouches[tunnelID] = (wanted, instance)
        var events: [PlannerEvent] = changed ? [.vouchesChanged(tunnelID: tunnelID, baseURLs: wanted, instanceID: instance)] : []
        let wantedIDs = Set(wanted.map { Route.identifier(baseURL: $0, via: .lan) })
        for state in routes.values where state.route.vouchedBy == tunnelID && !wantedIDs.contains(state.id) {
            events += unvouch(state.id, reason: "no longer listed by \(tunnel.name)'s tunnel", now: now)
        }
        for url in wanted {
            let keys = policy.lanKeys == .vouched || url.hasPrefix("https://") ? tunnel.credentials.serverKeys : Credentials()
            let route = Route(
                baseURL: url, via: .lan, source: tunnel.source, name: tunnel.name, pinnedInstance: instance,
                credentials: keys, addresses: [url], vouchedBy: tunnelID)
            if let existing = routes[route.id] {
                // What the user wrote stays as written; the first tunnel to vouch keeps the route.
                if existing.route.source.isSetUp, existing.route.vouchedBy != tunnelID { continue }
            }
            let isNew = routes[route.id]?.route.vouchedBy != tunnelID
            events += upsert(route, now: now)
            if isNew { probeNow(route.id, now: now) }
        }
        return events
    }

    /// A vouched route its tunnel no longer lists: back to a plain announcement if mDNS still
    /// announces it, else removed.
    private mutating func unvouch(_ routeID: String, reason: String, now: Double) -> [PlannerEvent] {
        guard var state = routes[routeID], state.route.vouchedBy != nil else { return [] }
        guard state.route.announced else { return remove(routeID, reason: reason, now: now) }
        state.route = Route(
            id: state.id, baseURL: state.route.baseURL, via: .lan, source: .mdns, name: state.route.name,
            addresses: state.route.addresses, announced: true)
        routes[routeID] = state
        refreshUserRoutes()
        return [.routeUpdated(state)] + flagImpostors() + select(now: now)
    }

    // MARK: - Trust

    /// Who vouches for a route (CONTRACT §7).
    public func trust(of state: RouteState) -> RouteTrust {
        if state.route.source.isSetUp { return state.route.vouchedBy == nil ? .user : .tunnel }
        if let instance = state.instanceID, instanceOwners[instance] != nil { return .impostor }
        return .announced
    }

    /// Whether the trust policy lets this route be active and receive requests.
    public func isAllowed(_ state: RouteState) -> Bool {
        switch trust(of: state) {
        case .user, .tunnel: return true
        case .impostor: return false
        case .announced:
            switch policy.trust {
            case .lan: return true
            case .paired: return !hasUserRoutes
            case .pinned: return false
            }
        }
    }

    /// The server requires an inference key (its discovery document says so) and this route
    /// carries none: every inference request through it is a certain 401 unless the client
    /// brings its own key.
    public func lacksRequiredKey(_ state: RouteState) -> Bool {
        state.lastReport?.inferenceKeyRequired == true && state.route.credentials.inferenceKey == nil
    }

    /// mDNS no longer announces the route. Liveness is decided by probes, never by mDNS alone, so
    /// the route stays and is re-probed at once: gone servers fail fast, live ones stay.
    public mutating func withdraw(_ routeID: String, now: Double) -> [PlannerEvent] {
        guard var state = routes[routeID], state.route.announced else { return [] }
        state.route.announced = false
        if !state.inFlight { state.nextProbeAt = now }
        routes[routeID] = state
        return [.routeUpdated(state)]
    }

    /// Removes a route for good (a pairing or manual entry deleted).
    public mutating func remove(_ routeID: String, reason: String, now: Double) -> [PlannerEvent] {
        guard let state = routes.removeValue(forKey: routeID) else { return [] }
        var events: [PlannerEvent] = [.routeRemoved(state, reason: reason)]
        if vouches.removeValue(forKey: routeID) != nil {
            // A tunnel that goes takes the addresses it vouched for with it.
            for vouched in routes.values where vouched.route.vouchedBy == routeID {
                events += unvouch(vouched.id, reason: "\(state.route.name)'s tunnel removed", now: now)
            }
        }
        refreshUserRoutes()
        events += select(now: now, lostReason: activeID == routeID ? "\(state.route.name) removed: \(reason)" : nil)
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
        guard var report = routes[routeID]?.lastReport, var models = report.models else { return }
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
    public mutating func recordPassiveFailure(_ routeID: String, detail: String, now: Double) -> [PlannerEvent] {
        guard let state = routes[routeID], !state.inFlight else { return [] }
        return record(ProbeReport(verdict: .down, latency: 0, detail: detail), for: routeID, full: false, now: now)
    }

    /// Makes every route due now (`POST /v1/refresh`).
    public mutating func refreshAll(now: Double) {
        for id in routes.keys where !routes[id]!.inFlight {
            routes[id]!.nextProbeAt = now
            routes[id]!.backoff = 0
        }
    }

    /// Routes to probe now, at most `maxConcurrentProbes` in flight; marks them in flight.
    /// The active route comes first, then the last-good one, then the most overdue.
    public mutating func takeDueProbes(now: Double) -> [ProbeTask] {
        // Lazy everywhere on the hot paths: RouteState copies (strings, arrays) dominate otherwise.
        // One pass for the counts: probes in flight, those of LAN-found routes, and the others.
        var inFlight = 0, bulkInFlight = 0, others = 0
        for state in routes.values {
            let bulk = isBulk(state)
            if state.inFlight {
                inFlight += 1
                if bulk { bulkInFlight += 1 }
            }
            if !bulk { others += 1 }
        }
        let room = policy.maxConcurrentProbes - inFlight
        guard room > 0 else { return [] }
        let sorted = routes.values.lazy.filter { !$0.inFlight && $0.nextProbeAt <= now }
            .sorted { a, b in
                let pa = priority(a), pb = priority(b)
                if pa != pb { return pa < pb }
                if a.nextProbeAt != b.nextProbeAt { return a.nextProbeAt < b.nextProbeAt }
                return a.id < b.id
            }
        // Routes merely found on the LAN never take the last slots: however many a flood of
        // announcements brings (each a black hole costing a whole timeout), the active route,
        // the paired and configured ones and the WAN standbys keep their own budget.
        let bulkLimit = max(1, policy.maxConcurrentProbes - min(Self.reservedSlots, others))
        var due: [RouteState] = []
        for state in sorted {
            guard due.count < room else { break }
            if isBulk(state) {
                guard bulkInFlight < bulkLimit else { continue }
                bulkInFlight += 1
            }
            due.append(state)
        }
        for state in due { routes[state.id]!.inFlight = true }
        return due.map { state in
            // The active route is checked often and cheaply; every stable interval, in full.
            let quick = state.id == activeID && state.health == .up && state.badStreak == 0
                && state.lastFullProbeAt.map { now - $0 < policy.stableInterval } == true
            return ProbeTask(route: state.route, full: !quick)
        }
    }

    /// Probe slots that routes found on the LAN may not use (see `takeDueProbes`).
    static let reservedSlots = 2

    /// A route found on the LAN (or remembered from it) that is neither active nor last-good.
    private func isBulk(_ state: RouteState) -> Bool {
        (state.route.source == .mdns || state.route.source == .remembered) && state.id != activeID && state.id != lastGoodID
    }

    private func priority(_ state: RouteState) -> Int {
        if state.id == activeID { return 0 }
        if state.id == lastGoodID { return 1 }
        return state.route.via == .lan ? 2 : 3
    }

    /// When something next needs doing: a probe falling due or a stability window ending.
    public func nextWakeup() -> Double? {
        var next = routes.values.lazy.filter { !$0.inFlight }.map(\.nextProbeAt).min()
        if let active = activeID.flatMap({ routes[$0] }), let activeRank = rank(active) {
            let windowEnd = routes.values.lazy
                .filter { state in
                    self.rank(state).map { $0 < activeRank || ($0 == activeRank && self.isPreferredOver(state, active)) } ?? false
                }
                .compactMap { $0.healthySince.map { $0 + self.policy.stabilityWindow } }
                .min()
            if let windowEnd { next = min(next ?? windowEnd, windowEnd) }
        }
        return next
    }

    /// Re-runs selection (a stability window may have ended) and forgets long-dead routes.
    public mutating func tick(now: Double) -> [PlannerEvent] {
        var events: [PlannerEvent] = []
        // Forgetting is not urgent: sweep at most every 30 s, not on every wakeup.
        guard now >= nextSweep else { return select(now: now) }
        nextSweep = now + 30
        let activeID = self.activeID, forgetAfter = policy.forgetAfter
        let forgotten = routes.values.lazy.filter { state in
            (state.route.source == .mdns || state.route.source == .remembered) && !state.route.announced
                && state.health == .down && state.id != activeID
                && now - (state.healthSince ?? now) >= forgetAfter
        }.map(\.id)
        for id in Array(forgotten) {
            guard let state = routes.removeValue(forKey: id) else { continue }
            events.append(.routeRemoved(state, reason: "withdrawn from mDNS and down for \(Int(policy.forgetAfter)) s"))
        }
        return events + select(now: now)
    }

    /// Records the result of one probe and decides what follows.
    public mutating func record(_ report: ProbeReport, for routeID: String, full: Bool = true, now: Double) -> [PlannerEvent] {
        guard var state = routes[routeID] else { return [] }
        state.inFlight = false
        var report = report
        if full {
            state.lastFullProbeAt = now
        } else if let previous = state.lastReport {
            // A quick check learns readiness only; keep what the last full probe learned.
            report.instanceID = report.instanceID ?? previous.instanceID
            report.version = report.version ?? previous.version
            report.securityProfile = report.securityProfile ?? previous.securityProfile
            report.adminKeyRequired = report.adminKeyRequired ?? previous.adminKeyRequired
            report.inferenceKeyRequired = report.inferenceKeyRequired ?? previous.inferenceKeyRequired
            report.modelCount = report.modelCount ?? previous.modelCount
            report.models = report.models ?? previous.models
        }
        state.lastReport = report
        state.lastProbeAt = now
        state.probeCount += 1
        let learned = report.instanceID.map { $0 != state.instanceID } ?? false
        if let instance = report.instanceID { state.instanceID = instance }

        let good = report.verdict.isAlive
        let before = state.verdict
        let beforeHealth = state.health
        if good {
            state.goodStreak += 1
            state.badStreak = 0
            if state.healthySince == nil { state.healthySince = now }
            let latency = report.latency
            state.smoothedLatency = state.smoothedLatency.map { 0.7 * $0 + 0.3 * latency } ?? latency
        } else {
            state.failureCount += 1
            state.badStreak += 1
            state.goodStreak = 0
            state.healthySince = nil
        }
        if good { state.lastGoodAt = now }

        switch (state.health, good) {
        case (.unknown, _):
            // Nothing to flap from yet: the first probe sets the health.
            state.health = good ? .up : .down
            state.verdict = report.verdict
        case (.up, true), (.down, false):
            state.verdict = report.verdict
        case (.up, false):
            if state.badStreak >= policy.downAfter {
                state.health = .down
                state.verdict = report.verdict
            }
        case (.down, true):
            if state.goodStreak >= policy.upAfter {
                state.health = .up
                state.verdict = report.verdict
            }
        }
        if state.health != beforeHealth { state.healthSince = now }
        schedule(&state, report: report, now: now)
        routes[routeID] = state
        if learned, state.route.source.isSetUp { refreshUserRoutes() }

        var events: [PlannerEvent] = []
        if state.verdict != before || state.health != beforeHealth {
            events.append(.healthChanged(state, from: before, reason: describe(report)))
        } else {
            events.append(.routeUpdated(state))
        }
        if learned { events += flagImpostors() }
        if full, state.route.via == .wan, let advertised = report.advertisedBaseURLs, report.verdict != .wrongService {
            // Re-read on every full probe of the tunnel: the server's own word on where it is.
            events += applyVouches(for: routeID, advertised: advertised, instanceID: report.instanceID ?? state.instanceID, now: now)
        }
        let lost = routeID == activeID && !isUsable(state) ? "\(state.route.name) failed: \(describe(report))" : nil
        return events + select(now: now, lostReason: lost)
    }

    private mutating func schedule(_ state: inout RouteState, report: ProbeReport, now: Double) {
        let good = report.verdict.isAlive
        let isActive = state.id == activeID
        let pending = (state.health == .up) != good  // the last probe disagrees with the health
        var delay: Double
        if pending {
            delay = isActive ? policy.confirmInterval : policy.pendingInterval
            state.backoff = 0
        } else if good, !isActive, isPendingUpgrade(state) {
            // A better route is proving itself for the stability window: watch it closely, so a
            // flapping server is caught rather than sampled between its failures.
            state.backoff = 0
            delay = policy.pendingInterval
        } else if good {
            state.backoff = 0
            let base = isActive ? policy.activeInterval
                : state.route.via == .wan ? policy.wanStandbyInterval : policy.stableInterval
            delay = jittered(base)
        } else if let lastGood = state.lastGoodAt, now - lastGood <= policy.restartWatch {
            // Good not long ago: most likely a restart, crash or reboot that sends no goodbye and
            // no new announcement. Look again soon, so it is back within seconds of answering.
            state.backoff = 0
            delay = jittered(policy.restartInterval, spread: 0.25)
        } else {
            state.backoff = state.backoff == 0 ? policy.pendingInterval * 2 : min(policy.maxBackoff, state.backoff * 2)
            delay = jittered(state.backoff)
        }
        // Retry-After steers preference (an overloaded server ranks lower) and spares standbys;
        // it never blinds the agent to its active route, and never for more than maxRetryAfter.
        if let retryAfter = report.retryAfter, report.verdict == .overloaded, !isActive {
            delay = max(delay, min(retryAfter, policy.maxRetryAfter))
        }
        state.nextProbeAt = now + delay
    }

    private mutating func jittered(_ base: Double, spread: Double? = nil) -> Double {
        let spread = spread ?? policy.jitter
        guard spread > 0 else { return base }
        let unit = Double(random.next() >> 11) / Double(1 << 53)  // [0, 1)
        return base * (1 - spread + 2 * spread * unit)
    }

    // MARK: - Selection

    /// Lower is better: LAN ready, LAN alive, WAN ready, WAN alive, then routes without the
    /// inference key their server requires. `nil`: not selectable (down, or not allowed by the
    /// trust policy).
    public func rank(_ state: RouteState) -> Int? {
        guard state.health == .up, let verdict = state.verdict, verdict.isAlive, isAllowed(state) else { return nil }
        let base = state.route.via == .lan ? 0 : 2
        if lacksRequiredKey(state) { return 4 + base / 2 }
        return base + (verdict == .ready ? 0 : 1)
    }

    /// Up, and not in the middle of failing (a route failing its probes is left for a usable
    /// alternative before hysteresis declares it down).
    public func isUsable(_ state: RouteState) -> Bool {
        rank(state) != nil && state.badStreak < policy.failoverAfter
    }

    /// Where a request goes, best first: the active route, then every other usable route in
    /// the order selection would pick them (the gateway's fallbacks before a response starts).
    public func requestOrder() -> [RouteState] {
        var order: [RouteState] = []
        if let active { order.append(active) }
        let others = routes.values.filter { $0.id != activeID && isUsable($0) }.sorted(by: better)
        order.append(contentsOf: others)
        return order
    }

    /// Model names the server itself routes (to presets or cloud services) and never lists:
    /// they go wherever a request would go anyway.
    public static func isServerRoutedModel(_ model: String) -> Bool {
        let lower = model.lowercased()
        if ["auto", "chat", "code", "reasoning"].contains(lower) { return true }
        return ["preset:", "copilot/", "github-copilot/", "gemini-cli/"].contains { lower.hasPrefix($0) }
    }

    /// Where a request for `model` goes, best first: usable routes whose server has the model
    /// loaded, then those whose models are not known; when no server reports it, the usual
    /// order (the server then answers "model not found" itself). Only routes the trust policy
    /// allows are ever considered.
    public func requestOrder(model: String?) -> [RouteState] {
        let order = requestOrder()
        guard let model, !model.isEmpty, !Self.isServerRoutedModel(model) else { return order }
        let having = order.filter { $0.lastReport?.models?.contains(model) == true && isUsable($0) }
        guard !having.isEmpty else { return order }
        return having + order.filter { $0.lastReport?.models == nil && isUsable($0) }
    }

    /// Why a request for `model` must not be forwarded at all: no route the agent may use has
    /// it (and every one of them lists its models), while servers the agent does not trust do.
    /// Sending it anyway would give a stranger's server a reason to be asked next time; the
    /// answer names the model and those servers, marked untrusted. `nil`: forward as usual.
    public func untrustedOnly(model: String?) -> String? {
        guard let model, !model.isEmpty, !Self.isServerRoutedModel(model) else { return nil }
        let usable = routes.values.filter(isUsable)
        if usable.contains(where: { $0.lastReport?.models == nil || $0.lastReport?.models?.contains(model) == true }) { return nil }
        let strangers = routes.values.filter { !isAllowed($0) && $0.lastReport?.models?.contains(model) == true }
            .sorted { $0.id < $1.id }
        guard !strangers.isEmpty else { return nil }
        let named = strangers.prefix(3).map { "\($0.route.name) at \(Self.hostPort($0.route.baseURL)) (untrusted: \(untrustedWhy($0)))" }
        return "model \(ServerTable.printable(model)) is loaded only on servers this agent does not trust: "
            + named.joined(separator: ", ") + (strangers.count > 3 ? " and \(strangers.count - 3) more" : "")
    }

    /// The best usable route for `model`, and why.
    public func resolve(model: String) -> (state: RouteState?, reason: String) {
        if Self.isServerRoutedModel(model) {
            return (active, "\(model) is routed by the server itself: the active endpoint")
        }
        if let refusal = untrustedOnly(model: model) { return (nil, refusal) }
        let order = requestOrder()
        if let best = order.first(where: { $0.lastReport?.models?.contains(model) == true && isUsable($0) }) {
            let note = best.id == activeID ? "the active endpoint has it loaded" : "\(best.route.name) has it loaded (the active endpoint does not)"
            return (best, note)
        }
        if let unknown = order.first(where: { $0.lastReport?.models == nil && isUsable($0) }) {
            return (unknown, "no server reports \(model); \(unknown.route.name) does not list its models (no inference key?)")
        }
        return (nil, order.isEmpty ? "no usable endpoint" : "no usable server has \(model) loaded")
    }

    /// `http://10.0.0.5:1234` → `10.0.0.5:1234`.
    static func hostPort(_ baseURL: String) -> String {
        baseURL.firstRange(of: "://").map { String(baseURL[$0.upperBound...]) } ?? baseURL
    }

    /// Why a route the trust policy does not allow is not used, for people.
    public func untrustedWhy(_ state: RouteState) -> String {
        if trust(of: state) == .impostor, let instance = state.instanceID, let owner = instanceOwners[instance] {
            let sameAddress = routes.values.contains {
                $0.route.source.isSetUp && $0.id != state.id && Self.hostPort($0.route.baseURL) == Self.hostPort(state.route.baseURL)
            }
            if sameAddress {
                return "announced over plain http:// at an address \(ServerTable.printable(owner)) is set up for with https://"
            }
            return "claims \(ServerTable.printable(owner))'s instance_id from an address \(ServerTable.printable(owner)) does not vouch for"
        }
        return "announced over mDNS, not vouched for by a pairing, a configured endpoint or a tunnel (trust: \(policy.trust.rawValue))"
    }

    /// Ranks better than the active route, so it will replace it once it has proved itself.
    private func isPendingUpgrade(_ state: RouteState) -> Bool {
        guard let active, active.id != state.id, let activeRank = rank(active), let r = rank(state) else { return false }
        return r < activeRank
    }

    /// `a` comes before `b` in the user's `prefer` list (or `b` is not in it): among routes of
    /// equal rank, worth moving to, after the stability window like any return.
    func isPreferredOver(_ a: RouteState, _ b: RouteState) -> Bool {
        let pa = preference(a)
        return pa < policy.preferredInstances.count && pa < preference(b)
    }

    /// Lower is preferred: the position in the `prefer` list, then pinned instances, then the rest.
    private func preference(_ state: RouteState) -> Int {
        guard let instance = state.instanceID else { return Int.max }
        if let index = policy.preferredInstances.firstIndex(of: instance) { return index }
        return pinnedInstances.contains(instance) ? policy.preferredInstances.count : Int.max
    }

    /// Orders equals: preferred or pinned instance first, then lowest smoothed latency.
    private func better(_ a: RouteState, _ b: RouteState) -> Bool {
        let ra = rank(a) ?? 9, rb = rank(b) ?? 9
        if ra != rb { return ra < rb }
        let pa = preference(a), pb = preference(b)
        if pa != pb { return pa < pb }
        let la = a.smoothedLatency ?? .infinity, lb = b.smoothedLatency ?? .infinity
        if la != lb { return la < lb }
        return a.id < b.id
    }

    mutating func select(now: Double, lostReason: String? = nil) -> [PlannerEvent] {
        let current = active
        let planner = self  // a copy-on-write snapshot the lazy closures can capture
        let usable = planner.routes.values.lazy.filter(planner.isUsable)
        if let current, isUsable(current), let currentRank = rank(current) {
            // Stay among equals; move up only to a route that has been healthy for the window.
            let window = policy.stabilityWindow
            let upgrades = usable.filter { state in
                guard let r = planner.rank(state), let since = state.healthySince,
                    r < currentRank || (r == currentRank && planner.isPreferredOver(state, current))
                else { return false }
                // A route that has never failed has no flapping to guard against (a server that
                // just appeared); one that came back must stay healthy for the window.
                return state.failureCount == 0 || now - since >= window
            }
            guard let best = upgrades.min(by: planner.better) else { return [] }
            return switchActive(
                to: best, now: now,
                reason: planner.rank(best) == currentRank
                ? "\(describe(best)) comes before \(describe(current)) in prefer"
                : best.failureCount == 0
                ? "\(describe(best)) is better than \(describe(current))"
                : "\(describe(best)) healthy for \(Int(policy.stabilityWindow)) s, better than \(describe(current))")
        }
        guard let best = usable.min(by: planner.better) else {
            // A failing active route with nothing better is kept until hysteresis says down.
            guard let current, rank(current) == nil else { return [] }
            return switchActive(to: nil, now: now, reason: lostReason ?? "no usable endpoint")
        }
        let reason: String
        if let lostReason {
            reason = lostReason
        } else if let current {
            reason = "\(current.route.name) is \(current.verdict?.rawValue ?? "unusable")"
        } else {
            reason = "first usable endpoint"
        }
        return switchActive(to: best, now: now, reason: reason)
    }

    private mutating func switchActive(to new: RouteState?, now: Double, reason: String) -> [PlannerEvent] {
        let old = active
        guard old?.id != new?.id else { return [] }
        activeID = new?.id
        activeSince = new == nil ? nil : now
        if let id = new?.id {
            lastGoodID = id
            // The new active route is watched closely from now on.
            routes[id]!.nextProbeAt = min(routes[id]!.nextProbeAt, now + policy.activeInterval)
        }
        return [.activeChanged(from: old, to: new.flatMap { routes[$0.id] }, reason: reason)]
    }

    private func describe(_ state: RouteState) -> String {
        "\(state.route.name) (\(state.route.via.rawValue) \(state.verdict?.rawValue ?? "unknown"))"
    }

    private func describe(_ report: ProbeReport) -> String {
        report.detail.map { "\(report.verdict.rawValue): \($0)" } ?? report.verdict.rawValue
    }

    /// Why a route is or is not the active one, for people.
    public func explain(_ state: RouteState, now: Double) -> String {
        if state.id == activeID { return "active" }
        switch state.health {
        case .unknown:
            return state.inFlight ? "probing" : "not probed yet"
        case .down:
            if trust(of: state) == .impostor { return "not used: " + untrustedWhy(state) }
            let detail = state.lastReport.map(describe) ?? "down"
            return "\(detail)"
        case .up:
            if !isAllowed(state) { return "not used: " + untrustedWhy(state) }
            guard isUsable(state) else { return "failing: \(state.badStreak) bad probe(s) in a row" }
            if lacksRequiredKey(state) {
                let why = policy.lanKeys == .never && state.route.via == .lan ? " (lan_keys: never)" : ""
                return "not ready for inference: the server requires an inference key and this route carries none\(why)"
            }
            guard let active, let activeRank = rank(active), let r = rank(state) else { return "standby" }
            if r > activeRank { return "standby: active endpoint ranks higher" }
            if r < activeRank {
                let healthy = state.healthySince.map { now - $0 } ?? 0
                return "better, waiting for the stability window (\(Int(healthy)) of \(Int(policy.stabilityWindow)) s)"
            }
            if let a = active.instanceID, a == state.instanceID { return "standby: same server as the active endpoint" }
            return "standby: equal to the active endpoint, which is kept"
        }
    }
}

/// A small deterministic generator for probe jitter, so the core's tests replay exactly (and the
/// fuzz tests can replay a failure from its seed).
struct SplitMix64: Sendable, Hashable, RandomNumberGenerator {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
