/// Where each route came from: the mDNS announcements followed (bounded), the configured
/// endpoints and the pairings' routes. Pure bookkeeping; the manager asks it what an input means.
public struct RouteSources: Sendable {
    /// Announced servers followed at most: a flood of announcements keeps memory, probes and the
    /// database bounded.
    public static let maxAnnounced = 1024

    /// mDNS instance → the route it is reached by.
    private var announcedIDs: [ServiceInstanceID: String] = [:]
    /// The mDNS version of each announced route, to fall back to when a pairing of the same
    /// address is removed.
    private var announcedRoutes: [String: Route] = [:]
    private var floodReported = false
    /// Instances whose refused addresses were already reported.
    private var refusalsReported: Set<ServiceInstanceID> = []
    public private(set) var manualIDs: Set<String> = []
    /// Pairing id → the routes it brought.
    public private(set) var pairingRoutes: [String: [String]] = [:]

    public init() {}

    /// What an announcement (added or updated) means.
    public struct Announcement: Sendable {
        /// The route to add or update; nil when the server is ignored or has no usable address.
        public var route: Route?
        /// A route of the same instance at another address, to withdraw.
        public var replaces: String?
        /// Addresses the agent never connects to, the first time this instance shows them.
        public var newlyRefused: [(address: String, reason: String)] = []
        /// Ignored because `maxAnnounced` servers are followed; `floodStarted` the first time.
        public var ignored = false
        public var floodStarted = false
    }

    public mutating func announce(_ server: DiscoveredServer) -> Announcement {
        var result = Announcement()
        let refused = Route.refusedAddresses(of: server)
        if !refused.isEmpty, refusalsReported.insert(server.id).inserted { result.newlyRefused = refused }
        guard let route = Route.lan(for: server) else { return result }
        if announcedIDs[server.id] == nil, announcedIDs.count >= Self.maxAnnounced {
            result.ignored = true
            result.floodStarted = !floodReported
            floodReported = true
            return result
        }
        if let old = announcedIDs[server.id], old != route.id { result.replaces = old }
        announcedIDs[server.id] = route.id
        announcedRoutes[route.id] = route
        result.route = route
        return result
    }

    /// The server is no longer announced: the route it was reached by, if followed.
    public mutating func withdraw(_ server: DiscoveredServer) -> String? {
        refusalsReported.remove(server.id)
        if announcedIDs.count < Self.maxAnnounced / 2 { floodReported = false }
        guard let id = announcedIDs.removeValue(forKey: server.id) else { return nil }
        announcedRoutes[id] = nil
        return id
    }

    /// The announced version of a route, if mDNS still announces it.
    public func announcedRoute(_ routeID: String) -> Route? { announcedRoutes[routeID] }

    /// The configured endpoints now: returns the ones no longer configured.
    public mutating func setManual(_ ids: Set<String>) -> [String] {
        defer { manualIDs = ids }
        return manualIDs.subtracting(ids).sorted()
    }

    public mutating func setPairing(_ id: String, routes: [String]) { pairingRoutes[id] = routes }

    /// Forgets a pairing: the routes it brought (nil when unknown).
    public mutating func removePairing(_ id: String) -> [String]? { pairingRoutes.removeValue(forKey: id) }
}

/// When pairings expire, read on the real-time clock passed in (expiry is a wall-clock notion: it
/// follows clock corrections). Their routes are dropped at that moment, not at the next start.
public struct PairingExpiry: Sendable {
    private var dates: [String: Double] = [:]

    public init() {}

    /// Expiry dates are read on the real-time clock only (a ``WallTime``), never on a monotonic
    /// instant: mixing the two does not compile.
    public static func hasExpired(_ expiresAt: Double?, at wallNow: WallTime) -> Bool {
        expiresAt.map { $0 <= wallNow.secondsSince1970 } ?? false
    }

    public mutating func set(_ pairingID: String, expiresAt: Double?) { dates[pairingID] = expiresAt }

    public mutating func remove(_ pairingID: String) { dates[pairingID] = nil }

    /// The pairings whose time has come (forgotten here).
    public mutating func takeExpired(at wallNow: WallTime) -> [String] {
        let expired = dates.filter { $0.value <= wallNow.secondsSince1970 }.keys.sorted()
        for id in expired { dates[id] = nil }
        return expired
    }

    /// The next expiry as an instant of the monotonic clock whose `now` is `wallNow`'s.
    public func nextDeadline(now: Double, wallNow: WallTime) -> Double? {
        dates.values.min().map { now + max(0, $0 - wallNow.secondsSince1970) }
    }
}

/// An instant of the real-time clock (seconds since 1970, following clock corrections), kept
/// apart by type from the monotonic seconds the planner works in: what is read against a date
/// (pairing expiry) takes this, and a monotonic number does not fit.
public struct WallTime: Sendable, Hashable, Comparable {
    public var secondsSince1970: Double
    public init(_ secondsSince1970: Double) { self.secondsSince1970 = secondsSince1970 }
    public static func < (a: WallTime, b: WallTime) -> Bool { a.secondsSince1970 < b.secondsSince1970 }
}

/// The state of mDNS discovery, as the status shows it.
public enum DiscoveryState: Sendable, Hashable {
    case stopped
    case running
    /// avahi-daemon is absent or not yet running.
    case waiting(String)
    case reconnecting
    /// Turned off in the configuration.
    case disabled
    case failed(String)

    /// The name in `/v1/status` (`avahi`).
    public var name: String {
        switch self {
        case .stopped: "stopped"
        case .running: "running"
        case .waiting: "waiting"
        case .reconnecting: "reconnecting"
        case .disabled: "disabled"
        case .failed: "failed"
        }
    }

    public var detail: String? {
        switch self {
        case .waiting(let why), .failed(let why): why
        default: nil
        }
    }
}
