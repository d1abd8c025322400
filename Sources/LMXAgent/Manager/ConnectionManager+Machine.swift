import LMXCore
import LMXSystem

// This machine itself: its network (links, addresses, routes) and its sleep. Followed by
// `MachineWatcher`; the planner decides what follows (ConnectionPlanner+Network).
extension ConnectionManager {
    /// This machine's links, addresses or routes changed (`change`: the network before and after,
    /// read by the watcher): the path to every LAN route is looked up again in the new one; routes
    /// this machine left are out at once, changed ones suspect, and every route without a path of
    /// its own (tunnels, host names) is probed now too.
    /// - Returns: whether anything the agent uses changed (a LAN route moved, or the addresses
    ///   of this machine's usable interfaces), so that pooled connections are worth dropping.
    /// - Parameter whenRelevant: runs before any probe starts, when something did change (drops
    ///   pooled connections).
    @discardableResult
    public func networkChanged(_ change: NetworkChange, whenRelevant: @Sendable () -> Void = {}) -> Bool {
        let t = clock.now()
        let paths = lookUpPaths(of: planner.routes.values.filter { $0.route.via == .lan }.map(\.id), in: change.new)
        let moved = paths.filter { id, path in planner.routes[id]?.path.map { $0 != path } ?? false }
        guard change.addressesChanged || !moved.isEmpty else {
            logger.debug("this machine's network changed; nothing the agent uses")
            return false
        }
        whenRelevant()
        planner.probeUnpathed(now: t)
        var events = planned(planner.applyPaths(paths, now: t))
        if !moved.isEmpty {
            let detail =
                moved.sorted { $0.key < $1.key }.prefix(3).map { id, path in
                    let name = planner.routes[id].map { planner.place($0).words } ?? id
                    return switch path {
                    case .reachable(let how, _): "\(name) is now reached \(how)"
                    case .unreachable(let why, _): "\(name) is out of reach (\(why))"
                    }
                }.joined(separator: "; ")
                + (moved.count > 3 ? " and \(moved.count - 3) more" : "")
            events.insert(.machine(.network, detail: detail), at: 0)
        } else {
            logger.info("this machine's addresses changed; no LAN route moved: probing the tunnels again")
        }
        pump(events)
        return true
    }

    /// This machine woke from sleep: every verdict is stale; everything is probed now, and the
    /// gateway holds requests until a route has answered since.
    public func woke(_ how: String) {
        let t = clock.now()
        let events = planned(planner.woke(now: t))
        pump(events + [.machine(.wake, detail: how)])
    }

    /// Records the path of LAN routes seen for the first time (the baseline a change compares
    /// with). Called with the routes just added; looks up only those it has not seen.
    func recordNewPaths(of added: [String]) {
        let fresh = added.compactMap { planner.routes[$0] }.filter { $0.path == nil && $0.route.via == .lan }
        guard !fresh.isEmpty else { return }
        _ = planner.applyPaths(lookUpPaths(of: fresh.map(\.id), in: paths.network()), now: clock.now())
    }

    /// How this machine reaches each LAN route with an IP address now (host names have no
    /// path of their own and are remembered as such).
    func lookUpPaths(of ids: [String], in network: MachineNetwork) -> [String: RoutePath] {
        var paths: [String: RoutePath] = [:]
        for id in ids {
            guard let state = planner.routes[id], state.route.via == .lan,
                let host = state.route.base.ipLiteral
            else { continue }
            switch self.paths.path(to: host, in: network) {
            case .failure(let error):
                let cause: Cause = SystemError.connectFailure(error.code) == .noAddress ? .addressLost : .unreachable
                paths[id] = .unreachable(SystemError.connectWords(error.code), cause: cause)
            case .success(let path) where !path.running:
                paths[id] = .unreachable("\(path.interface) has no carrier", cause: .linkLost)
            case .success(let path):
                paths[id] = .reachable(path.description, onLink: path.onLink)
            }
        }
        return paths
    }

}
