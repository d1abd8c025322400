/// One pairing: how to reach one Opta LMX server from anywhere (a WAN tunnel with its secrets)
/// and/or on the LAN (a `host:port` hint), whatever code or link it came from.
public struct Pairing: Sendable, Hashable {
    /// Stable short identifier (`p` + 8 hex digits), derived from the pairing's identity: the
    /// pinned instance, else the tunnel URL, else the LAN address. The same code imported twice,
    /// on any machine, gets the same id.
    public var id: String
    /// Label for people.
    public var name: String?
    /// What the pairing was read from.
    public var format: PairingFormat
    public var wan: WANEndpoint?
    public var lan: HostPort?
    /// Expected `instance_id` (identity pin).
    public var instance: String?
    /// Unix seconds after which the pairing is not used.
    public var expiresAt: Int64?

    public init(
        name: String? = nil, format: PairingFormat, wan: WANEndpoint? = nil, lan: HostPort? = nil,
        instance: String? = nil, expiresAt: Int64? = nil, id: String? = nil
    ) {
        self.name = name
        self.format = format
        self.wan = wan
        self.lan = lan
        self.instance = instance
        self.expiresAt = expiresAt
        self.id = id ?? Pairing.identifier(instance: instance, wanURL: wan?.url, lan: lan)
    }

    /// `p` + the first 8 hex digits of the FNV-1a hash of the identity key.
    public static func identifier(instance: String?, wanURL: String?, lan: HostPort?) -> String {
        let key =
            if let instance { "instance:\(instance)" } else if let wanURL { "url:\(wanURL)" } else {
                "lan:\(lan?.description ?? "")"
            }
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in key.utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x0000_0100_0000_01b3
        }
        let hex = String(hash >> 32, radix: 16)
        return "p" + String(repeating: "0", count: 8 - hex.count) + hex
    }

    /// A label for people: the name, else the tunnel's host, else the LAN address.
    public var label: String {
        if let name, !name.isEmpty { return name }
        if let wan { return wan.host }
        return lan?.description ?? id
    }

    /// True when `other` describes the same server connection: same pinned instance, same
    /// tunnel URL, or (neither has a tunnel) the same LAN address.
    public func isSameServer(as other: Pairing) -> Bool {
        if let a = instance, let b = other.instance { return a == b }
        // The desktop manager's address book keys entries by LAN host:port and rewrites the
        // quick tunnel's URL when cloudflared restarts: same entry, new tunnel.
        if format == .addressBook || other.format == .addressBook, let a = lan, let b = other.lan { return a == b }
        if let a = wan?.url, let b = other.wan?.url { return a == b }
        if wan == nil, other.wan == nil, let a = lan, let b = other.lan { return a == b }
        return false
    }

    /// This pairing updated by a newer import of the same server: what the newer one carries
    /// replaces the old value; what it lacks is kept. Secrets are kept only while the tunnel's
    /// host stays the same, so a key is never sent to a host it was not issued for.
    public func updated(by newer: Pairing) -> Pairing {
        var result = self
        result.name = newer.name ?? name
        result.format = newer.format
        result.instance = newer.instance ?? instance
        result.lan = newer.lan ?? lan
        result.expiresAt = newer.expiresAt ?? expiresAt
        if var wan = newer.wan {
            if let old = self.wan, old.url == wan.url {
                wan.credentials = Credentials(
                    adminKey: wan.credentials.adminKey ?? old.credentials.adminKey,
                    inferenceKey: wan.credentials.inferenceKey ?? old.credentials.inferenceKey,
                    accessClientID: wan.credentials.accessClientID ?? old.credentials.accessClientID,
                    accessClientSecret: wan.credentials.accessClientSecret ?? old.credentials.accessClientSecret)
            }
            result.wan = wan
        }
        return result
    }

    /// The routes the agent probes for this pairing: the tunnel (with its secrets) and the LAN
    /// address the user gave. The LAN route carries the server's own keys (never the tunnel's
    /// Access token), over plain HTTP as Opta's own apps send them, unless `lanKeys` is `never`.
    public func routes(lanKeys: LANKeys = .vouched) -> [Route] {
        var routes: [Route] = []
        if let wan {
            routes.append(
                Route(
                    baseURL: wan.url, via: .wan, source: .pairing, name: label, pinnedInstance: instance,
                    credentials: wan.credentials))
        }
        if let lan {
            // A host *name* is resolved by whoever answers on the LAN (mDNS): like the names a
            // tunnel lists, it never gets the keys over plain HTTP. The server's IP addresses that
            // its tunnel vouches for become keyed routes of their own.
            let keyed = lanKeys == .vouched && !lanIsName
            routes.append(
                Route(
                    baseURL: "http://\(lan)", via: .lan, source: .pairing, name: label, pinnedInstance: instance,
                    credentials: keyed ? (wan?.credentials.serverKeys ?? Credentials()) : Credentials(),
                    addresses: [lan.host]))
        }
        return routes
    }

    /// The LAN hint is a host name, not an IP address literal.
    public var lanIsName: Bool {
        guard let lan else { return false }
        return IPAddress.bytes(lan.host) == nil
    }
}

/// Where a pairing came from (CONTRACT §4).
public enum PairingFormat: String, Sendable, Hashable, Codable, CaseIterable {
    /// `opta-lmx://pair?v=1&…`
    case token = "v1-token"
    /// `https://x.trycloudflare.com?key=…`
    case tunnelURL = "tunnel-url"
    /// `https://…/connect?host&port&via&tunnel`
    case connectLink = "connect-link"
    /// `https://…/pair?session&deviceId&host&port`
    case pairLink = "pair-link"
    /// `lmx-connections.json`
    case addressBook = "address-book"
}

/// A tunnel: an `https://host[:port]` base URL and the secrets that go with it.
public struct WANEndpoint: Sendable, Hashable {
    /// The tunnel's base, parsed once.
    public var base: BaseURL
    /// Normalised base: lower-case scheme and host, no path, no trailing slash.
    public var url: String { base.text }
    public var credentials: Credentials

    public init(url: String, credentials: Credentials = Credentials()) {
        self.base = BaseURL(url)
        self.credentials = credentials
    }

    public var host: String { base.hostPort }
}
