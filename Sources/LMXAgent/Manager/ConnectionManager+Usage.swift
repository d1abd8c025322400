import LMXCore

/// What the manager reads of the agent's use before it decides: the gateway's traffic per route
/// (requests in flight, how long ago a byte came from each route's server) and the clients
/// following its changes. Read, not pushed: a look costs a lock and a few dozen entries, and the
/// data path pays one atomic store per read of an answer.
public struct UsageWitness: Sendable {
    /// Per route id: requests in flight and seconds since the server's last byte (nil: never).
    public var traffic: @Sendable () -> [String: (inFlight: Int, heardAgo: Double?)]
    /// `/v1/watch` clients.
    public var watchers: @Sendable () -> Int

    public init(
        traffic: @escaping @Sendable () -> [String: (inFlight: Int, heardAgo: Double?)],
        watchers: @escaping @Sendable () -> Int
    ) {
        self.traffic = traffic
        self.watchers = watchers
    }
}

extension ConnectionManager {
    /// Where the manager reads the agent's use from (the daemon sets it once the gateway runs).
    public func setUsage(_ witness: UsageWitness) {
        usage = witness
        readUsage(now: clock.now())
        pump(reselect: false)
    }

    /// Reads the gateway's traffic and the watchers into the planner.
    func readUsage(now t: Double) {
        guard let usage else { return }
        planner.setWatchers(usage.watchers(), now: t)
        for (routeID, seen) in usage.traffic() {
            planner.noteTraffic(
                routeID, RouteTraffic(inFlight: seen.inFlight, heardAt: seen.heardAgo.map { t - $0 }), now: t)
        }
    }

    /// A request came to the gateway after a quiet time (said at most once a second per event
    /// loop): the agent is in use, and the active route goes back to its close watch.
    public func gatewayInUse() {
        let t = clock.now()
        planner.noteUse(now: t)
        readUsage(now: t)
        pump(reselect: false)
    }

    /// A `/v1/watch` client came or went.
    public func watchersChanged() {
        readUsage(now: clock.now())
        pump(reselect: false)
    }

    /// Before the active route is handed out (`/v1/active`, `lmx-status --url`): when its last
    /// proof of life (a good probe, the gateway's traffic, its event stream) is older than
    /// ``ConnectionPlanner/freshFor``, it is checked now (a quick connection; a failure decides
    /// alone), and the route that is active after that is checked the same way (a few at most).
    /// Returns when the route active then has a fresh proof, or there is none.
    public func ensureFreshActive() async {
        for _ in 0..<3 {
            let t = clock.now()
            readUsage(now: t)
            guard let id = planner.activeID else { return }
            if probing.contains(id) {
                await waitForProbe(of: id)
            } else if planner.checkFresh(id, now: t) {
                pump(reselect: false)
                await waitForProbe(of: id)
            } else {
                return
            }
            if planner.activeID == id { return }
        }
    }

    /// Returns when the probe of `routeID` now running has finished.
    func waitForProbe(of routeID: String) async {
        guard probing.contains(routeID) else { return }
        await withCheckedContinuation { continuation in
            probeWaiters[routeID, default: []].append(continuation)
        }
    }

    /// Resumes whoever waits for the probe of a route that is no longer active (the agent moved
    /// meanwhile, say on a network change): they look at the route active now instead.
    func releaseWaitersOfInactive() {
        guard !probeWaiters.isEmpty else { return }
        for id in Array(probeWaiters.keys) where id != planner.activeID { probeDone(id) }
    }

    /// Resumes whoever waits for the probe of `routeID` (it finished, or the manager stopped).
    func probeDone(_ routeID: String) {
        guard let waiters = probeWaiters.removeValue(forKey: routeID) else { return }
        for waiter in waiters { waiter.resume() }
    }
}
