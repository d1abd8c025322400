/// How this machine reaches a LAN route's address, as its own interfaces and routing table say
/// (read by the agent after every change of links, addresses or routes).
public enum RoutePath: Sendable, Hashable, CustomStringConvertible {
    /// A route exists: `detail` names the interface and local address ("on-link on lan0 from
    /// 10.254.0.14"); `onLink`: the address is on that interface's own subnet.
    case reachable(String, onLink: Bool)
    /// No route at all, or only over an interface without a carrier: why, in words and as a
    /// code (``Cause/linkLost``, ``Cause/unreachable``, ``Cause/addressLost``).
    case unreachable(String, cause: Cause)

    public var description: String {
        switch self {
        case .reachable(let detail, _): detail
        case .unreachable(let why, _): why
        }
    }
}
