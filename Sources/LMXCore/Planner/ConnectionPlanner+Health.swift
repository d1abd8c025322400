// Health: probe results through hysteresis, and the next probe of each route.

extension ConnectionPlanner {
    /// Records the result of one probe and decides what follows.
    /// `probe`: false for what the gateway found (``recordForeign(_:for:now:)``): a probe in
    /// flight is left to finish, and is judged when it does.
    public mutating func record(
        _ report: ProbeReport, for routeID: String, full: Bool = true, probe: Bool = true, now: Double
    ) -> [PlannerEvent] {
        guard var state = routes[routeID] else { return [] }
        let started = probe ? state.probe : .idle
        if probe { state.probe = .idle }
        let freshCheck = probe && state.freshCheck
        if probe { state.freshCheck = false }
        if let since = state.staleSince, case .inFlight(let startedAt) = started, startedAt < since {
            // Started before this machine slept: says nothing of now. Probe again at once.
            state.nextProbeAt = now
            routes[routeID] = state
            return []
        }
        var startedAt: Double?
        if case .inFlight(let since) = started { startedAt = since }
        if isBusyNotGone(state, report, startedAt: startedAt) {
            // Busy, not gone: the gateway's own traffic is the proof of life. Nothing is
            // counted against the route; it is looked at again on its usual schedule.
            state.lastProbeAt = now
            state.probeCount += 1
            state.busyProbes += 1
            state.nextProbeAt = now + (state.id == activeID ? policy.activeInterval : policy.pendingInterval)
            routes[routeID] = state
            return [.routeUpdated(state)]
        }
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
        if let finding = state.foreign {
            if report.apiAnswered == true {
                // The server answered its API itself: the page is gone (a new token, the portal
                // passed).
                state.foreign = nil
            } else if report.verdict.isAlive {
                // Its health paths answer, its API did not (or was not asked yet): the finding stands.
                report.verdict = finding.verdict
                report.detail = finding.detail
                report.cause = finding.cause
            }
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
        if good {
            state.lastGoodAt = now
            state.pathBackAt = nil
        }

        // The first probe after this machine's network changed or it woke decides alone: a
        // verdict from before means nothing, and a failure there is no flapping of the server.
        // So does a check asked for before the route is handed out: a route that vanished
        // while nobody looked is not handed out once more.
        // And a page that is not the server's: one is certain, no flapping of the server.
        let decisive = state.condition.decidesAlone || freshCheck || state.foreign != nil
        state.condition = state.condition.afterProbe(good: good)

        switch (state.health, good) {
        case (.unknown, _):
            // Nothing to flap from yet: the first probe sets the health.
            state.health = good ? .up : .down
            state.verdict = report.verdict
        case (.up, false) where decisive, (.down, true) where state.returnAtOnce:
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
            events.append(.healthChanged(state, from: before, reason: describe(report), cause: report.effectiveCause))
        } else {
            events.append(.routeUpdated(state))
        }
        if learned { events += flagImpostors() }
        if full, state.route.via == .wan, let advertised = report.advertisedBaseURLs, report.verdict != .wrongService {
            // Re-read on every full probe of the tunnel: the server's own word on where it is.
            events += applyVouches(
                for: routeID, advertised: advertised, instanceID: report.instanceID ?? state.instanceID, now: now)
        }
        let lost =
            routeID == activeID && !isUsable(state)
            ? (
                EventWords.situation(place(state), report.verdict, detail: report.detail),
                report.effectiveCause ?? lossCause(state)
            ) : nil
        return events + select(now: now, lost: lost)
    }

    /// A request through the route was answered by a page that is not the server's (a login
    /// page, a tunnel's error page, a captive portal): the route is marked with that cause at
    /// once, and stays so, whatever its health paths answer, until the server answers its API
    /// itself (its probes ask `/v1/models` meanwhile: ``ProbeTask/checkAPI``).
    public mutating func recordForeign(_ foreign: ForeignAnswer, for routeID: String, now: Double) -> [PlannerEvent] {
        guard routes[routeID] != nil else { return [] }
        routes[routeID]!.foreign = foreign
        let report = ProbeReport(verdict: foreign.verdict, latency: 0, detail: foreign.detail, cause: foreign.cause)
        return record(report, for: routeID, full: false, probe: false, now: now)
    }

    mutating func schedule(_ state: inout RouteState, report: ProbeReport, now: Double) {
        let good = report.verdict.isAlive
        let isActive = state.id == activeID
        let pending = (state.health == .up) != good  // the last probe disagrees with the health
        var delay: Double
        if !good, let back = state.pathBackAt, now - back < Self.pathReturnWindow {
            // The way to it just came back: attempts one after another, each giving up on its
            // connection quickly, so the route is back as soon as its link is; at most one
            // attempt starts per quick connect timeout (a host that refuses at once is not asked
            // fifty times a second).
            state.backoff = 0
            delay = max(Self.pathReturnRetry, Self.pathReturnConnectTimeout - report.latency)
        } else if pending {
            delay = isActive ? policy.confirmInterval : policy.pendingInterval
            state.backoff = 0
        } else if good, !isActive, isPendingUpgrade(state) {
            // A better route is proving itself for the stability window: watch it closely, so a
            // flapping server is caught rather than sampled between its failures.
            state.backoff = 0
            delay = policy.pendingInterval
        } else if good {
            // Probing follows use: while nothing uses the agent, its active server is checked
            // every `idle_interval` and standbys every `wan_standby_interval`.
            state.backoff = 0
            let idle = isIdle(now: now)
            let base =
                isActive
                ? (idle ? policy.idleInterval : policy.activeInterval)
                : state.route.via == .wan || idle ? policy.wanStandbyInterval : policy.stableInterval
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
        if !good, !pending, !isActive, activeID != nil, state.route.via == .wan, isIdle(now: now),
            state.pathBackAt.map({ now - $0 >= Self.pathReturnWindow }) ?? true
        {
            // A tunnel standby that is down while the idle agent has a route is asked once a
            // `wan_standby_interval`, as a healthy one is, not every second of the restart watch:
            // nothing waits on it, and Cloudflare's edge answers each of those requests. Should
            // the agent lose its route, it is asked again at once (``switchActive``).
            delay = max(delay, jittered(policy.wanStandbyInterval))
        }
        // Retry-After steers preference (an overloaded server ranks lower) and spares standbys;
        // it never blinds the agent to its active route, and never for more than maxRetryAfter.
        if let retryAfter = report.retryAfter, report.verdict == .overloaded, !isActive {
            delay = max(delay, min(retryAfter, policy.maxRetryAfter))
        }
        state.nextProbeAt = now + delay
    }

    mutating func jittered(_ base: Double, spread: Double? = nil) -> Double {
        let spread = spread ?? policy.jitter
        guard spread > 0 else { return base }
        let unit = Double(random.next() >> 11) / Double(1 << 53)  // [0, 1)
        return base * (1 - spread + 2 * spread * unit)
    }

}
