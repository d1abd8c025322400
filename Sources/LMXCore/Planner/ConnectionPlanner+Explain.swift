// Explanations: why each route is where it is, in words for people.

extension ConnectionPlanner {
    func describe(_ state: RouteState) -> String {
        "\(state.route.name) (\(state.route.via.rawValue) \(state.verdict?.rawValue ?? "unknown"))"
    }

    func describe(_ report: ProbeReport) -> String {
        report.detail.map { "\(report.verdict.rawValue): \($0)" } ?? report.verdict.rawValue
    }

    /// Why a route is or is not the active one, for people.
    public func explain(_ state: RouteState, now: Double) -> String {
        if state.id == activeID { return state.stale ? "active, probing again after this machine woke" : "active" }
        if let why = state.offNetwork { return "not reachable from this machine now: \(why)" }
        if state.stale { return "probing again after this machine woke" }
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
