/// Turns what the manager publishes (events and the snapshot they led to) into the history's
/// rows: a ``HistoryTransition`` whenever a route's state or use changes, with the event's
/// sentence as its cause (and the event's ``Cause`` code beside it), and each probe's latency into the minute's figures. A value, fed in
/// order; the daemon's recorder holds one and writes what it returns.
public struct HistoryTracker: Sendable {
    /// What a route was doing when last seen, to record only changes.
    struct Mark: Hashable {
        var state: RibbonState
        var active: Bool
    }
    private var marks: [String: Mark] = [:]
    public var minutes = HistoryMinutes()

    public init() {}

    /// The changes `events` and `snapshot` make, at `at` (seconds since 1970).
    public mutating func receive(_ events: [AgentEvent], snapshot: AgentSnapshot, at: Double) -> [HistoryTransition] {
        var causes: [String: (sentence: String, code: Cause?)] = [:]
        // A switch's sentence says more than its ends' own changes told in the same batch.
        var switched: [String: (sentence: String, code: Cause?)] = [:]
        var removed: [String: (route: RouteState, cause: String, code: Cause)] = [:]
        for event in events {
            switch event {
            case .routeAdded(let route, _), .healthChanged(let route, _, _, _):
                if let sentence = event.sentence(in: snapshot) { causes[route.id] = (sentence, event.record?.cause) }
            case .activeChanged(let from, let to, _, let code):
                // The switch's sentence is the cause of both ends' change.
                if let sentence = event.sentence(in: snapshot) {
                    for id in [from?.id, to?.id].compactMap(\.self) { switched[id] = (sentence, code) }
                }
            case .routeRemoved(let route, let reason, let code):
                removed[route.id] = (route, event.sentence(in: snapshot) ?? reason, code)
            case .probed(let route, let report):
                minutes.probed(route: route.id, at: at, latency: report.latency)
            default:
                break
            }
        }
        let planner = snapshot.planner
        var changes: [HistoryTransition] = []
        for route in planner.sortedRoutes {
            let mark = Mark(
                state: RibbonState(health: route.health, verdict: route.verdict), active: route.id == planner.activeID)
            guard marks[route.id] != mark else { continue }
            marks[route.id] = mark
            let cause: (sentence: String, code: Cause?) =
                switched[route.id] ?? causes[route.id]
                ?? route.lastReport.map {
                    (
                        sentence: EventWords.situation(planner.place(route), $0.verdict, detail: $0.detail),
                        code: $0.effectiveCause
                    )
                } ?? (sentence: mark.state.words, code: nil)
            changes.append(
                HistoryTransition(
                    routeID: route.id, at: at, state: mark.state, active: mark.active, cause: cause.sentence,
                    name: route.route.name, via: route.route.via, server: snapshot.serverInstance(route),
                    causeCode: cause.code))
        }
        for id in marks.keys.sorted() where planner.routes[id] == nil {
            marks[id] = nil
            let gone = removed[id]
            changes.append(
                HistoryTransition(
                    routeID: id, at: at, state: nil, active: false, cause: gone?.cause ?? "Removed.",
                    name: gone?.route.route.name ?? id, via: gone?.route.route.via ?? .lan, server: nil,
                    causeCode: gone?.code))
        }
        return changes
    }
}
