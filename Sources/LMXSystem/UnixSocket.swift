import CLinux
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// A Unix socket address (`sockaddr_un`); a path starting with `@` names an abstract socket.
public struct UnixSocketAddress: Sendable {
    public let path: String
    private let bytes: [UInt8]

    /// The longest path `sun_path` holds with its closing NUL (107 bytes on Linux).
    public static let maxPathBytes = MemoryLayout.size(ofValue: sockaddr_un().sun_path) - 1

    /// Nil when the path does not fit in `sun_path`.
    public init?(_ path: String) {
        var bytes = Array(path.utf8)
        if bytes.first == UInt8(ascii: "@") { bytes[0] = 0 }
        guard !bytes.isEmpty, bytes.count <= Self.maxPathBytes else { return nil }
        self.path = path
        self.bytes = bytes
    }

    /// Calls `body` with the address and its length.
    func withSockaddr<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> R) -> R {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        // Abstract names are exactly as long as given; paths use the whole structure.
        let length =
            bytes[0] == 0
            ? socklen_t(MemoryLayout<sa_family_t>.size + bytes.count) : socklen_t(MemoryLayout<sockaddr_un>.size)
        return withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, length) }
        }
    }
}

/// A connected stream socket, closed when dropped.
public final class UnixStream {
    public let fd: Int32

    public enum ConnectError: Error, Sendable {
        /// No socket file, or nobody listens (`ECONNREFUSED`).
        case notListening(String)
        case forbidden
        /// The listen backlog stayed full for the whole send timeout.
        case timedOut
        case other(String)
    }

    /// Connects to `address`. `sendTimeout` is set before connecting: on a Unix socket whose
    /// backlog is full, connect waits that long rather than forever. `receiveTimeout` nil: none.
    public init(connectingTo address: UnixSocketAddress, sendTimeout: Double, receiveTimeout: Double?)
        throws(ConnectError)
    {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .other("socket(): \(SystemError.describe(errno))") }
        Self.setTimeout(fd, SO_SNDTIMEO, sendTimeout)
        let result = address.withSockaddr { connect(fd, $0, $1) }
        if result != 0 {
            let code = errno
            close(fd)
            switch code {
            case EACCES, EPERM: throw .forbidden
            case EAGAIN, EINPROGRESS: throw .timedOut
            case ENOENT: throw .notListening("no socket file")
            default: throw .notListening(SystemError.describe(code))
            }
        }
        if let receiveTimeout {
            Self.setTimeout(fd, SO_RCVTIMEO, receiveTimeout)
            Self.setTimeout(fd, SO_SNDTIMEO, receiveTimeout)
        }
        self.fd = fd
    }

    deinit { close(fd) }

    private static func setTimeout(_ fd: Int32, _ option: Int32, _ seconds: Double) {
        var tv = timeval(tv_sec: Int(seconds), tv_usec: Int((seconds - Double(Int(seconds))) * 1_000_000))
        setsockopt(fd, SOL_SOCKET, option, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    /// Sends all of `bytes`; false when the peer went away.
    public func send(_ bytes: [UInt8]) -> Bool {
        var sent = 0
        while sent < bytes.count {
            let result = SystemCall.retrying {
                bytes[sent...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            }
            guard case .success(let n) = result, n > 0 else { return false }
            sent += n
        }
        return true
    }

    public enum ReceiveResult {
        case data([UInt8])
        case end
        case timedOut
        case failed(String)
    }

    /// Whatever arrives next (at most 16 KiB).
    public func receive() -> ReceiveResult {
        var chunk = [UInt8](repeating: 0, count: 16_384)
        switch SystemCall.retrying({ chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) } }) {
        case .success(0): return .end
        case .success(let n): return .data(Array(chunk[0..<n]))
        case .failure(let error) where error == .resourceTemporarilyUnavailable || error == .wouldBlock:
            return .timedOut
        case .failure(let error): return .failed(SystemError.describe(error.rawValue))
        }
    }
}

/// A daemon's socket file: whether another daemon serves it, and its directory.
public enum SocketFile {
    public enum State: Equatable, Sendable {
        case free, stale, live
        /// Something is there that is not ours to remove (not a socket, or not reachable for a
        /// reason other than "nobody listens").
        case unusable(String)
    }

    /// Whether something answers on `path`. Only a socket that refuses connections
    /// (`ECONNREFUSED`: its daemon is gone) is stale and may be replaced.
    public static func probe(_ path: String) -> State {
        guard let info = FileSystem.info(path) else { return .free }
        guard info.kind == .socket else { return .unusable("it exists and is not a socket") }
        guard let address = UnixSocketAddress(path) else { return .unusable("the path is too long") }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return .unusable("socket(): \(SystemError.describe(errno))") }
        defer { close(fd) }
        var wait = timeval(tv_sec: 1, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &wait, socklen_t(MemoryLayout<timeval>.size))
        if address.withSockaddr({ connect(fd, $0, $1) }) == 0 { return .live }
        switch errno {
        case ECONNREFUSED: return .stale
        case EAGAIN, EINPROGRESS: return .live  // a daemon with a full backlog is still a daemon
        case let code: return .unusable(SystemError.describe(code))
        }
    }

    /// Creates the socket's directory if needed (0755 so other users can reach the socket).
    public static func prepareDirectory(for path: String) throws(SystemError) {
        let directory = FileSystem.directory(of: path)
        guard directory != "." && directory != "/" else { return }
        try FileSystem.makeDirectories(directory, mode: 0o755)
    }
}

/// systemd's notification protocol (`sd_notify`): one datagram to `NOTIFY_SOCKET`.
public enum ServiceNotification {
    public static func send(_ message: String, socket path: String) {
        guard let address = UnixSocketAddress(path) else { return }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return }
        defer { close(fd) }
        let payload = Array(message.utf8)
        _ = address.withSockaddr { sendto(fd, payload, payload.count, Int32(MSG_NOSIGNAL), $0, $1) }
    }
}

/// The peer of a Unix socket connection, as the kernel saw it at connect time (`SO_PEERCRED`,
/// Linux's `struct ucred`, which Swift does not import without `_GNU_SOURCE`).
public struct PeerCredentials: Sendable {
    /// The kernel's structure, as `getsockopt` fills it.
    private var raw = lmx_ucred()

    public var pid: Int32 { raw.pid }
    public var uid: UInt32 { raw.uid }
    public var gid: UInt32 { raw.gid }

    public init() {}

    /// The socket option's level and name, for NIO's `unsafeGetSocketOption`.
    public static let optionLevel: Int32 = SOL_SOCKET
    public static let optionName: Int32 = SO_PEERCRED
}
