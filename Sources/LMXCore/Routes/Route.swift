#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// How a route reaches its server.
public enum Via: String, Sendable, Hashable, Codable, CaseIterable {
    /// Directly on the local network.
    case lan
    /// Through a tunnel on the internet (Cloudflare Tunnel).
    case wan
}

/// Where the agent learned of a route.
public enum RouteSource: String, Sendable, Hashable, Codable, CaseIterable {
    /// Announced over mDNS (`_opta-lmx._tcp`).
    case mdns
    /// Imported from a pairing code.
    case pairing
    /// Written in the config file or given on the command line.
    case manual
    /// Seen before and remembered in the store; not (yet) announced this run.
    case remembered

    /// Set up by the user (paired or configured), as opposed to found on the LAN.
    public var isSetUp: Bool { self == .pairing || self == .manual }

    /// Found on the LAN (announced now, or remembered from earlier announcements).
    public var isFound: Bool { self == .mdns || self == .remembered }
}

/// The secrets that go with a route. Never printed, logged or returned over the socket:
/// `description` and `debugDescription` say only which ones are set.
public struct Credentials: Sendable, Hashable, CustomStringConvertible, CustomDebugStringConvertible {
    /// Sent as `X-Admin-Key` to `/admin/*` only.
    public var adminKey: String?
    /// Sent as `Authorization: Bearer` to `/v1/*` only.
    public var inferenceKey: String?
    /// Cloudflare Access service token, sent on every request to the route.
    public var accessClientID: String?
    public var accessClientSecret: String?

    public init(
        adminKey: String? = nil, inferenceKey: String? = nil,
        accessClientID: String? = nil, accessClientSecret: String? = nil
    ) {
        self.adminKey = adminKey.nonBlank
        self.inferenceKey = inferenceKey.nonBlank
        self.accessClientID = accessClientID.nonBlank
        self.accessClientSecret = accessClientSecret.nonBlank
    }

    public var isEmpty: Bool {
        adminKey == nil && inferenceKey == nil && accessClientID == nil && accessClientSecret == nil
    }

    /// Every value can be sent as a header value: no control character but tab (a key from a
    /// configuration file could hold a line break, which would start a header of its own).
    public var isHeaderSafe: Bool {
        func safe(_ value: String?) -> Bool {
            value?.utf8.allSatisfy { $0 == 0x09 || ($0 >= 0x20 && $0 != 0x7F) } ?? true
        }
        // (Checked on every request the gateway forwards: no list made for it.)
        return safe(adminKey) && safe(inferenceKey) && safe(accessClientID) && safe(accessClientSecret)
    }

    /// Headers for one request path, by the contract's rules: Access token everywhere, admin key
    /// only under `/admin/`, inference key only under `/v1/`, and no key at all on the paths the
    /// contract leaves open (`/healthz`, `/readyz`, the discovery document): a probe that has not
    /// yet learned who answers never shows a key.
    public func headers(forPath path: String) -> [(name: String, value: String)] {
        var headers: [(String, String)] = []
        if let id = accessClientID, let secret = accessClientSecret {
            headers.append(("CF-Access-Client-Id", id))
            headers.append(("CF-Access-Client-Secret", secret))
        }
        // (Four comparisons, most ended by the length: cheaper than hashing the path, on every
        // request of the gateway.)
        if Self.isOpen(path: path) { return headers }
        if let key = adminKey, path == "/admin" || path.hasPrefix("/admin/") {
            headers.append(("X-Admin-Key", key))
        }
        if let key = inferenceKey, path == "/v1" || path.hasPrefix("/v1/") {
            headers.append(("Authorization", "Bearer \(key)"))
        }
        return headers
    }

    /// Paths every server answers without a key (CONTRACT §2).
    public static let openPaths: [String] = ["/healthz", "/readyz", TXTRecord.defaultServicePath, "/v1/discovery"]

    /// `path` is one of ``openPaths``: compared by length first (a `String` comparison of two
    /// texts that differ takes a call into the standard library's slow path, on every request).
    public static func isOpen(path: String) -> Bool {
        let count = path.utf8.count
        for open in openPaths where open.utf8.count == count && open == path { return true }
        return false
    }

    /// The server's own keys (inference and admin), without the tunnel's Access token: what a
    /// vouched LAN route of the same server carries.
    public var serverKeys: Credentials { Credentials(adminKey: adminKey, inferenceKey: inferenceKey) }

    /// Which secrets are set, by name only: `["admin_key", "cf_access"]`.
    public var setNames: [String] {
        var names: [String] = []
        if adminKey != nil { names.append("admin_key") }
        if inferenceKey != nil { names.append("api_key") }
        if accessClientID != nil || accessClientSecret != nil { names.append("cf_access") }
        return names
    }

    public var description: String { "Credentials(set: \(setNames.joined(separator: ", ")))" }
    public var debugDescription: String { description }
}

