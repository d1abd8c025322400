// Selection: ranking, the active route, request order and model routing.

extension ConnectionPlanner {
    // MARK: - Selection

    /// Lower is better: LAN ready, LAN alive, WAN ready, WAN alive, then routes without the
    /// inference key their server requires. `nil`: not selectable (down, or not allowed by the
    /// trust policy).
    public func rank(_ state: RouteState) -> Int? {
        guard state.health == .up, let verdict = state.verdict, verdict.isAlive, state.offNetwork == nil,
            isAllowed(state)
        else { return nil }
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
        if usable.contains(where: { $0.lastReport?.models == nil || $0.lastReport?.models?.contains(model) == true }) {
            return nil
        }
        let strangers = routes.values.filter { !isAllowed($0) && $0.lastReport?.models?.contains(model) == true }
            .sorted { $0.id < $1.id }
        guard !strangers.isEmpty else { return nil }
        let named = strangers.prefix(3).map {
            "\($0.route.name) at \($0.route.base.hostPort) (untrusted: \(untrustedWhy($0)))"
        }
        return "model \(ServerTable.printable(model)) is loaded only on servers this agent does not trust: "
            + named.joined(separator: ", ") + (strangers.count > 3 ? " and \(strangers.count - 3) more" : "")
    }

    /// The best usable route for `model`, and why.
    public func resolve(model: String) -> (state: RouteState?, reason: String) {
        if Self.isServerRoutedModel(model) {
            return (active, "\(model) is routed by the server itself: the active server")
        }
        if let refusal = untrustedOnly(model: model) { return (nil, refusal) }
        let order = requestOrder()
        if let best = order.first(where: { $0.lastReport?.models?.contains(model) == true && isUsable($0) }) {
            let note =
                best.id == activeID
                ? "the active server has it loaded"
                : "\(best.route.name) has it loaded (the active server does not)"
            return (best, note)
        }
        if let unknown = order.first(where: { $0.lastReport?.models == nil && isUsable($0) }) {
            return (
                unknown,
                "no server reports \(model); \(unknown.route.name) does not list its models (no inference key?)"
            )
        }
        return (nil, order.isEmpty ? "no server is usable" : "no usable server has \(model) loaded")
    }

    /// Why a route the trust policy does not allow is not used, for people.
    public func untrustedWhy(_ state: RouteState) -> String {
        if trust(of: state) == .impostor, let instance = state.instanceID, let owner = instanceOwners[instance] {
            let sameAddress = routes.values.contains {
                $0.route.source.isSetUp && $0.id != state.id && $0.route.base.hostPort == state.route.base.hostPort
            }
            if sameAddress {
                return
                    "announced over plain http:// at an address \(ServerTable.printable(owner)) is set up for with https://"
            }
            return
                "it claims to be \(ServerTable.printable(owner)) from an address \(ServerTable.printable(owner))'s pairing does not vouch for"
        }
        return
            "announced over mDNS, not vouched for by a pairing, a configured endpoint or a tunnel (trust: \(policy.trust.rawValue))"
    }

    /// Ranks better than the active route, so it will replace it once it has proved itself.
    func isPendingUpgrade(_ state: RouteState) -> Bool {
        guard let active, active.id != state.id, let activeRank = rank(active), let r = rank(state) else {
            return false
        }
        return r < activeRank
    }

    /// `a` comes before `b` in the user's `prefer` list (or `b` is not in it): among routes of
    /// equal rank, worth moving to, after the stability window like any return.
    func isPreferredOver(_ a: RouteState, _ b: RouteState) -> Bool {
        let pa = preference(a)
        return pa < policy.preferredInstances.count && pa < preference(b)
    }

    /// Lower is preferred: the position in the `prefer` list, then pinned instances, then the rest.
    func preference(_ state: RouteState) -> Int {
        guard let instance = state.instanceID else { return Int.max }
        if let index = policy.preferredInstances.firstIndex(of: instance) { return index }
        return pinnedInstances.contains(instance) ? policy.preferredInstances.count : Int.max
    }

