import HummingbirdCore
import LMXCore
import LMXSystem
import Logging
import NIOCore
import Synchronization

/// Connections per local user on the agent's socket and the gateway. Any local user may connect
/// (reading the status is for everyone), so one user must not be able to take every connection,
/// descriptor or watcher: past `perUser` open connections, a user's next one is closed at once.
/// Root and the daemon's own user are not limited (they administer the agent).
///
/// Whose a TCP connection is costs a question to the kernel's socket tables (two system calls,
/// ``SocketOwner``), and it matters only once `perUser` connections are open in all: until then
/// no user can be at the limit, so a connection is admitted without asking
/// (``admitUnnamed(_:logger:)``), and its user is asked for only when the total reaches the limit
/// (then every connection still unnamed is named at once, so each user's count is exact from that
/// moment) or when something else needs it (``uid(of:)``).
public final class ConnectionLimiter: Sendable {
    public let perUser: Int
    private let state = Mutex(State())
    private let refusedCount = Mutex(0)

    fileprivate struct State {
        /// Open connections by user, of those whose user is known; administrators not counted.
        var open: [UInt32: Int] = [:]
        /// The connections `open` counts.
        var named = 0
        /// Connections admitted without asking whose they are.
        var unnamed: [Admission] = []

        /// Every open connection that may count against a user's limit.
        var total: Int { named + unnamed.count }
    }

    /// One admitted connection, until it is released: whose it is, once known. Its fields change
    /// under the limiter's lock only.
    final class Admission: @unchecked Sendable {
        fileprivate enum Whose {
            /// Not asked yet: the connection's place in `unnamed`.
            case unnamed(slot: Int)
            /// The kernel's answer (`UInt32.max`: it named nobody, counted as one unknown user).
            case user(UInt32)
            /// Over its user's limit: never counted.
            case refused(UInt32)
            case released
        }
        fileprivate var whose: Whose
        /// Asks the kernel whose the connection is (nil once asked).
        fileprivate var ask: (@Sendable () -> UInt32?)?

        fileprivate init(_ whose: Whose, ask: (@Sendable () -> UInt32?)?) {
            self.whose = whose
            self.ask = ask
        }
    }

    public init(perUser: Int) { self.perUser = perUser }

    /// Counts a new connection of `uid`; false when that user is at the limit.
    func admit(_ uid: UInt32) -> Bool {
        admit(Admission(.user(uid), ask: nil))
    }

    /// Counts a new connection whose user `ask` tells (nil: nobody named), asked only when it
    /// matters; nil when its user is at the limit.
    func admitUnnamed(asking ask: @escaping @Sendable () -> UInt32?) -> Admission? {
        let admission = Admission(.unnamed(slot: -1), ask: ask)
        return admit(admission) ? admission : nil
    }

    func release(_ uid: UInt32) {
        guard !Users.isAdministrator(uid) else { return }
        state.withLock { $0.forget(uid) }
    }

    /// Counts `admission` (named, or to be named); false when its user is at the limit.
    private func admit(_ admission: Admission) -> Bool {
        let admitted = state.withLock { s -> Bool in
            if case .unnamed = admission.whose, s.total < perUser {
                admission.whose = .unnamed(slot: s.unnamed.count)
                s.unnamed.append(admission)
                return true
            }
            // At the limit in all: every user's count must be exact before this one is counted.
            if s.total >= perUser { s.nameAll() }
            let uid = admission.name()
            if Users.isAdministrator(uid) { return true }
            guard s.open[uid, default: 0] < perUser else {
                admission.whose = .refused(uid)
                return false
            }
            s.count(uid)
            return true
        }
        if !admitted { refusedCount.withLock { $0 += 1 } }
        return admitted
    }

    /// The connection's user as the kernel names it (nil: it names nobody), asked now if it was
    /// not yet.
    func uid(of admission: Admission) -> UInt32? {
        let uid = state.withLock { s -> UInt32? in
            switch admission.whose {
            case .unnamed(let slot):
                s.remove(slot)
                let uid = admission.name()
                s.count(uid)
                return uid
            case .user(let uid), .refused(let uid):
                return uid
            case .released:
                return nil
            }
        }
        return uid == UInt32.max ? nil : uid
    }