/// One way to reach one Opta LMX server: a base URL plus what is needed to talk to it.
/// Several routes can lead to the same server (IPv4, IPv6, a tunnel): they are merged into one
/// candidate by the `instance_id` the server reports.
public struct Route: Sendable, Hashable, Identifiable {
    /// Stable identifier: `lan/<host:port>` for plain-HTTP LAN routes, `lan/https://<host:port>`
    /// for HTTPS ones (the scheme is part of a route's identity: an announcement of the same
    /// address over `http://` is another route), `wan/<url>` for tunnels.
    public var id: String
    /// Scheme, host and port, parsed once.
    public var base: BaseURL
    /// Scheme, host and port, no trailing slash: `http://10.0.0.5:1234`.
    public var baseURL: String { base.text }
    public var via: Via
    public var source: RouteSource
    /// Label for people: the mDNS instance name, the pairing's name, or the host.
    public var name: String
    /// Discovery document path (TXT `path`), default `/.well-known/opta-lmx`.
    public var servicePath: String
    /// Expected `instance_id`; a server answering with another one is the wrong service.
    public var pinnedInstance: String?
    public var credentials: Credentials
    /// Addresses the route was announced with (mDNS), for display.
    public var addresses: [String]
    /// Still announced over mDNS (only meaningful for `.mdns` routes).
    public var announced: Bool
    /// For a LAN route the server listed through its tunnel: the id of that tunnel's route.
    /// `nil` for everything else (the user wrote it, or it was announced).
    public var vouchedBy: String?
    /// For an announced route, where it was found: "mDNS on eth0" or "DNS domain example.lan".
    public var foundBy: String?

    public init(
        id: String? = nil, baseURL: String, via: Via, source: RouteSource, name: String,
        servicePath: String = TXTRecord.defaultServicePath, pinnedInstance: String? = nil,
        credentials: Credentials = Credentials(), addresses: [String] = [], announced: Bool = false,
        vouchedBy: String? = nil, foundBy: String? = nil
    ) {
        let base = BaseURL(baseURL)
        self.id = id ?? Route.identifier(base, via: via)
        self.base = base
        self.via = via
        self.source = source
        self.name = name
        self.servicePath = servicePath
        self.pinnedInstance = pinnedInstance
        self.credentials = credentials
        self.addresses = addresses
        self.announced = announced
        self.vouchedBy = vouchedBy
        self.foundBy = foundBy
    }

    public static func identifier(baseURL: String, via: Via) -> String {
        identifier(BaseURL(baseURL), via: via)
    }

    static func identifier(_ base: BaseURL, via: Via) -> String {
        switch via {
        case .lan: base.isPlainHTTP ? "lan/\(base.hostPort)" : "lan/\(base.text)"
        case .wan: "wan/\(base.text)"
        }
    }

    /// The OpenAI-compatible base URL (`…/v1`).
    public var openAIBaseURL: String { baseURL + "/v1" }
}

extension Route {
    /// The LAN route to a discovered server: its first non-loopback IPv4 address, else a global
    /// IPv6 one, else loopback (a server on this machine, seen on `lo`), else, as the last resort,
    /// an IPv6 link-local address (`fe80::/10`) with the interface it was seen on as its zone
    /// (`http://[fe80::1%25eth0]:1234`): two machines joined by a cable, a network without IPv4.
    /// Addresses the `AddressPolicy` refuses (loopback announced from another host, unspecified,
    /// multicast, broadcast, metadata) are never used.
    public static func lan(for server: DiscoveredServer) -> Route? {
        let records = server.records.filter {
            AddressPolicy.refusal($0.address, onLoopbackInterface: $0.key.interface.isLoopback) == nil
        }
        func linkLocal(_ record: ResolvedRecord) -> Bool { ServerAddress.isLinkLocalIPv6(record.address) }
        let record =
            records.first {
                $0.key.ipProtocol == .ipv4 && !$0.key.interface.isLoopback && !$0.address.hasPrefix("127.")
            }
            ?? records.first { $0.key.ipProtocol == .ipv6 && !linkLocal($0) && !$0.key.interface.isLoopback }
            ?? records.first { $0.key.ipProtocol == .ipv4 }
            ?? records.first { !linkLocal($0) }
            // Link-local: only with its zone (``ResolvedRecord`` adds the interface it was seen on).
            ?? records.first { linkLocal($0) && $0.address.contains("%") && !$0.key.interface.isLoopback }
        guard let record, record.port != 0 else { return nil }
        let host = ServerAddress.hostPort(ServerAddress.urlEscapedZone(record.address), port: record.port)
        return Route(
            baseURL: "http://\(host)", via: .lan, source: .mdns, name: ServerTable.printable(server.name),
            servicePath: record.txt.servicePath,
            addresses: server.addresses, announced: true, foundBy: server.foundBy)
    }

    /// The addresses of a discovered server that the agent refuses to connect to, with why.
    public static func refusedAddresses(of server: DiscoveredServer) -> [(address: String, reason: String)] {
        server.records.compactMap { record in
            AddressPolicy.refusal(record.address, onLoopbackInterface: record.key.interface.isLoopback)
                .map { (record.address, $0) }
        }
    }
}