    /// Orders equals: preferred or pinned instance first, then lowest smoothed latency.
    func better(_ a: RouteState, _ b: RouteState) -> Bool {
        let ra = rank(a) ?? 9
        let rb = rank(b) ?? 9
        if ra != rb { return ra < rb }
        let pa = preference(a)
        let pb = preference(b)
        if pa != pb { return pa < pb }
        let la = a.smoothedLatency ?? .infinity
        let lb = b.smoothedLatency ?? .infinity
        if la != lb { return la < lb }
        return a.id < b.id
    }

    /// Picks the active route. `lost`: why the active route was just lost, in words and as a
    /// code (the caller knows it better than its state tells).
    mutating func select(now: Double, lost: (reason: String, cause: Cause)? = nil) -> [PlannerEvent] {
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
                // One that failed only because this machine's network changed (or it slept)
                // returns as soon as it answers.
                return state.failureCount == 0 || state.returnAtOnce || now - since >= window
            }
            guard let best = upgrades.min(by: planner.better) else { return [] }
            return switchActive(
                to: best, now: now,
                reason: planner.rank(best) == currentRank
                    ? "\(describe(best)) comes before \(describe(current)) in prefer"
                    : best.failureCount == 0
                        ? "\(describe(best)) is preferred to \(describe(current))"
                        : best.returnAtOnce
                            ? "\(describe(best)) is reachable again from this machine and preferred to \(describe(current))"
                            : "\(describe(best)) has answered well for \(Int(policy.stabilityWindow)) s and is preferred to \(describe(current))",
                cause: planner.rank(best) != currentRank && best.failureCount > 0 && best.returnAtOnce
                    ? .reachableAgain : .preferred
            )
        }
        guard let best = usable.min(by: planner.better) else {
            // A failing active route with nothing better is kept until hysteresis says down.
            guard let current, rank(current) == nil else { return [] }
            return switchActive(
                to: nil, now: now, reason: lost?.reason ?? "no server answers", cause: lost?.cause ?? lossCause(current)
            )
        }
        let reason: String
        let cause: Cause
        if let lost {
            (reason, cause) = lost
        } else if let current {
            reason =
                current.verdict.map { EventWords.situation(place(current), $0, detail: nil) }
                ?? "\(describe(current)) is not usable"
            cause = lossCause(current)
        } else {
            reason = "the first server usable from here"
            cause = .firstUsable
        }
        return switchActive(to: best, now: now, reason: reason, cause: cause)
    }

    /// Why a route is not usable, as a code, from what its state tells: the trust policy, this
    /// machine's network, else its last probe.
    func lossCause(_ state: RouteState) -> Cause {
        switch trust(of: state) {
        case .impostor: return .impostor
        case .announced where !isAllowed(state): return .untrusted
        default: break
        }
        if let cause = state.offNetworkCause { return cause }
        return state.lastReport?.effectiveCause ?? state.verdict.flatMap(Cause.init(verdict:)) ?? .unknown
    }

    mutating func switchActive(to new: RouteState?, now: Double, reason: String, cause: Cause) -> [PlannerEvent] {
        let old = active
        guard old?.id != new?.id else { return [] }
        activeID = new?.id
        activeSince = new == nil ? nil : now
        if let id = new?.id {
            lastGoodID = id
            // The new active route is watched closely from now on.
            routes[id]!.nextProbeAt = min(routes[id]!.nextProbeAt, now + policy.activeInterval)
        } else {
            // Nothing usable: tunnels left to the idle standby's slow watch while down are asked
            // again now (``schedule(_:report:now:)``).
            for (id, state) in routes where state.route.via == .wan && state.health == .down && !state.inFlight {
                routes[id]!.nextProbeAt = min(state.nextProbeAt, now + policy.restartInterval)
            }
        }
        return [.activeChanged(from: old, to: new.flatMap { routes[$0.id] }, reason: reason, cause: cause)]
    }

}
