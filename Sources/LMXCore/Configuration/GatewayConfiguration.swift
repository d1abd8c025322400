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
    /// Bytes read ahead by all requests together, at most: past it, requests stream at once. One
    /// local user holds at most a quarter (4 MiB: 16 bodies read ahead whole at once, then the
    /// next stream as they come, as nginx's `proxy_request_buffering off`), which keeps the daemon's
    /// peak under 64 busy clients about 12 MiB lower than with 64 MiB.
    public var readAheadBudgetBytes = 16 * 1024 * 1024
    /// Seconds a request waits for a usable route (mid-failover, after resume) before 503.
    public var holdSeconds = 5.0
    /// The longest a busy server (429, or 503 overloaded, with `Retry-After`) is passed over.
    public var busyCooldownMax = 30.0
    /// Seconds a client's connection may stay silent: a kept connection with no request in
    /// progress is closed after this long, and a request whose body stops arriving is answered
    /// 408 and its connection closed (as nginx's `client_body_timeout`).
    public var clientTimeout = 60.0

    public static let defaultListen = HostPort(host: "127.0.0.1", port: 1235)

    public init() {}

    enum CodingKeys: String, CodingKey, CaseIterable {
        case enabled, listen, socket, admin, group
        case maxRequestBytes = "max_request_bytes"
        case attempts
        case connectTimeout = "connect_timeout"
        case maxConnectionsPerRoute = "max_connections_per_route"
        case holdSeconds = "hold_seconds"
        case busyCooldownMax = "busy_cooldown_max"
        case maxConnectionsPerUser = "max_connections_per_user"
        case readAheadBytes = "read_ahead_bytes"
        case readAheadBudgetBytes = "read_ahead_budget_bytes"
        case clientTimeout = "client_timeout"
    }

    public init(from decoder: any Decoder) throws {
        let c = try ConfigurationReader(decoder, keys: CodingKeys.self)
        let d = GatewayConfiguration()
        enabled = try c.value(.enabled, or: d.enabled)
        // `"listen": null` turns the TCP listener off, as `"off"` does.
        if c.container.contains(.listen), try c.container.decodeNil(forKey: .listen) {
            listen = nil
        } else {
            listen = try c.parsed(.listen, or: d.listen, Self.parseListen)
        }
        socket = try c.optional(.socket)
        admin = try c.value(.admin, or: d.admin)
        group = try c.optional(.group)
        if let group, group.isEmpty || group.contains(where: { $0 == ":" || $0 == "/" || $0.isWhitespace }) {
            throw c.invalid(.group, "must be a group name")
        }
        maxRequestBytes = try c.number(.maxRequestBytes, or: d.maxRequestBytes, in: 1024...(1 << 30))
        attempts = try c.number(.attempts, or: d.attempts, in: 1...10)
        connectTimeout = try c.number(.connectTimeout, or: d.connectTimeout, in: 0.1...60, unit: "seconds")
        maxConnectionsPerRoute = try c.number(.maxConnectionsPerRoute, or: d.maxConnectionsPerRoute, in: 1...10_000)
        maxConnectionsPerUser = try c.number(.maxConnectionsPerUser, or: d.maxConnectionsPerUser, in: 1...100_000)
        readAheadBytes = try c.number(.readAheadBytes, or: d.readAheadBytes, in: 1024...(64 << 20))
        readAheadBudgetBytes = try c.number(
            .readAheadBudgetBytes, or: d.readAheadBudgetBytes, in: readAheadBytes...(1 << 32))
        holdSeconds = try c.number(.holdSeconds, or: d.holdSeconds, in: 0...120, unit: "seconds")
        busyCooldownMax = try c.number(.busyCooldownMax, or: d.busyCooldownMax, in: 0...3600, unit: "seconds")
        clientTimeout = try c.number(.clientTimeout, or: d.clientTimeout, in: 1...3600, unit: "seconds")
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
            throw ConfigurationError(key: "gateway.listen", "\(text) is not host:port (127.0.0.1:1235)")
        }
        guard let port = parsed.port else {
            throw ConfigurationError(key: "gateway.listen", "\(text) needs a port (127.0.0.1:1235)")
        }
        let hostPort = HostPort(host: parsed.host, port: port)
        let host = hostPort.host.lowercased()
        let loopback = host == "localhost" || host == "::1" || host.hasPrefix("127.")
        guard loopback else {
            throw ConfigurationError(
                key: "gateway.listen",
                "\(text) is not a loopback address: the gateway lends its routes' keys to every caller, so it listens on 127.0.0.1 or ::1 only"
            )
        }
        return HostPort(host: host == "localhost" ? "127.0.0.1" : host, port: hostPort.port)
    }
}

extension GatewayConfiguration {
    /// The keys (as the config file names them) whose values differ between `old` and `new`.
    public static func changedKeys(from old: GatewayConfiguration, to new: GatewayConfiguration) -> [String] {
        var keys: [String] = []
        func note(_ key: CodingKeys, _ changed: Bool) { if changed { keys.append(key.rawValue) } }
        note(.enabled, old.enabled != new.enabled)
        note(.listen, old.listen != new.listen)
        note(.socket, old.socket != new.socket)
        note(.admin, old.admin != new.admin)
        note(.group, old.group != new.group)
        note(.maxRequestBytes, old.maxRequestBytes != new.maxRequestBytes)
        note(.attempts, old.attempts != new.attempts)
        note(.connectTimeout, old.connectTimeout != new.connectTimeout)
        note(.maxConnectionsPerRoute, old.maxConnectionsPerRoute != new.maxConnectionsPerRoute)
        note(.holdSeconds, old.holdSeconds != new.holdSeconds)
        note(.busyCooldownMax, old.busyCooldownMax != new.busyCooldownMax)
        note(.maxConnectionsPerUser, old.maxConnectionsPerUser != new.maxConnectionsPerUser)
        note(.readAheadBytes, old.readAheadBytes != new.readAheadBytes)
        note(.readAheadBudgetBytes, old.readAheadBudgetBytes != new.readAheadBudgetBytes)
        note(.clientTimeout, old.clientTimeout != new.clientTimeout)
        // A setting added later and not named above is still told, under the section's name.
        if keys.isEmpty, old != new { keys.append("(a setting)") }
        return keys
    }
}
