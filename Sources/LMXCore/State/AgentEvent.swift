/// Everything the agent tells its outputs (the watch hub, the event recorder, the log, metrics,
/// `endpoint.env`, the passive-health follower): the one enum they all read. A change's reason
/// comes twice: a sentence for people (`reason`) and a ``Cause`` for programs (`cause`).
public enum AgentEvent: Sendable {
    case routeAdded(RouteState, quiet: Bool)
    case routeRemoved(RouteState, reason: String, cause: Cause)
    /// `cause`: nil when the server is ready.
    case healthChanged(RouteState, from: HealthVerdict?, reason: String, cause: Cause?)
    case activeChanged(from: RouteState?, to: RouteState?, reason: String, cause: Cause)
    /// An announcer repeating a set-up server's instance id from an unvouched address.
    case impostor(RouteState, owner: String, why: String)
    /// A tunnel listed the LAN addresses it vouches for.
    case vouchesChanged(tunnelID: String, baseURLs: [String], instanceID: String?)
    case pairing(PairingChange, id: String, detail: String, routes: [String] = [])
    case discoveryChanged(DiscoveryState)
    /// A found route (announced, or remembered from an announcement) was announced, or a probe told
    /// who answers at it: remembered in the store.
    case serverSeen(Route, instanceID: String?)
    /// A probe finished (statistics, metrics).
    case probed(RouteState, report: ProbeReport)
    /// An announcement ignored because too many servers are followed.
    case announcementIgnored
    /// The active server sent an event on its `/admin/events` stream.
    case serverEventReceived
    /// The agent started, reloaded its configuration or learned the gateway's address.
    case configured
    /// This machine's network changed, or it woke from sleep (`detail` says what).
    case machine(MachineChange, detail: String)

    public enum MachineChange: String, Sendable {
        case network, wake
    }

    public enum PairingChange: String, Sendable {
        case added = "pairing-added", updated = "pairing-updated", removed = "pairing-removed", expired =
            "pairing-expired"
    }

    /// The row this event adds to the event history (`/v1/events`), if any: its kind, route,
    /// from, to, reason and cause (nil where the kind says it all: a route found, a pairing, this
    /// machine's network or a wake).
    public var record: (kind: String, routeID: String?, from: String?, to: String?, reason: String, cause: Cause?)? {
        switch self {
        case .routeAdded(let state, _):
            ("candidate-added", state.id, nil, nil, "\(state.route.source.rawValue): \(state.route.name)", nil)
        case .routeRemoved(let state, let reason, let cause):
            ("candidate-removed", state.id, nil, nil, reason, cause)
        case .healthChanged(let state, let from, let reason, let cause):
            ("health", state.id, from?.rawValue, state.verdict?.rawValue, reason, cause)
        case .activeChanged(let from, let to, let reason, let cause):
            ("active", to?.id, from?.id, to?.id, reason, cause)
        case .impostor(let state, _, let why):
            ("impostor", state.id, nil, nil, why, .impostor)
        case .pairing(let change, let id, let detail, _):
            switch change {
            case .added, .updated: (change.rawValue, nil, nil, id, detail, nil)
            case .removed, .expired: (change.rawValue, nil, id, nil, detail, nil)
            }
        case .machine(let change, let detail):
            (change.rawValue, nil, nil, nil, detail, nil)
        case .vouchesChanged, .discoveryChanged, .serverSeen, .probed, .announcementIgnored, .serverEventReceived,
            .configured:
            nil
        }
    }

