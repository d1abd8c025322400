import LMXSystem
import NIOCore

/// The longest path the agent can bind a Unix socket at, and the check every socket path it
/// binds (the status socket, the gateway's) passes before it is used.
///
/// Two limits apply, and the lower one decides. The kernel's: `sun_path` holds 108 bytes with
/// the closing NUL, so 107. SwiftNIO's, which binds both sockets: `SocketAddress(unixDomainSocketPath:)`
/// refuses paths over 103 bytes (the size of macOS's `sun_path`), with `unixDomainSocketPathTooLong`.
/// A check against the kernel's limit alone let 104–107-byte paths through to a bind that failed.
public enum SocketPathLimit {
    /// The kernel's limit (`sizeof(sun_path) - 1`).
    public static let kernel = UnixSocketAddress.maxPathBytes

    /// The longest path both the kernel and SwiftNIO accept: asked of SwiftNIO itself, so that
    /// the check follows its rule if it changes.
    public static let bindable: Int = {
        var count = kernel
        while count > 1,
            (try? SocketAddress(unixDomainSocketPath: "/" + String(repeating: "s", count: count - 1))) == nil
        {
            count -= 1
        }
        return count
    }()

    /// Why a socket cannot be bound at `path` (naming it and the limit), or nil when it can be.
    public static func problem(_ path: String) -> String? {
        let count = path.utf8.count
        if count == 0 { return "the socket path is empty" }
        if path.utf8.contains(0) { return "the socket path \(path) holds a NUL byte" }
        guard count > bindable else { return nil }
        return
            "the socket path \(path) is \(count) bytes, over the \(bindable) bytes a Unix socket can be bound at (sun_path holds \(kernel), SwiftNIO binds at most \(bindable))"
    }
}
