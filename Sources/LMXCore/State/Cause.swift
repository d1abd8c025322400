/// Why something happened to a route, as a code for programs: it travels beside the sentence
/// for people (a probe's `detail`, an event's `reason`), so that no reader parses the sentence
/// back into a cause. The set is closed and documented (docs/socket-api.md, "Cause codes"); a
/// code this agent does not know (from a newer one) decodes as ``unknown``, never as an error.
public enum Cause: String, Sendable, Hashable, CaseIterable, Codable {
    // No HTTP answer (a probe, or a request of the gateway's).
    /// Nothing accepts connections on the port (`ECONNREFUSED`).
    case refused
    /// The connection was cut before an answer (reset, closed).
    case reset
    /// No answer in time: the connection, or the answer.
    case timedOut = "timed_out"
    /// No way to the host's network: host or network unreachable, or no route to it.
    case unreachable
    /// This machine has no address on a network that reaches the host.
    case addressLost = "address_lost"
    /// A firewall on this machine blocks the connection.
    case blocked
    /// The host's name does not resolve.
    case nameUnresolved = "name_unresolved"
    /// The secure connection failed: a certificate not trusted or not matching, a handshake.
    case tls
    /// Any other failure to connect.
    case connectionFailed = "connection_failed"

    // An answer, but not a usable server's.
    /// An HTTP status the contract does not expect (a `/readyz` 500, a redirect on the LAN).
    case httpStatus = "http_status"
    /// The server refused the keys (401, 403).
    case keysRefused = "keys_refused"
    /// A redirect to a login page: Cloudflare Access's, for a missing or stale Access token.
    case loginPage = "login_page"
    /// The server sheds load (429, or 503 with `overloaded`): alive, asked to come back later.
    case overloaded
    /// The server answers but is not ready (`/readyz` 503: starting, or no model loaded).
    case notReady = "not_ready"
    /// The tunnel answered for a server it cannot reach, or is down itself (502, 524, 530).
    case tunnelDown = "tunnel_down"
    /// A request was answered by an HTML error page of the tunnel's edge (Cloudflare's 52x).
    case edgeError = "edge_error"
    /// The network answered with a web page of its own: a captive portal asking for a sign-in.
    case captivePortal = "captive_portal"
    /// Something else than an Opta LMX server answers there.
    case wrongService = "wrong_service"
    /// Another Opta LMX server than the one paired answers there (its `instance_id`).
    case wrongInstance = "wrong_instance"
    /// The active server's `/admin/events` stream went silent where a heartbeat was due.
    case eventsSilent = "events_silent"

    // This machine's network.
    /// The link towards the host has no carrier (a cable out, Wi-Fi gone).
    case linkLost = "link_lost"
    /// This machine is no longer on the host's network (it still has a route, not on-link).
    case leftNetwork = "left_network"

    // A route that goes.
    /// Removed from the configuration file.
    case configRemoved = "config_removed"
    /// Its pairing was removed, or updated without it.
    case pairingRemoved = "pairing_removed"
    /// Its pairing expired.
    case pairingExpired = "pairing_expired"
    /// The tunnel that vouched for the address was removed, or no longer lists it.
    case unvouched
    /// A found route forgotten: not announced for `forget_after`, or too many were seen.
    case forgotten

    // Why the active route changed when nothing failed.
    /// The first route usable since the start (or since none was).
    case firstUsable = "first_usable"
    /// A better route is usable: a higher rank, earlier in `prefer`, or healthy for the
    /// stability window.
    case preferred
    /// A route this machine had lost (a network change, a sleep) answers again.
    case reachableAgain = "reachable_again"

    // Trust.
    /// An announcer claims the identity of a server the user set up, from an address nobody
    /// vouches for.
    case impostor
    /// The trust policy does not let the route be used (an announcement, once something is set up).
    case untrusted
    /// The server requires an inference key and the route carries none.
    case keyMissing = "key_missing"

    /// A code this agent does not know (sent by a newer one), or none could be told.
    case unknown

    /// Decodes any string: a code this version does not know is ``unknown``.
    public init(from decoder: any Decoder) throws {
        self = Cause(code: try decoder.singleValueContainer().decode(String.self))
    }

    /// The cause a code names; ``unknown`` for one this version does not know.
    public init(code: String) {
        self = Cause(rawValue: code) ?? .unknown
    }

    /// What a verdict says of its cause when nothing more precise is known (a report recorded by
    /// an older version); nil for `ready`.
    public init?(verdict: HealthVerdict) {
        switch verdict {
        case .ready: return nil
        case .aliveNotReady: self = .notReady
        case .overloaded: self = .overloaded
        case .authRejected: self = .keysRefused
        case .tunnelDown: self = .tunnelDown
        case .wrongService: self = .wrongService
        case .down: self = .unknown
        }
    }
}
