#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The local OpenAI-compatible gateway (`"gateway": {…}` in the config file): one fixed local
/// URL that forwards `/v1/*` to whichever endpoint is active, with that route's credentials.
public struct GatewayConfiguration: Sendable, Hashable, Decodable {
    /// Serve the gateway at all.
    public var enabled = true
    /// TCP listener, loopback only: `127.0.0.1:1235`, `[::1]:1235`; nil: no TCP listener.
    public var listen: HostPort? = GatewayConfiguration.defaultListen
    /// The gateway's Unix socket; nil: `gateway.sock` beside the status socket.
    public var socket: String?
    /// Forward `/admin/*` too (with the route's admin key). Off: the gateway answers 403.
    public var admin = false
    /// Only members of this group (and root, and the daemon's user) may use the gateway; the
    /// Unix socket checks the caller (`SO_PEERCRED`), and the TCP listener is then off because
    /// a TCP caller cannot be identified.
    public var group: String?
    /// Largest request body forwarded, in bytes.
    public var maxRequestBytes = 32 * 1024 * 1024
    /// Routes tried for one request (the active one, then fallbacks) before giving up.
    public var attempts = 3
    /// Seconds to connect to a route before trying the next (LAN; tunnels get 8).
    public var connectTimeout = 1.5
    /// Connections the gateway opens to one route at most (as many streams at once). Past it a
    /// request waits for a connection; waiting is never counted against the route.
    public var maxConnectionsPerRoute = 256
    /// Connections one local user may hold open to the gateway (socket and TCP together; root and
    /// the agent's own user are not limited).
    public var maxConnectionsPerUser = 256
    /// Bytes of a request body read before it is forwarded, at most: routing by `model` looks
    /// at them, and a body that ends within them can be sent again (busy server, route gone).
    /// Larger bodies stream through as they come.
    public var readAheadBytes = 256 * 1024
    /// Bytes read ahead by all requests together, at most: past it, requests stream at once.
    public var readAheadBudgetBytes = 64 * 1024 * 1024
    /// Seconds a request waits for a usable route (mid-failover, after resume) before 503.
    public var holdSeconds = 5.0
    /// The longest a busy server (429, or 503 overloaded, with `Retry-After`) is passed over.
    public var busyCooldownMax = 30.0

    public static let defaultListen = HostPort(host: "127.0.0.1", port: 1235)

    public init() {}

