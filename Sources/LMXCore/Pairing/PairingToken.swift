extension Pairing {
    /// The pairing as a code another machine can import: the v1 token when there is a tunnel,
    /// else a dashboard connect link for the LAN address. Holds the secrets: show it only to
    /// the pairing's owner.
    public func token() -> String {
        func field(_ name: String, _ value: String?) -> String? {
            guard let value, !value.isEmpty else { return nil }
            return "\(name)=\(Self.percentEncode(value))"
        }
        if let wan {
            let c = wan.credentials
            let fields: [String?] = [
                "v=1", field("name", name), field("url", wan.url), field("key", c.adminKey),
                field("api_key", c.inferenceKey),
                field("cf_id", c.accessClientID), field("cf_secret", c.accessClientSecret), field("instance", instance),
                field("lan", lan?.description), expiresAt.map { "exp=\($0)" },
            ]
            return "opta-lmx://pair?" + fields.compactMap { $0 }.joined(separator: "&")
        }
        let lan = self.lan ?? HostPort(host: "localhost", port: HostPort.defaultPort)
        let fields: [String?] = [
            field("host", lan.isIPv6 ? "[\(lan.host)]" : lan.host), "port=\(lan.port)", "via=lan", field("name", name),
        ]
        return "https://lmx.optalocal.com/connect?" + fields.compactMap { $0 }.joined(separator: "&")
    }

    /// Percent-encodes everything but RFC 3986's unreserved characters (for a URL path part).
    public static func percentEncodeComponent(_ value: String) -> String { percentEncode(value) }

    /// Percent-encodes everything but RFC 3986's unreserved characters.
    static func percentEncode(_ value: String) -> String {
        var out = ""
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                let hex = String(byte, radix: 16, uppercase: true)
                out += "%" + (hex.count == 1 ? "0" + hex : hex)
            }
        }
        return out
    }

    /// What can be shown of the pairing: everything but the secrets, which are named only.
    public var summary: PairingSummary {
        PairingSummary(
            id: id, name: name, format: format, url: wan?.url, lan: lan?.description, instance: instance,
            secrets: wan?.credentials.setNames ?? [],
            expiresAt: expiresAt.map { Timestamp.iso8601(Double($0)) })
    }
}

/// A pairing as shown to people and tools (`lmx-pair list --json`, the socket): no secret values.
public struct PairingSummary: Sendable, Hashable, Codable {
    public var id: String
    public var name: String?
    public var format: PairingFormat
    /// The tunnel's base URL.
    public var url: String?
    /// The LAN hint, `host:port`.
    public var lan: String?
    public var instance: String?
    /// Which secrets are set (`admin_key`, `api_key`, `cf_access`); never their values.
    public var secrets: [String]
    public var expiresAt: String?
    /// When it was first imported and last updated (ISO 8601), once stored.
    public var createdAt: String?
    public var updatedAt: String?
    /// The agent's routes for it, with their current verdicts (from the running agent only).
    public var routes: [PairingRouteState]?

    enum CodingKeys: String, CodingKey {
        case id, name, format, url, lan, instance, secrets, routes
        case expiresAt = "expires_at"
        case createdAt = "created_at"
        case updatedAt = "updated_at"
    }

    public init(
        id: String, name: String?, format: PairingFormat, url: String?, lan: String?, instance: String?,
        secrets: [String], expiresAt: String?, createdAt: String? = nil, updatedAt: String? = nil,
        routes: [PairingRouteState]? = nil
    ) {
        self.id = id
        self.name = name
        self.format = format
        self.url = url
        self.lan = lan
        self.instance = instance
        self.secrets = secrets
        self.expiresAt = expiresAt
        self.createdAt = createdAt
        self.updatedAt = updatedAt
        self.routes = routes
    }
}

/// One of a pairing's routes as the running agent sees it.
public struct PairingRouteState: Sendable, Hashable, Codable {
    public var id: String
    public var baseURL: String
    public var via: Via
    /// `ready`, `tunnel-down`, `auth-rejected`…; nil until probed.
    public var verdict: HealthVerdict?
    public var detail: String?
    public var active: Bool

    enum CodingKeys: String, CodingKey {
        case id
        case baseURL = "base_url"
        case via, verdict, detail, active
    }

    public init(id: String, baseURL: String, via: Via, verdict: HealthVerdict?, detail: String?, active: Bool) {
        self.id = id
        self.baseURL = baseURL
        self.via = via
        self.verdict = verdict
        self.detail = detail
        self.active = active
    }
}
