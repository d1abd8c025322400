import LMXCore
import LMXStore

/// Keeps the database in step with what happens: the event history, the servers seen, probe
/// statistics, the tunnels' vouched addresses, forgotten routes and the last active one. Every
/// write is queued on the store executor, so a locked database never holds up the manager.
public struct EventRecorder: AgentEventSink {
    let store: StoreExecutor

    public init(store: StoreExecutor) { self.store = store }

    public func receive(_ events: [AgentEvent], snapshot: AgentSnapshot, now: Double) {
        let at = snapshot.originWall + now
        for event in events {
            if let row = event.record {
                // The sentence with the names of now: still true once a route has gone.
                let text = event.sentence(in: snapshot)
                store.write("record an event") {
                    _ = try $0.appendEvent(
                        kind: row.kind, routeID: row.routeID, from: row.from, to: row.to, reason: row.reason,
                        text: text, cause: row.cause, at: at)
                }
            }
            switch event {
            case .routeRemoved(let state, _, _):
                // Every removal is final (deleted from the config, or forgotten after long silence).
                let id = state.id
                let tunnel = state.route.via == .wan
                store.write("forget a route") { store in
                    try store.deleteRoute(id)
                    if tunnel { try store.deleteVouch(tunnelRouteID: id) }
                }
            case .vouchesChanged(let tunnelID, let urls, let instance):
                store.write("keep a tunnel's vouched addresses") {
                    try $0.saveVouch(
                        StoredVouch(tunnelRouteID: tunnelID, baseURLs: urls, instanceID: instance, updatedAt: at))
                }
            case .activeChanged(_, let to, _, _):
                if let id = to?.id {
                    store.write("remember the active endpoint") { try $0.setMeta("last_good_route", id) }
                }
            case .serverSeen(let route, let instance):
                var stored = route
                stored.source = .mdns
                store.write("remember a server", droppable: true) { [stored] store in
                    try store.saveRoute(StoredRoute(route: stored, instanceID: instance, createdAt: at, lastSeen: at))
                }
            case .probed(let state, let report):
                let stats = ProbeStats(
                    routeID: state.id, probes: state.probeCount, failures: state.failureCount,
                    smoothedLatency: state.smoothedLatency, lastVerdict: report.verdict, lastDetail: report.detail,
                    lastProbeAt: at, lastGoodAt: report.verdict.isAlive ? at : nil, instanceID: state.instanceID)
                store.write("save probe statistics", droppable: true) { try $0.saveStats(stats) }
            default:
                break
            }
        }
    }
}
