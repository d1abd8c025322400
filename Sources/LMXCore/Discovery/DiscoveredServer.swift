/// One Opta LMX server as seen through mDNS: every sighting of one service instance on every
/// interface and protocol, merged.
public struct DiscoveredServer: Sendable, Hashable, Identifiable {
    public var id: ServiceInstanceID
    /// Resolved sightings, ordered: IPv4 before IPv6, loopback last, then by interface name.
    public var records: [ResolvedRecord]

    public init(id: ServiceInstanceID, records: [ResolvedRecord]) {
        self.id = id
        self.records = records.sorted { $0.key < $1.key }
    }

    public var name: String { id.name }

    /// The record whose host, port and TXT represent the server.
    public var primary: ResolvedRecord? { records.first }

    public var hostName: String { primary?.hostName ?? "" }
    public var port: UInt16 { primary?.port ?? 0 }
    public var txt: TXTRecord { primary?.txt ?? TXTRecord() }
    /// The discovery document path from TXT, defaulting to `/.well-known/opta-lmx`.
    public var servicePath: String { txt.servicePath }

    /// Every distinct address, in record order.
    public var addresses: [String] { unique(records.map(\.address)) }
    /// Every distinct interface name, in record order (records from unicast DNS have none).
    public var interfaces: [String] { unique(records.map(\.key.interface.name).filter { !$0.isEmpty }) }

    /// Found in a unicast DNS domain (wide-area DNS-SD) rather than by mDNS on a link.
    public var isFromUnicastDNS: Bool { id.domain.lowercased() != "local" && interfaces.isEmpty }

    /// Where the server was found, for people: "mDNS on eth0, wlan0" or "DNS domain example.lan".
    public var foundBy: String {
        isFromUnicastDNS ? "DNS domain \(id.domain)" : "mDNS on \(interfaces.joined(separator: ", "))"
    }

    /// Every distinct `address:port` pair, IPv6 bracketed.
    public var endpoints: [String] {
        unique(records.map { ServerAddress.hostPort($0.address, port: $0.port) })
    }

    private func unique(_ values: [String]) -> [String] {
        var seen = Set<String>()
        return values.filter { seen.insert($0).inserted }
    }
}

/// What changed about a server between two sightings.
public enum ServerChange: String, Sendable, Hashable, Codable, CaseIterable, Comparable {
    case addresses, interfaces, host, port, txt

    public static func < (lhs: ServerChange, rhs: ServerChange) -> Bool {
        allCases.firstIndex(of: lhs)! < allCases.firstIndex(of: rhs)!
    }

    static func between(_ old: DiscoveredServer, _ new: DiscoveredServer) -> Set<ServerChange> {
        var changes = Set<ServerChange>()
        if old.addresses != new.addresses { changes.insert(.addresses) }
        if old.interfaces != new.interfaces { changes.insert(.interfaces) }
        if old.hostName != new.hostName { changes.insert(.host) }
        if old.port != new.port { changes.insert(.port) }
        if old.txt != new.txt { changes.insert(.txt) }
        return changes
    }
}

/// The state of the connection to avahi-daemon.
public enum DaemonState: Sendable, Hashable {
    /// Connected; browsing.
    case running
    /// Not connected, waiting for the daemon (or the system bus) to appear.
    case waiting(reason: String)
    /// The daemon went away while we were connected; reconnecting.
    case reconnecting

    public var name: String {
        switch self {
        case .running: "running"
        case .waiting: "waiting"
        case .reconnecting: "reconnecting"
        }
    }
}

/// Why a server left the list.
public enum RemovalReason: String, Sendable, Hashable, Codable {
    /// mDNS withdrew it: a goodbye packet or its records expired.
    case withdrawn
    /// The connection to avahi-daemon was lost, so nothing it reported can be trusted.
    case daemonLost = "daemon-lost"
}

/// What a consumer of discovery sees.
public enum DiscoveryEvent: Sendable, Hashable {
    case added(DiscoveredServer)
    case updated(DiscoveredServer, changes: Set<ServerChange>)
    case removed(DiscoveredServer, reason: RemovalReason)
    case daemon(DaemonState)
}

/// What the Avahi adapter reports: raw sightings, before merging.
public enum BrowseEvent: Sendable, Hashable {
    case daemon(DaemonState)
    /// The browser saw a new sighting (not yet resolved).
    case found(RecordKey)
    /// The browser withdrew a sighting.
    case lost(RecordKey)
    case resolved(ResolvedRecord)
    case resolveFailed(RecordKey, reason: String)
    /// Avahi believes no more results will come soon.
    case allForNow
}
