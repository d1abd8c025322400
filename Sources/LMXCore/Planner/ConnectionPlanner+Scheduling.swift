// Scheduling: which probes are due, and when the planner next needs the clock.

extension ConnectionPlanner {
    /// Routes to probe now, at most `maxConcurrentProbes` in flight; marks them in flight.
    /// The active route comes first, then the last-good one, then the most overdue.
    public mutating func takeDueProbes(now: Double) -> [ProbeTask] {
        // Lazy everywhere on the hot paths: RouteState copies (strings, arrays) dominate otherwise.
        // One pass for the counts: probes in flight, those of LAN-found routes, and the others.
        var inFlight = 0
        var bulkInFlight = 0
        var others = 0
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
        deferProvenActive(now: now)
        let sorted = routes.values.lazy.filter { !$0.inFlight && $0.nextProbeAt <= now }
            .sorted { a, b in
                let pa = priority(a)
                let pb = priority(b)
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
        for state in due {
            routes[state.id]!.probe = .inFlight(since: now)
        }
        return due.map { state in
            // The active route (and a standby) is checked cheaply; now and then, in full.
            let quick = mayCheckQuickly(state, now: now)
            let returning = state.pathBackAt.map { now - $0 < Self.pathReturnWindow } ?? false
            // A check before the route is handed out decides alone: it connects within a LAN's SYN
            // on the LAN, within a resent SYN through a tunnel (a phone's way to Cloudflare).
            let connectTimeout: Double? =
                returning || state.freshCheck && state.route.via == .lan
                ? Self.pathReturnConnectTimeout
                : state.freshCheck ? Self.freshTunnelConnectTimeout : nil
            return ProbeTask(
                route: state.route, full: !quick, connectTimeout: connectTimeout, checkAPI: state.foreign != nil)
        }
    }

    /// While traffic flows, it is the health signal and probes fill only the gaps: an active
    /// route due for a quick check that the gateway's traffic proved alive within
    /// `active_interval` is looked at again `active_interval` after that proof instead.
    mutating func deferProvenActive(now: Double) {
        guard let id = activeID, let state = routes[id], !state.inFlight, state.nextProbeAt <= now,
            !state.freshCheck, mayCheckQuickly(state, now: now), let heard = state.trafficAt,
            now - heard < policy.activeInterval
        else { return }
        routes[id]!.nextProbeAt = heard + policy.activeInterval
    }

    /// How long after the way to a route came back its probes connect quickly and follow each
    /// other at once (``RouteState/pathBackAt``).
    public static let pathReturnWindow: Double = 10
    /// A connection attempt's timeout then: a LAN answers a SYN within milliseconds.
    public static let pathReturnConnectTimeout: Double = 0.25
    /// A tunnel's connection timeout in the check before it is handed out: a SYN lost once is
    /// sent again after 1 s, and the answer stays within `lmx-status`'s 5 s.
    public static let freshTunnelConnectTimeout: Double = 2
    /// The delay before the next probe then, after one that failed.
    public static let pathReturnRetry: Double = 0.02

    /// Probe slots that routes found on the LAN may not use (see `takeDueProbes`).
    static let reservedSlots = 2

    /// A route found on the LAN (or remembered from it) that is neither active nor last-good.
    func isBulk(_ state: RouteState) -> Bool {
        state.route.source.isFound && state.id != activeID && state.id != lastGoodID
    }

    func priority(_ state: RouteState) -> Int {
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
                    self.rank(state).map {
                        $0 < activeRank || ($0 == activeRank && self.isPreferredOver(state, active))
                    } ?? false
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
        let activeID = self.activeID
        let forgetAfter = policy.forgetAfter
        // Withdrawn (or only remembered) for `forget_after`: forgotten, even if it still answers
        // (an announcer that comes and goes must not leave routes behind for ever).
        let forgotten = routes.values.lazy.filter { state in
            state.route.source.isFound && !state.route.announced && state.id != activeID
                && now - (state.withdrawnAt ?? now) >= forgetAfter
        }.map(\.id)
        for id in Array(forgotten) {
            guard let state = routes.removeValue(forKey: id) else { continue }
            events.append(
                .routeRemoved(
                    state, reason: "not announced on the LAN for \(Int(policy.forgetAfter)) s", cause: .forgotten))
        }
        return events + select(now: now)
    }

    /// Found routes (announced, withdrawn and remembered) kept at most by default
    /// (`HealthPolicy.maxFoundRoutes`): past it the withdrawn ones seen longest ago go first, with
    /// their rows. Announced ones are bounded on their own (`RouteSources.maxAnnounced`), so there
    /// is always a withdrawn one to let go.
    public static let maxFoundRoutes = 2 * RouteSources.maxAnnounced

    /// Lets go of the withdrawn found routes past `maxFoundRoutes`, oldest first, down to 15/16
    /// of the bound (so that a steady churn sorts once per hundred announcements, not each).
    mutating func evictFound(now: Double) -> [PlannerEvent] {
        var found = 0
        for state in routes.values where state.route.source.isFound { found += 1 }
        let bound = policy.maxFoundRoutes
        guard found > bound else { return [] }
        let activeID = self.activeID
        let candidates = routes.values
            .filter { $0.route.source.isFound && !$0.route.announced && $0.id != activeID }
            .sorted { ($0.withdrawnAt ?? now, $0.id) < ($1.withdrawnAt ?? now, $1.id) }
        var events: [PlannerEvent] = []
        for state in candidates.prefix(found - bound + bound / 16) {
            routes.removeValue(forKey: state.id)
            events.append(
                .routeRemoved(
                    state,
                    reason: "more than \(bound) servers seen on the LAN: the one withdrawn longest ago is forgotten",
                    cause: .forgotten))
        }
        return events
    }

}
