/// Which servers found on the LAN the agent may use. Anyone on the LAN, and any local user through
/// `avahi-publish`, can announce an `_opta-lmx._tcp` service and repeat any `instance_id`: an
/// announcement proves nothing. What the user wrote (pairings, configured endpoints, address
/// books) and what a server says about itself through its tunnel (HTTPS, verified certificate)
/// vouch for a LAN address; nothing else does (CONTRACT §7).
public enum TrustPolicy: String, Sendable, Hashable, Codable, CaseIterable {
    /// With nothing set up, every LAN server is used (zero configuration). Once a pairing or a
    /// configured endpoint exists, only vouched routes are ever active or sent a request;
    /// announcers are listed, never used, even when nothing else is usable.
    case paired
    /// Only vouched routes, ever: with nothing set up, nothing is used.
    case pinned
    /// Every LAN server is used, before every tunnel, as earlier versions did. Impostors (announcers
    /// claiming a set-up server's `instance_id` from an address it does not vouch for) are
    /// still never used, and no announcer ever gets a key.
    case lan
}

/// Whether a pairing's keys go to its server's vouched LAN addresses, over plain HTTP as Opta's
/// own apps send them (the config file's top-level `lan_keys`).
public enum LANKeys: String, Sendable, Hashable, Codable, CaseIterable {
    /// Inference and admin keys go to the tunnel and to vouched LAN routes of the same server.
    case vouched
    /// No key ever travels over plain `http://`: a server that requires one is reached through a
    /// route that has it (its tunnel).
    case never
}

/// The numbers that govern probing, hysteresis and switching. A value type read from the config
/// file; every field has the default documented in the README.
public struct HealthPolicy: Sendable, Hashable, Codable {
    /// Consecutive good probes that bring a down route back up.
    public var upAfter: Int = 2
    /// Consecutive bad probes that take an up route down.
    public var downAfter: Int = 3
    /// Consecutive bad probes after which the active route is left for a usable alternative,
    /// before it is declared down.
    public var failoverAfter: Int = 2
    /// Re-probe delay while a route's health is about to change.
    public var pendingInterval: Double = 1
    /// Re-probe delay while the active route's health is about to change ("re-probe at once").
    public var confirmInterval: Double = 0.25
    /// Interval of the quick liveness checks (`/readyz` only) of the active route while the agent
    /// is in use (gateway traffic, a `/v1/watch` client) and no traffic proved it meanwhile; it gets
    /// a full probe every `stableInterval`.
    public var activeInterval: Double = 0.5
    /// Interval of the quick checks of the active route while nothing uses the agent: its server
    /// is not asked twice a second, day and night, by every idle client. It gets a full probe
    /// every `ConnectionPlanner.idleFullEvery` checks.
    public var idleInterval: Double = 10
    /// Seconds without gateway traffic (and with no `/v1/watch` client) after which the agent is
    /// idle.
    public var idleAfter: Double = 30
    /// Probe interval of healthy LAN routes that are not active, while the agent is in use.
    public var stableInterval: Double = 10
    /// Interval of the quick checks of healthy standbys: WAN ones always, LAN ones while the agent
    /// is idle; a full probe every `ConnectionPlanner.standbyFullEvery` checks.
    public var wanStandbyInterval: Double = 90
    /// Fraction of random spread on stable intervals (0.1 = ±10 %).
    public var jitter: Double = 0.1
    /// Longest delay between probes of a dead route (backoff doubles up to this).
    public var maxBackoff: Double = 60
    /// A route that answered well within this many seconds is watched for its return: real
    /// servers restart, crash and reboot without an mDNS goodbye and without a new announcement.
    public var restartWatch: Double = 600
    /// Re-probe delay (jittered by ±25 %) of a route under the restart watch, instead of backoff.
    public var restartInterval: Double = 1
    /// Longest wait a `Retry-After` may impose on a standby route (never on the active one).
    public var maxRetryAfter: Double = 60
    /// The active server's `/admin/events` stream (followed when its admin key is known) sends
    /// a heartbeat every 30 s; silence this long counts as a failed probe and reconnects.
    public var eventHeartbeatTimeout: Double = 60
    /// How long a better route must stay healthy before the agent moves to it from a working one.
    public var stabilityWindow: Double = 10
    /// Probes in flight at once.
    public var maxConcurrentProbes: Int = 8
    /// Per-request timeout on LAN routes.
    public var lanTimeout: Double = 1.5
    /// Per-request timeout on WAN routes.
    public var wanTimeout: Double = 8
    /// Withdrawn mDNS routes that stay down this long are forgotten.
    public var forgetAfter: Double = 3600
    /// Instances preferred among equals (after "stay on the current one").
    public var preferredInstances: [String] = []
    /// Which discovered servers may be chosen (the config file's top-level `trust`).
    public var trust: TrustPolicy = .paired
    /// Whether keys go to vouched plain-HTTP LAN routes (the config file's top-level `lan_keys`).
    public var lanKeys: LANKeys = .vouched
    /// Found routes (announced, withdrawn, remembered) kept at most: the bound against
    /// announcement churn (not a configuration key; tests lower it).
    public var maxFoundRoutes: Int = ConnectionPlanner.maxFoundRoutes

