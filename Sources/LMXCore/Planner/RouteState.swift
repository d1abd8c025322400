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
    /// Whether a probe of the route is running, since when.
    public var probe: ProbeActivity = .idle
    public var inFlight: Bool { probe != .idle }
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
    /// When a byte of the gateway's own traffic last came from the route's server (passive
    /// health: proof of life, as a good probe is).
    public var trafficAt: Double?
    /// The gateway's requests in flight on the route at the last look: while one is, a probe that
    /// times out says the server is busy, not gone (its connection is watched by the kernel's
    /// keepalive, so one to a vanished server does not stay counted).
    public var gatewayInFlight = 0
    /// When the server last spoke on its `/admin/events` stream (a heartbeat or an event).
    public var eventAt: Double?
    /// Its next probe is a check asked for before the route is handed out (``ConnectionPlanner/checkFresh(_:now:)``):
    /// it connects quickly and a failure decides alone.
    public var freshCheck = false
    /// Probes that timed out while the gateway's traffic proved the server alive (busy, not gone).
    public var busyProbes = 0
    /// The server's `instance_id`, learned from its discovery document (or remembered).
    public var instanceID: String?
    /// A page that is not the server's answered a request through the route (a login page, a
    /// tunnel's error page, a captive portal): it stands until the server answers its API itself
    /// (``ProbeReport/apiAnswered``). Health paths the server still answers do not clear it: a
    /// tunnel behind Cloudflare Access may pass `/healthz` and send `/v1/` to a login page.
    public var foreign: ForeignAnswer?

    // This machine's network (see ConnectionPlanner+Network).
    /// How this machine reached the route's address at the last look (LAN routes with an IP).
    public var path: RoutePath?
    /// What this machine's own network and sleep say of the route, apart from the server.
    public var condition: RouteCondition = .normal
    /// When the way to the route came back (this machine rejoined its network), until a probe
    /// gets through: for ``ConnectionPlanner/pathReturnWindow`` its probes give up on a
    /// connection after ``ConnectionPlanner/pathReturnConnectTimeout`` and the next starts at
    /// once. The link may come back after the address and route do (the kernel would send a
    /// lost SYN again only after 1 s, then 3 s): the route is back within a fraction of a second
    /// of answering.
    public var pathBackAt: Double?

    /// Why this machine cannot reach the route the way it did (it left the route's network).
    public var offNetwork: String? { condition.offNetwork }
    /// …and as a code.
    public var offNetworkCause: Cause? { condition.offNetworkCause }
    /// The way to the route changed: the next probe decides alone.
    public var suspect: Bool { condition == .suspect }
    /// The last proof that the route's server is alive: a good probe, a byte of the gateway's
    /// traffic, or a word on its event stream.
    public var lastProofAt: Double? {
        [lastGoodAt, trafficAt, eventAt].compactMap { $0 }.max()
    }
    /// Came back after a local loss: returns without the stability window.
    public var returnAtOnce: Bool { condition.base == .returning }
    /// When this machine woke, if the verdict predates that.
    public var staleSince: Double? { if case .stale(let since, _) = condition { since } else { nil } }
    public var stale: Bool { staleSince != nil }
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

/// Whether a probe of a route is running.
public enum ProbeActivity: Sendable, Hashable {
    case idle
    /// Started at this time (the agent's monotonic seconds).
    case inFlight(since: Double)
}

/// What this machine's own network and sleep say of a route, as opposed to what its server
/// answers. One value, so that no impossible mix (suspect and off the network, returning and lost)
/// can be written.
public indirect enum RouteCondition: Sendable, Hashable {
    /// Nothing local in question.
    case normal
    /// The way to the route changed: its next probe decides alone (one failure is enough).
    case suspect
    /// This machine left the route's network: not usable until a probe gets through. Why, in
    /// words and as a code.
    case offNetwork(String, cause: Cause)
    /// Failing because this machine's network changed or it slept, not because the server did.
    case localLoss
    /// Came back after a local loss: returns without the stability window, until a failure.
    case returning
    /// This machine woke at `since`, after the verdict: no request goes to the route and a probe
    /// started before is dropped, until a probe since then answers. `was`: the condition before.
    case stale(since: Double, was: RouteCondition)

    /// The condition under a wake's staleness.
    public var base: RouteCondition {
        if case .stale(_, let was) = self { was.base } else { self }
    }

    /// `new` in place of the base condition, under the same staleness.
    func replacingBase(with new: RouteCondition) -> RouteCondition {
        if case .stale(let since, let was) = self {
            .stale(since: since, was: was.replacingBase(with: new))
        } else {
            new
        }
    }

    public var offNetwork: String? { if case .offNetwork(let why, _) = base { why } else { nil } }
    /// Why this machine left the route's network, as a code.
    public var offNetworkCause: Cause? { if case .offNetwork(_, let cause) = base { cause } else { nil } }

    /// The route was lost for local reasons (left its network, or failed after a change).
    var lostLocally: Bool {
        switch base {
        case .offNetwork, .localLoss: true
        default: false
        }
    }

    /// The next probe decides alone: the way changed or this machine slept.
    var decidesAlone: Bool {
        switch self {
        case .suspect, .stale: true
        default: false
        }
    }

    /// After one probe: a good one ends a loss (returning) and staleness; a failure where the next
    /// probe was to decide alone, or of a route lost locally, is a local loss (off the network
    /// stays off until a probe gets through).
    func afterProbe(good: Bool) -> RouteCondition {
        let base = base
        if good { return lostLocally ? .returning : (base == .returning ? .returning : .normal) }
        if case .offNetwork = base { return base }
        return decidesAlone || base == .localLoss ? .localLoss : .normal
    }
}

/// One probe to run.
public struct ProbeTask: Sendable, Hashable {
    public var route: Route
    /// `false`: a quick liveness check (`/readyz` only) of the active route between full probes.
    public var full: Bool
    /// The connection's own timeout, shorter than the probe's (``RouteState/pathBackAt``); nil:
    /// the probe's.
    public var connectTimeout: Double? = nil
    /// `/v1/models` is asked too and who answered it judged: a page that was not the server's
    /// stands on the route (``RouteState/foreign``).
    public var checkAPI = false
    /// HTTP requests the probe sends: a quick check one (`/readyz`), a full probe three (one
    /// more when the API is in question).
    public var requests: Int { (full ? 3 : 1) + (checkAPI ? 1 : 0) }
}

/// Something the planner decided that the world should hear about.
/// Each change carries its reason twice: a sentence for people and a ``Cause`` for programs.
public enum PlannerEvent: Sendable, Hashable {
    case routeAdded(RouteState)
    case routeRemoved(RouteState, reason: String, cause: Cause)
    /// Established health or verdict changed (`cause`: nil when the server is ready).
    case healthChanged(RouteState, from: HealthVerdict?, reason: String, cause: Cause?)
    /// Any other change of what is shown for a route (latency, last probe, announcement).
    case routeUpdated(RouteState)
    case activeChanged(from: RouteState?, to: RouteState?, reason: String, cause: Cause)
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