    /// The `/v1/watch` line this event becomes (numbered by the hub), if any.
    public func watchLine(in snapshot: AgentSnapshot, now: Double) -> StatusAPI.WatchLine? {
        let at = snapshot.iso(now)
        switch self {
        case .routeAdded(let state, _):
            return .init(type: .candidateAdded, seq: 0, at: at, route: snapshot.routeStatus(state, now: now))
        case .routeRemoved(let state, let reason, let cause):
            return .init(
                type: .candidateRemoved, seq: 0, at: at, route: snapshot.routeStatus(state, now: now), reason: reason,
                cause: cause)
        case .healthChanged(let state, _, let reason, let cause):
            return .init(
                type: .health, seq: 0, at: at, route: snapshot.routeStatus(state, now: now), reason: reason,
                cause: cause)
        case .activeChanged(_, let to, let reason, let cause):
            // The route this switch went to (a batch's switches are coalesced before they are
            // published, so this is the active route of the snapshot).
            return .init(
                type: .active, seq: 0, at: at, active: to.flatMap { snapshot.endpoint($0, now: now) }, reason: reason,
                cause: cause)
        case .discoveryChanged(let state):
            return .init(type: .avahi, seq: 0, at: at, avahi: state.name, reason: state.detail)
        default:
            return nil
        }
    }
}

extension AgentEvent {
    /// One batch's switches of the active route as people and programs see them: several become
    /// one, from where the first started to where the last went, placed where the last was (after
    /// what caused it); a batch that ends where it began has no switch at all. (Importing a
    /// pairing for the server in use replaces its route by one with the same id: gone, then
    /// back, in one step — nothing moved.)
    public static func coalescingSwitches(_ events: [AgentEvent]) -> [AgentEvent] {
        var switches: [(index: Int, from: RouteState?, to: RouteState?, reason: String, cause: Cause)] = []
        for (index, event) in events.enumerated() {
            if case .activeChanged(let from, let to, let reason, let cause) = event {
                switches.append((index, from, to, reason, cause))
            }
        }
        guard switches.count > 1, let first = switches.first, let last = switches.last else { return events }
        var out: [AgentEvent] = []
        out.reserveCapacity(events.count)
        for (index, event) in events.enumerated() {
            if case .activeChanged = event {
                if index == last.index, first.from?.id != last.to?.id {
                    out.append(.activeChanged(from: first.from, to: last.to, reason: last.reason, cause: last.cause))
                }
            } else {
                out.append(event)
            }
        }
        return out
    }
}

extension AgentEvent {
    /// The event as a sentence for people (``EventWords``), naming routes as `snapshot` knows
    /// them, or as the event carries them (a route just removed); nil for events the history
    /// does not keep.
    public func sentence(in snapshot: AgentSnapshot) -> String? {
        guard let row = record else { return nil }
        var own: [String: RouteState] = [:]
        switch self {
        case .routeAdded(let state, _), .routeRemoved(let state, _, _), .healthChanged(let state, _, _, _),
            .impostor(let state, _, _):
            own[state.id] = state
        case .activeChanged(let from, let to, _, _):
            for state in [from, to].compactMap(\.self) { own[state.id] = state }
        default:
            break
        }
        return EventWords.sentence(
            kind: row.kind, routeID: row.routeID, to: row.to, reason: row.reason,
            place: { id in own[id].map(snapshot.planner.place) ?? snapshot.place(id) })
    }
}

extension AgentEvent {
    /// What the planner decided, as the outputs read it (`quiet`: restored at start, not logged
    /// as new).
    public static func from(_ events: [PlannerEvent], of planner: ConnectionPlanner, quiet: Bool = false)
        -> [AgentEvent]
    {
        events.compactMap { event in
            switch event {
            case .routeAdded(let state): .routeAdded(state, quiet: quiet)
            case .routeRemoved(let state, let reason, let cause): .routeRemoved(state, reason: reason, cause: cause)
            case .healthChanged(let state, let from, let reason, let cause):
                .healthChanged(state, from: from, reason: reason, cause: cause)
            case .routeUpdated: nil
            case .activeChanged(let from, let to, let reason, let cause):
                .activeChanged(from: from, to: to, reason: reason, cause: cause)
            case .impostor(let state, let owner): .impostor(state, owner: owner, why: planner.untrustedWhy(state))
            case .vouchesChanged(let id, let urls, let instance):
                .vouchesChanged(tunnelID: id, baseURLs: urls, instanceID: instance)
            }
        }
    }
}