    public init() {}

    enum CodingKeys: String, CodingKey, CaseIterable {
        case upAfter = "up_after"
        case downAfter = "down_after"
        case failoverAfter = "failover_after"
        case pendingInterval = "pending_interval"
        case confirmInterval = "confirm_interval"
        case activeInterval = "active_interval"
        case idleInterval = "idle_interval"
        case idleAfter = "idle_after"
        case stableInterval = "stable_interval"
        case wanStandbyInterval = "wan_standby_interval"
        case jitter
        case maxBackoff = "max_backoff"
        case restartWatch = "restart_watch"
        case restartInterval = "restart_interval"
        case maxRetryAfter = "max_retry_after"
        case eventHeartbeatTimeout = "event_heartbeat_timeout"
        case stabilityWindow = "stability_window"
        case maxConcurrentProbes = "max_concurrent_probes"
        case lanTimeout = "lan_timeout"
        case wanTimeout = "wan_timeout"
        case forgetAfter = "forget_after"
        case preferredInstances = "preferred_instances"
    }

    public init(from decoder: any Decoder) throws {
        let c = try ConfigurationReader(decoder, keys: CodingKeys.self)
        let d = HealthPolicy()
        func count(_ key: CodingKeys, _ fallback: Int) throws -> Int { try c.number(key, or: fallback, in: 1...100) }
        func seconds(_ key: CodingKeys, _ fallback: Double, max: Double = 86_400) throws -> Double {
            try c.seconds(key, or: fallback, max: max)
        }
        upAfter = try count(.upAfter, d.upAfter)
        downAfter = try count(.downAfter, d.downAfter)
        failoverAfter = try count(.failoverAfter, d.failoverAfter)
        pendingInterval = try seconds(.pendingInterval, d.pendingInterval)
        confirmInterval = try seconds(.confirmInterval, d.confirmInterval)
        activeInterval = try seconds(.activeInterval, d.activeInterval)
        idleInterval = try seconds(.idleInterval, d.idleInterval)
        idleAfter = try seconds(.idleAfter, d.idleAfter)
        stableInterval = try seconds(.stableInterval, d.stableInterval)
        wanStandbyInterval = try seconds(.wanStandbyInterval, d.wanStandbyInterval)
        maxBackoff = try seconds(.maxBackoff, d.maxBackoff)
        restartWatch = try seconds(.restartWatch, d.restartWatch)
        restartInterval = try seconds(.restartInterval, d.restartInterval, max: 60)
        maxRetryAfter = try seconds(.maxRetryAfter, d.maxRetryAfter, max: 3600)
        eventHeartbeatTimeout = try seconds(.eventHeartbeatTimeout, d.eventHeartbeatTimeout, max: 3600)
        stabilityWindow = try seconds(.stabilityWindow, d.stabilityWindow)
        lanTimeout = try seconds(.lanTimeout, d.lanTimeout, max: 120)
        wanTimeout = try seconds(.wanTimeout, d.wanTimeout, max: 120)
        forgetAfter = try seconds(.forgetAfter, d.forgetAfter, max: 86_400 * 365)
        maxConcurrentProbes = try count(.maxConcurrentProbes, d.maxConcurrentProbes)
        jitter = try c.number(.jitter, or: d.jitter, in: 0...0.5)
        preferredInstances = try c.value(.preferredInstances, or: d.preferredInstances)
    }

    public func timeout(for via: Via) -> Double { via == .lan ? lanTimeout : wanTimeout }
}
