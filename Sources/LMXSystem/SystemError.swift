#if canImport(Glibc)
import Glibc
#endif

/// A failed system call: what was attempted and the kernel's reason.
public struct SystemError: Error, Sendable, CustomStringConvertible {
    public let code: Int32
    public let action: String

    public init(_ action: String, code: Int32 = errno) {
        self.action = action
        self.code = code
    }

    public var reason: String { Self.describe(code) }
    public var description: String { "\(action): \(reason)" }

    /// The kernel's text for an errno value.
    public static func describe(_ code: Int32) -> String { String(cString: strerror(code)) }

    /// What a socket error means to someone connecting.
    public enum ConnectFailure: Sendable, Equatable {
        case refused, reset, unreachable, timedOut
        /// This machine has no address on a network that reaches it.
        case noAddress
        /// A firewall on this machine blocks it.
        case blocked
        case other
    }

    /// What a failure to reach an address means, in a person's words (no errno name or number):
    /// for reasons shown in `lmx-status`, the dashboard and notifications.
    public static func connectWords(_ code: Int32) -> String {
        switch code {
        case ECONNREFUSED: "nothing accepts connections on that port"
        case ECONNRESET, EPIPE: "the connection was cut"
        case ETIMEDOUT: "it did not answer in time"
        case ENETUNREACH, EHOSTUNREACH, EHOSTDOWN: "this machine has no way to that network now"
        case ENETDOWN: "the network interface towards it is down"
        case EINVAL, EADDRNOTAVAIL: "this machine has no address on a network that reaches it"
        case EACCES, EPERM: "a firewall on this machine blocks the connection"
        case EMFILE, ENFILE, ENOBUFS, ENOMEM: "this machine is short of resources (too many connections open)"
        default: "the connection could not be made from this machine"
        }
    }

    public static func connectFailure(_ code: Int32) -> ConnectFailure {
        switch code {
        case ECONNREFUSED: .refused
        case ECONNRESET, EPIPE: .reset
        case EHOSTUNREACH, ENETUNREACH, EHOSTDOWN, ENETDOWN: .unreachable
        case ETIMEDOUT: .timedOut
        case EINVAL, EADDRNOTAVAIL: .noAddress
        case EACCES, EPERM: .blocked
        default: .other
        }
    }
}