    /// The connection has closed.
    func release(_ admission: Admission) {
        state.withLock { s in
            switch admission.whose {
            case .unnamed(let slot):
                s.remove(slot)
            case .user(let uid):
                if !Users.isAdministrator(uid) { s.forget(uid) }
            case .refused, .released:
                break
            }
            admission.whose = .released
            admission.ask = nil
        }
    }

    /// Connections refused so far for being over a user's limit.
    public var refused: Int { refusedCount.withLock { $0 } }

    /// Open connections not yet named (for tests).
    var unnamedCount: Int { state.withLock { $0.unnamed.count } }
}

extension ConnectionLimiter.State {
    /// Takes the unnamed connection in `slot` out of `unnamed` (the last one takes its place).
    fileprivate mutating func remove(_ slot: Int) {
        let last = unnamed.removeLast()
        if slot < unnamed.count {
            unnamed[slot] = last
            last.whose = .unnamed(slot: slot)
        }
    }

    /// Asks the kernel whose every unnamed connection is, and counts each under its user.
    fileprivate mutating func nameAll() {
        for admission in unnamed { count(admission.name()) }
        unnamed = []
    }

    /// Counts one more connection of `uid` (administrators are not counted).
    fileprivate mutating func count(_ uid: UInt32) {
        guard !Users.isAdministrator(uid) else { return }
        open[uid, default: 0] += 1
        named += 1
    }

    fileprivate mutating func forget(_ uid: UInt32) {
        let left = open[uid, default: 1] - 1
        open[uid] = left > 0 ? left : nil
        named -= 1
    }
}

extension ConnectionLimiter.Admission {
    /// The user a refused connection was over the limit of (for the log).
    fileprivate var refusedUID: String {
        if case .refused(let uid) = whose { return "\(uid)" }
        return "unknown"
    }

    /// Whose the connection is: asked of the kernel if it was not yet (`UInt32.max` when it names
    /// nobody), and kept. (Under the limiter's lock.)
    fileprivate func name() -> UInt32 {
        if case .user(let uid) = whose { return uid }
        let uid = ask?() ?? UInt32.max
        whose = .user(uid)
        ask = nil
        return uid
    }
}

/// A connection's user as its limiter knows it: asked of the kernel the first time it is needed
/// (``ConnectionLimiter/uid(of:)``), then kept.
struct PeerUser: Sendable {
    let limiter: ConnectionLimiter
    let admission: ConnectionLimiter.Admission

    /// The uid (nil: the kernel names nobody, counted as one unknown user).
    var uid: UInt32? { limiter.uid(of: admission) }
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
    func admit(_ channel: any Channel, logger: Logger) -> EventLoopFuture<Admission> {
        channel.peerUID().flatMapThrowing { known in
            try self.admit(channel, peer: known, logger: logger)
        }
    }

    /// Admits `channel`, whose peer's uid is `known` (nil: the kernel does not name it), or
    /// closes it and throws.
    @discardableResult
    func admit(_ channel: any Channel, peer known: UInt32?, logger: Logger) throws -> Admission {
        try admit(channel, as: Admission(.user(known ?? UInt32.max), ask: nil), logger: logger)
    }

    /// Admits a TCP connection without asking whose it is while no user can be at the limit
    /// (see the type's description), or closes it and throws.
    func admitUnnamed(_ channel: any Channel, logger: Logger) throws -> Admission {
        let ask: @Sendable () -> UInt32? = {
            if case .known(let uid) = channel.peerUIDAtOnce { return uid }
            return nil
        }
        return try admit(channel, as: Admission(.unnamed(slot: -1), ask: ask), logger: logger)
    }

    private func admit(_ channel: any Channel, as admission: Admission, logger: Logger) throws -> Admission {
        guard admit(admission) else {
            logger.debug("refused a connection over the per-user limit", metadata: ["uid": "\(admission.refusedUID)"])
            channel.close(promise: nil)
            throw ChannelError.inputClosed
        }
        channel.closeFuture.whenComplete { _ in self.release(admission) }
        return admission
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
