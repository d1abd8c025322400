/// Established health of a route, after hysteresis.
public enum RouteHealth: String, Sendable, Hashable, Codable {
    /// Never probed yet.
    case unknown
    /// Alive (ready, not ready or overloaded).
    case up
    /// Not usable (down, tunnel down, auth rejected, wrong service).
    case down
}

/// Immutable shared storage for the bulky parts of a route's state: the planner passes over every
/// route after every probe, and a copy then costs one retain instead of one per string.
final class Shared<Value: Hashable & Sendable>: Hashable, Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
    static func == (lhs: Shared, rhs: Shared) -> Bool { lhs === rhs || lhs.value == rhs.value }
    func hash(into hasher: inout Hasher) { hasher.combine(value) }
}

/// A route and everything the agent knows about its health.
public struct RouteState: Sendable, Hashable, Identifiable {
    var routeStorage: Shared<Route>
    var reportStorage: Shared<ProbeReport>?

    public var route: Route {
        get { routeStorage.value }
        set { routeStorage = Shared(newValue) }
    }
    public var health: RouteHealth = .unknown
    /// The established verdict: changes class (alive ↔ not) only through hysteresis.
    public var verdict: HealthVerdict?
    public var lastReport: ProbeReport? {
        get { reportStorage?.value }
        set { reportStorage = newValue.map(Shared.init) }
    }
    public var lastProbeAt: Double?
    public var goodStreak = 0
    public var badStreak = 0
    /// Since when every probe has been good (nil after any bad one).
    public var healthySince: Double?
    /// Since when the route is in its current health.
    public var healthSince: Double?
    public var nextProbeAt: Double
    public var inFlight = false
    /// Exponentially smoothed probe latency, seconds.
    public var smoothedLatency: Double?
    /// When the last good probe finished: a route good within `restartWatch` is watched for
    /// its return on a short schedule instead of backing off.
    public var lastGoodAt: Double?
    public var probeCount = 0
    public var failureCount = 0
    /// When the last full probe (healthz, discovery document, readyz) finished.
    public var lastFullProbeAt: Double?
    var backoff: Double = 0
    /// The server's `instance_id`, learned from its discovery document (or remembered).
    public var instanceID: String?

    // This machine's network (see ConnectionPlanner+Network).
    /// How this machine reached the route's address at the last look (LAN routes with an IP).
    public var path: RoutePath?
    /// Why this machine cannot reach the route the way it did (it left the route's network):
    /// not usable until a probe gets through.
    public var offNetwork: String?
    /// The way to the route changed: the next probe decides alone (one failure is enough).
    public var suspect = false
    /// Failing because this machine's network changed or it slept, not because the server failed.
    public var localLoss = false
    /// Came back after a local loss: returns without the stability window.
    public var returnAtOnce = false
    /// When this machine woke, if the verdict predates that: not used for requests until a
    /// probe started since then has answered.
    public var staleSince: Double?
    public var stale: Bool { staleSince != nil }
    /// When the probe in flight started.
    public var probeStartedAt: Double?
    /// A found route (mDNS, remembered) not announced now: since when. Such routes are
    /// forgotten `forget_after` later, and the oldest first when there are too many.
    public var withdrawnAt: Double?

    public let id: String

    init(route: Route, now: Double) {
        self.routeStorage = Shared(route)
        self.id = route.id
        self.nextProbeAt = now
    }
}

/// One probe to run.
public struct ProbeTask: Sendable, Hashable {
    public var route: Route
    /// `false`: a quick liveness check (`/readyz` only) of the active route between full probes.
    public var full: Bool
}

/// Something the planner decided that the world should hear about.
public enum PlannerEvent: Sendable, Hashable {
    case routeAdded(RouteState)
    case routeRemoved(RouteState, reason: String)
    /// Established health or verdict changed.
    case healthChanged(RouteState, from: HealthVerdict?, reason: String)
    /// Any other change of what is shown for a route (latency, last probe, announcement).
    case routeUpdated(RouteState)
    case activeChanged(from: RouteState?, to: RouteState?, reason: String)
    /// An announcer claims the `instance_id` of a server the user set up (`owner` is its name)
    /// from an address that server does not vouch for. Sent once per route.
    case impostor(RouteState, owner: String)
    /// A tunnel's discovery document changed the LAN addresses it vouches for (to be kept
    /// with the pairing, so they hold across restarts and while the tunnel is down).
    case vouchesChanged(tunnelID: String, baseURLs: [String], instanceID: String?)
}

/// A small deterministic generator for probe jitter, so the core's tests replay exactly (and the
/// fuzz tests can replay a failure from its seed).
struct SplitMix64: Sendable, Hashable, RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
