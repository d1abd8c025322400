import HummingbirdCore
import LMXCore
import LMXSystem
import Logging
import NIOCore
import Synchronization

/// Connections per local user on the agent's socket. Any local user may connect (reading the
/// status is for everyone), so one user must not be able to take every connection, descriptor
/// or watcher: past `perUser` open connections, a user's next one is closed at once. Root and
/// the daemon's own user are not limited (they administer the agent).
public final class ConnectionLimiter: Sendable {
    public let perUser: Int
    private let open = Mutex<[UInt32: Int]>([:])
    private let refusedCount = Mutex(0)

    public init(perUser: Int) { self.perUser = perUser }

    /// Counts a new connection of `uid`; false when that user is at the limit.
    func admit(_ uid: UInt32) -> Bool {
        if Users.isAdministrator(uid) { return true }
        let admitted = open.withLock { counts in
            guard counts[uid, default: 0] < perUser else { return false }
            counts[uid, default: 0] += 1
            return true
        }
        if !admitted { refusedCount.withLock { $0 += 1 } }
        return admitted
    }

    func release(_ uid: UInt32) {
        if Users.isAdministrator(uid) { return }
        open.withLock { counts in
            let left = counts[uid, default: 1] - 1
            counts[uid] = left > 0 ? left : nil
        }
    }

    /// Connections refused so far for being over a user's limit.
    public var refused: Int { refusedCount.withLock { $0 } }
}

/// Large answers (`/v1/status`, `/v1/servers`, a watch snapshot) being built for each local user
/// at once, at most `perUser`: a user who asks for many at a time gets 429 past it, so memory
/// spent on answers stays bounded per user whatever the number of routes. Root and the agent's
/// own user are not limited.
public final class LargeAnswerGate: Sendable {
    private let building: ConnectionLimiter

    public init(perUser: Int) { building = ConnectionLimiter(perUser: perUser) }

    /// Runs `body` if `uid` is under the limit; nil (nothing run) when it is not.
    func run<T>(for uid: UInt32?, _ body: () async throws -> T) async rethrows -> T? {
        let key = uid ?? UInt32.max  // a peer the kernel did not name counts as one user
        guard building.admit(key) else { return nil }
        defer { building.release(key) }
        return try await body()
    }

    /// The answer past the limit: 429, try again in a second.
    static func busy() -> Response {
        var busy = StatusServer.json(
            StatusAPI.ErrorBody(
                error: "busy", reason: "too many large answers at once for this user; retry in a moment"),
            status: .tooManyRequests)
        busy.headers[.retryAfter] = "1"
        return busy
    }
}

/// A child channel that admits a connection only while its peer's user is under the limit,
/// then hands it to the HTTP/1 channel. The peer's user is the kernel's word: `SO_PEERCRED` on a
/// Unix socket, the socket tables (sock_diag) for a loopback TCP connection; a peer the kernel
/// does not name counts as one unknown user.
extension ConnectionLimiter {
    /// Admits `channel` if its peer's user is under the limit (counted until it closes): the
    /// peer's uid as the kernel names it (nil when it does not); a refused channel is closed
    /// and the future fails.
    func admit(_ channel: any Channel, logger: Logger) -> EventLoopFuture<UInt32?> {
        channel.peerUID().flatMapThrowing { known in
            try self.admit(channel, peer: known, logger: logger)
            return known
        }
    }

    /// Admits `channel`, whose peer's uid is `known` (nil: the kernel does not name it), or
    /// closes it and throws.
    func admit(_ channel: any Channel, peer known: UInt32?, logger: Logger) throws {
        let uid = known ?? UInt32.max
        guard admit(uid) else {
            logger.debug("refused a connection over the per-user limit", metadata: ["uid": "\(uid)"])
            channel.close(promise: nil)
            throw ChannelError.inputClosed
        }
        channel.closeFuture.whenComplete { _ in self.release(uid) }
    }
}

struct PerUserLimitedChannel<Base: ServerChildChannel>: ServerChildChannel {
    typealias Value = Base.Value
    let base: Base
    let limiter: ConnectionLimiter

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        limiter.admit(channel, logger: logger).flatMap { _ in base.setup(channel: channel, logger: logger) }
    }

    func handle(value: Value, logger: Logger) async {
        await base.handle(value: value, logger: logger)
    }
}

extension Channel {
    /// The user at the other end, as the kernel says: `SO_PEERCRED` on a Unix socket, the socket
    /// tables for a TCP connection between two sockets of this machine; nil otherwise.
    func peerUID() -> EventLoopFuture<UInt32?> {
        switch peerUIDAtOnce {
        case .known(let uid): eventLoop.makeSucceededFuture(uid)
        case .later:
            peerCredentialsFuture().map { $0.map { Optional($0.uid) }.recover { _ in nil } }
                ?? eventLoop.makeSucceededFuture(nil)
        }
    }

    /// The peer's user when it is known without waiting: on a TCP connection from the kernel's
    /// socket tables (nil when they do not name it), on anything but a Unix socket nil; a Unix
    /// socket's `SO_PEERCRED` is read through a future (``peerUID()``).
    var peerUIDAtOnce: PeerUID {
        switch (localAddress, remoteAddress) {
        case (.unixDomainSocket?, _):
            return .later
        case (let local?, let remote?):
            guard let local = local.bytesAndPort, let remote = remote.bytesAndPort else { return .known(nil) }
            return .known(SocketOwner.uid(peer: remote, local: local))
        default:
            return .known(nil)
        }
    }
}

/// Whether a connection's peer user is known at once (``Channel/peerUIDAtOnce``).
enum PeerUID {
    /// Known now (nil: the kernel does not name it).
    case known(UInt32?)
    /// Read through a future (``Channel/peerUID()``).
    case later
}

extension SocketAddress {
    /// An IP address's bytes (4 or 16) and its port in host order, read from the socket address
    /// itself (not through its text); nil for a Unix socket.
    var bytesAndPort: (address: [UInt8], port: UInt16)? {
        switch self {
        case .v4(let ip):
            var address = ip.address.sin_addr
            return (withUnsafeBytes(of: &address) { Array($0) }, UInt16(bigEndian: ip.address.sin_port))
        case .v6(let ip):
            var address = ip.address.sin6_addr
            return (withUnsafeBytes(of: &address) { Array($0) }, UInt16(bigEndian: ip.address.sin6_port))
        default:
            return nil
        }
    }
}