    enum CodingKeys: String, CodingKey, CaseIterable {
        case enabled, listen, socket, admin, group, maxRequestBytes = "max_request_bytes", attempts
        case connectTimeout = "connect_timeout", maxConnectionsPerRoute = "max_connections_per_route"
        case holdSeconds = "hold_seconds", busyCooldownMax = "busy_cooldown_max"
        case maxConnectionsPerUser = "max_connections_per_user", readAheadBytes = "read_ahead_bytes"
        case readAheadBudgetBytes = "read_ahead_budget_bytes"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        enabled = try c.decodeIfPresent(Bool.self, forKey: .enabled) ?? true
        if c.contains(.listen) {
            if try c.decodeNil(forKey: .listen) {
                listen = nil
            } else {
                let text = try c.decode(String.self, forKey: .listen)
                do {
                    listen = try Self.parseListen(text)
                } catch {
                    throw DecodingError.dataCorruptedError(forKey: .listen, in: c, debugDescription: error.description)
                }
            }
        }
        socket = try c.decodeIfPresent(String.self, forKey: .socket)
        admin = try c.decodeIfPresent(Bool.self, forKey: .admin) ?? false
        group = try c.decodeIfPresent(String.self, forKey: .group)
        if let group, group.isEmpty || group.contains(where: { $0 == ":" || $0 == "/" || $0.isWhitespace }) {
            throw DecodingError.dataCorruptedError(forKey: .group, in: c, debugDescription: "must be a group name")
        }
        maxRequestBytes = try c.decodeIfPresent(Int.self, forKey: .maxRequestBytes) ?? maxRequestBytes
        guard (1024...(1 << 30)).contains(maxRequestBytes) else {
            throw DecodingError.dataCorruptedError(forKey: .maxRequestBytes, in: c, debugDescription: "must be between 1024 and 1073741824")
        }
        attempts = try c.decodeIfPresent(Int.self, forKey: .attempts) ?? attempts
        guard (1...10).contains(attempts) else {
            throw DecodingError.dataCorruptedError(forKey: .attempts, in: c, debugDescription: "must be between 1 and 10")
        }
        connectTimeout = try c.decodeIfPresent(Double.self, forKey: .connectTimeout) ?? connectTimeout
        guard connectTimeout >= 0.1, connectTimeout <= 60 else {
            throw DecodingError.dataCorruptedError(forKey: .connectTimeout, in: c, debugDescription: "must be between 0.1 and 60 seconds")
        }
        maxConnectionsPerRoute = try c.decodeIfPresent(Int.self, forKey: .maxConnectionsPerRoute) ?? maxConnectionsPerRoute
        guard (1...10_000).contains(maxConnectionsPerRoute) else {
            throw DecodingError.dataCorruptedError(forKey: .maxConnectionsPerRoute, in: c, debugDescription: "must be between 1 and 10000")
        }
        maxConnectionsPerUser = try c.decodeIfPresent(Int.self, forKey: .maxConnectionsPerUser) ?? maxConnectionsPerUser
        guard (1...100_000).contains(maxConnectionsPerUser) else {
            throw DecodingError.dataCorruptedError(forKey: .maxConnectionsPerUser, in: c, debugDescription: "must be between 1 and 100000")
        }
        readAheadBytes = try c.decodeIfPresent(Int.self, forKey: .readAheadBytes) ?? readAheadBytes
        guard (1024...(64 << 20)).contains(readAheadBytes) else {
            throw DecodingError.dataCorruptedError(forKey: .readAheadBytes, in: c, debugDescription: "must be between 1024 and 67108864")
        }
        readAheadBudgetBytes = try c.decodeIfPresent(Int.self, forKey: .readAheadBudgetBytes) ?? readAheadBudgetBytes
        guard readAheadBudgetBytes >= readAheadBytes, readAheadBudgetBytes <= 1 << 32 else {
            throw DecodingError.dataCorruptedError(forKey: .readAheadBudgetBytes, in: c, debugDescription: "must be at least read_ahead_bytes and at most 4 GiB")
        }
        holdSeconds = try c.decodeIfPresent(Double.self, forKey: .holdSeconds) ?? holdSeconds
        guard holdSeconds >= 0, holdSeconds <= 120 else {
            throw DecodingError.dataCorruptedError(forKey: .holdSeconds, in: c, debugDescription: "must be between 0 and 120 seconds")
        }
        busyCooldownMax = try c.decodeIfPresent(Double.self, forKey: .busyCooldownMax) ?? busyCooldownMax
        guard busyCooldownMax >= 0, busyCooldownMax <= 3600 else {
            throw DecodingError.dataCorruptedError(forKey: .busyCooldownMax, in: c, debugDescription: "must be between 0 and 3600 seconds")
        }
    }

    /// `127.0.0.1:1235`, `[::1]:1235`, `localhost:1235`, or `off`. Only loopback: the gateway
    /// lends the routes' credentials to whoever connects, so it never listens on a network.
    public static func parseListen(_ text: String) throws(ConfigurationError) -> HostPort? {
        let lower = text.lowercased()
        if lower == "off" || lower == "none" || lower.isEmpty { return nil }
        let parsed: (host: String, port: Int?, isIPv6: Bool)
        do {
            parsed = try HostPort.parseAuthority(text, field: "listen")
        } catch {
            throw ConfigurationError("gateway.listen: \(text) is not host:port (127.0.0.1:1235)")
        }
        guard let port = parsed.port else { throw ConfigurationError("gateway.listen: \(text) needs a port (127.0.0.1:1235)") }
        let hostPort = HostPort(host: parsed.host, port: port)
        let host = hostPort.host.lowercased()
        let loopback = host == "localhost" || host == "::1" || host.hasPrefix("127.")
        guard loopback else {
            throw ConfigurationError(
                "gateway.listen: \(text) is not a loopback address: the gateway lends its routes' keys to every caller, so it listens on 127.0.0.1 or ::1 only")
        }
        return HostPort(host: host == "localhost" ? "127.0.0.1" : host, port: hostPort.port)
    }
}
