// Explanations: why each route is where it is, in words for people.

extension ConnectionPlanner {
    /// A route as a sentence names it: "Studio on the LAN", "Studio through its tunnel".
    func describe(_ state: RouteState) -> String { place(state).words }

    public func place(_ state: RouteState) -> EventWords.Place { .init(name: state.route.name, via: state.route.via) }

    /// A probe's verdict and detail as one phrase for people: what the server did, then why,
    /// never the same words twice ("not answering: nothing accepts connections on that port",
    /// "answers but is not ready: no models loaded", "ready"). The verdict's code stays in the
    /// JSON for programs.
    func describe(_ report: ProbeReport) -> String {
        let phrase = EventWords.phrase(report.verdict)
        guard let detail = report.detail, !detail.isEmpty, detail != report.verdict.rawValue,
            !phrase.contains(detail.lowercased())
        else { return phrase }
        return "\(phrase): \(detail)"
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
            guard isUsable(state) else {
                let last = state.lastReport.map { " (\(describe($0)))" } ?? ""
                return state.badStreak == 1
                    ? "failing: its last probe failed\(last)"
                    : "failing: its last \(state.badStreak) probes failed\(last)"
            }
            if lacksRequiredKey(state) {
                let why = policy.lanKeys == .never && state.route.via == .lan ? " (lan_keys: never)" : ""
                return "not ready for inference: the server requires an inference key and this route carries none\(why)"
            }
            guard let active, let activeRank = rank(active), let r = rank(state) else { return "standby" }
            if r > activeRank { return "standby: the active route is preferred" }
            if r < activeRank {
                let healthy = state.healthySince.map { now - $0 } ?? 0
                return
                    "preferred, used once it has answered well for \(Int(policy.stabilityWindow)) s (\(Int(healthy)) s so far)"
            }
            if let a = active.instanceID, a == state.instanceID { return "standby: another route to the server in use" }
            return "standby: as good as the active route, which is kept"
        }
    }

    /// What ``explain(_:now:)`` tells, as a code: nil when nothing keeps the route from use
    /// (active, standby, preferred) or nothing is known yet.
    public func explainCause(_ state: RouteState) -> Cause? {
        if state.id == activeID { return nil }
        if let cause = state.offNetworkCause { return cause }
        if state.stale { return nil }
        switch state.health {
        case .unknown:
            return nil
        case .down:
            if trust(of: state) == .impostor { return .impostor }
            return state.lastReport?.effectiveCause
        case .up:
            if !isAllowed(state) { return lossCause(state) }
            guard isUsable(state) else { return state.lastReport?.effectiveCause }
            return lacksRequiredKey(state) ? .keyMissing : nil
        }
    }
}
