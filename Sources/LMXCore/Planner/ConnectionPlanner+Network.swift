// This machine's network and sleep: what the agent learns from the kernel (links, addresses,
// routes) and from logind or the clocks (a wake), as opposed to what the servers answer.

extension ConnectionPlanner {
    /// The paths to LAN routes after a change of this machine's network. A route whose path is
    /// gone (no route, no carrier) or that is no longer on a subnet of this machine's leaves the
    /// selection at once, without waiting for probes to time out, until a probe gets through; a
    /// route whose path merely changed is suspect: its next probe alone decides. Either is
    /// probed now. A route seen for the first time only records its path.
    public mutating func applyPaths(_ paths: [String: RoutePath], now: Double) -> [PlannerEvent] {
        var events: [PlannerEvent] = []
        var lost: [(String, Cause)] = []
        for (id, path) in paths.sorted(by: { $0.key < $1.key }) {
            guard var state = routes[id] else { continue }
            let old = state.path
            state.path = path
            defer { routes[id] = state }
            guard let old, old != path else { continue }
            let wasOff = state.offNetwork != nil
            switch path {
            case .unreachable(let why, let cause):
                state.condition = state.condition.replacingBase(with: .offNetwork(why, cause: cause))
                state.pathBackAt = nil
            case .reachable(let detail, let onLink):
                if case .reachable(_, true) = old, !onLink {
                    state.condition = state.condition.replacingBase(
                        with: .offNetwork(
                            "no longer on a network of this machine's (now \(detail))", cause: .leftNetwork))
                } else if state.condition == .normal || state.condition == .returning {
                    state.condition = .suspect
                }
            // A route this machine had left stays out until a probe gets through (now); one
            // lost or stale already has its next probe decide alone.
            }
            if case .reachable = path, wasOff { state.pathBackAt = now }
            if let why = state.offNetwork, id == activeID {
                lost.append(("\(describe(state)) is out of reach (\(why))", state.offNetworkCause ?? .unreachable))
            }
            if !state.inFlight {
                state.nextProbeAt = now
                state.backoff = 0
            }
            events.append(.routeUpdated(state))
        }
        return events + select(now: now, lost: lost.first.map { ("this machine's network changed and \($0.0)", $0.1) })
    }

    /// After a change of this machine's network, routes without a path of their own to check
    /// (tunnels, host names) are probed now too: the way to them may have changed as well.
    public mutating func probeUnpathed(now: Double) {
        for (id, state) in routes where state.path == nil && !state.inFlight {
            routes[id]!.nextProbeAt = now
            routes[id]!.backoff = 0
        }
    }

    /// This machine woke from sleep: every verdict predates it. Everything is probed now, and
    /// no request goes to a route until its first probe since the wake has answered.
    public mutating func woke(now: Double) -> [PlannerEvent] {
        for id in routes.keys {
            let base = routes[id]!.condition.base
            routes[id]!.condition = .stale(since: now, was: base == .suspect ? .normal : base)
            // A probe in flight across the sleep tells nothing: its answer is dropped and the
            // route probed again (see `record`).
            if !routes[id]!.inFlight {
                routes[id]!.nextProbeAt = now
                routes[id]!.backoff = 0
            }
        }
        return []
    }
}
