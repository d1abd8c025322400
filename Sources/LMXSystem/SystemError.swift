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
        case refused, reset, unreachable, timedOut, other
    }

    public static func connectFailure(_ code: Int32) -> ConnectFailure {
        switch code {
        case ECONNREFUSED: .refused
        case ECONNRESET, EPIPE: .reset
        case EHOSTUNREACH, ENETUNREACH, EHOSTDOWN, ENETDOWN: .unreachable
        case ETIMEDOUT: .timedOut
        default: .other
        }
    }
}
