/// The IP protocol a DNS-SD record was seen over (Avahi's `AvahiProtocol`).
public enum IPProtocol: String, Sendable, Hashable, Codable, CaseIterable, Comparable {
    case ipv4 = "IPv4"
    case ipv6 = "IPv6"

    public static func < (lhs: IPProtocol, rhs: IPProtocol) -> Bool {
        lhs == .ipv4 && rhs == .ipv6
    }
}

/// A network interface as the kernel names it.
public struct NetworkInterface: Sendable, Hashable, Comparable {
    public var index: Int32
    public var name: String

    public init(index: Int32, name: String) {
        self.index = index
        self.name = name
    }

    public var isLoopback: Bool { name == "lo" }

    /// Stands for "no interface" in a record read from unicast DNS (wide-area DNS-SD), which is
    /// not tied to a link.
    public static let unicastDNS = NetworkInterface(index: 0, name: "")

    /// A record of unicast DNS, not of mDNS on a link.
    public var isUnicastDNS: Bool { self == .unicastDNS }

    public static func < (lhs: NetworkInterface, rhs: NetworkInterface) -> Bool {
        (lhs.isLoopback ? 1 : 0, lhs.name, lhs.index) < (rhs.isLoopback ? 1 : 0, rhs.name, rhs.index)
    }
}

/// A DNS-SD service instance: the triple that names one advertised service.
///
/// The instance name is opaque: it may contain dots, spaces and any UTF-8, and is never
/// split or reinterpreted.
public struct ServiceInstanceID: Sendable, Hashable, Comparable, CustomStringConvertible {
    public var name: String
    public var type: String
    public var domain: String

    public init(name: String, type: String, domain: String) {
        self.name = name
        self.type = type
        self.domain = domain
    }

    public static func < (lhs: ServiceInstanceID, rhs: ServiceInstanceID) -> Bool {
        (lhs.name, lhs.type, lhs.domain) < (rhs.name, rhs.type, rhs.domain)
    }

    public var description: String {
        "\(DNSSDText.escapeLabel(name)).\(type).\(domain)"
    }
}

/// One sighting of a service instance: Avahi reports each instance once per interface and
/// protocol, and resolves each sighting separately.
public struct RecordKey: Sendable, Hashable, Comparable {
    public var instance: ServiceInstanceID
    public var interface: NetworkInterface
    public var ipProtocol: IPProtocol

    public init(instance: ServiceInstanceID, interface: NetworkInterface, ipProtocol: IPProtocol) {
        self.instance = instance
        self.interface = interface
        self.ipProtocol = ipProtocol
    }

    public static func < (lhs: RecordKey, rhs: RecordKey) -> Bool {
        if lhs.instance != rhs.instance { return lhs.instance < rhs.instance }
        if lhs.ipProtocol != rhs.ipProtocol { return lhs.ipProtocol < rhs.ipProtocol }
        return lhs.interface < rhs.interface
    }
}

/// A resolved sighting: where the instance answers on one interface and protocol.
public struct ResolvedRecord: Sendable, Hashable {
    public var key: RecordKey
    /// The SRV target as Avahi reported it (e.g. `Mono512.local`). Informational only: the
    /// address is what to connect to, since macOS hosts can publish odd targets.
    public var hostName: String
    /// The resolved address; IPv6 link-local addresses carry `%ifname`.
    public var address: String
    public var port: UInt16
    public var txt: TXTRecord

    public init(key: RecordKey, hostName: String, address: String, port: UInt16, txt: TXTRecord) {
        self.key = key
        self.hostName = hostName
        self.address = ServerAddress.scoped(address, interface: key.interface.name)
        self.port = port
        self.txt = txt
    }
}

/// Address helpers.
public enum ServerAddress {
    /// Adds `%ifname` to an IPv6 link-local address (`fe80::/10`), which is unusable without it.
    public static func scoped(_ address: String, interface: String) -> String {
        guard !interface.isEmpty, address.contains(":"), !address.contains("%"), isLinkLocalIPv6(address) else {
            return address
        }
        return "\(address)%\(interface)"
    }

    /// An address with its zone as a URL writes it: `fe80::1%eth0` → `fe80::1%25eth0` (RFC 6874).
    public static func urlEscapedZone(_ address: String) -> String {
        guard let percent = address.firstIndex(of: "%") else { return address }
        return address[..<percent] + "%25" + address[address.index(after: percent)...]
    }

    static func isLinkLocalIPv6(_ address: String) -> Bool {
        let lower = address.lowercased()
        // fe80::/10 covers fe80 through febf.
        guard lower.hasPrefix("fe"), lower.count >= 4 else { return false }
        let third = lower[lower.index(lower.startIndex, offsetBy: 2)]
        return "89ab".contains(third)
    }

    /// `host:port`, with IPv6 in brackets.
    public static func hostPort(_ address: String, port: UInt16) -> String {
        address.contains(":") ? "[\(address)]:\(port)" : "\(address):\(port)"
    }
}
