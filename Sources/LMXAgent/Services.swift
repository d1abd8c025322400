import LMXCore
import LMXDiscovery
import Logging
import ServiceLifecycle
import UnixSignals

#if canImport(Glibc)
import Glibc
#endif

/// Runs the connection manager for the daemon's lifetime; on graceful shutdown stops its probes
/// and remembers the active endpoint. Started first, stopped last.
public struct ManagerService: Service {
    let manager: ConnectionManager

    public init(manager: ConnectionManager) { self.manager = manager }

    public func run() async throws {
        await manager.start()
        try? await gracefulShutdown()
        await manager.shutdown()
    }
}

/// Runs a service whose failure costs only itself (the gateway's TCP listener when its port is
/// taken): logs why, then waits for the daemon's shutdown like any other service.
public struct SoftFailService: Service {
    let base: any Service
    let name: String
    let logger: Logger

    public init(base: any Service, name: String, logger: Logger) {
        self.base = base
        self.name = name
        self.logger = logger
    }

    public func run() async throws {
        do {
            try await base.run()
        } catch {
            logger.warning("\(name) is not available: \(error); the rest of the agent carries on")
            try? await gracefulShutdown()
        }
    }
}

/// Ends every `/v1/watch` stream when the daemon stops. Listed after the status API, so it stops
/// first: the HTTP server then has no endless response to wait for.
public struct WatchDrainService: Service {
    let manager: ConnectionManager

    public init(manager: ConnectionManager) { self.manager = manager }

    public func run() async throws {
        try? await gracefulShutdown()
        await manager.closeWatchers()
    }
}

/// Browses `_opta-lmx._tcp` through avahi-daemon (waiting for it when absent, reconnecting after
/// restarts) and feeds merged events to the manager.
public struct DiscoveryService: Service {
    let manager: ConnectionManager
    let configuration: BrowseConfiguration
    let logger: Logger

    public init(manager: ConnectionManager, configuration: BrowseConfiguration, logger: Logger) {
        self.manager = manager
        self.configuration = configuration
        self.logger = logger
    }

    public func run() async throws {
        var registry = ServerRegistry()
        do {
            for try await event in AvahiBrowser.events(configuration).cancelOnGracefulShutdown() {
                for change in registry.apply(event) {
                    await manager.discovery(change)
                }
            }
        } catch is CancellationError {
        } catch {
            // Discovery is a hint: the agent keeps serving paired and remembered endpoints.
            logger.error("mDNS discovery stopped: \(error)")
            await manager.setDiscoveryState("failed", detail: "\(error)")
            try? await gracefulShutdown()
        }
    }
}

/// Reloads the config file on SIGHUP.
public struct ReloadService: Service {
    let manager: ConnectionManager
    let load: @Sendable () throws -> AgentConfiguration
    let logger: Logger

    public init(manager: ConnectionManager, logger: Logger, load: @escaping @Sendable () throws -> AgentConfiguration) {
        self.manager = manager
        self.load = load
        self.logger = logger
    }

    public func run() async throws {
        for await _ in await UnixSignalsSequence(trapping: .sighup).cancelOnGracefulShutdown() {
            do {
                await manager.reload(try load())
            } catch {
                logger.error("configuration not reloaded, keeping the previous one: \(error)")
            }
        }
    }
}

/// Tells systemd about readiness, status and liveness over `NOTIFY_SOCKET`, when it is set.
public struct SystemdNotifier: Service {
    let manager: ConnectionManager
    let socketPath: String?
    let watchdogInterval: Double?
    let ready: @Sendable () async -> Void

    /// - Parameter ready: returns once the daemon serves its socket.
    public init(manager: ConnectionManager, environment: [String: String], ready: @escaping @Sendable () async -> Void) {
        self.manager = manager
        self.socketPath = environment["NOTIFY_SOCKET"].flatMap { $0.isEmpty ? nil : $0 }
        let usec = environment["WATCHDOG_USEC"].flatMap(Double.init)
        self.watchdogInterval = usec.map { $0 / 1_000_000 / 2 }
        self.ready = ready
    }

    public func run() async throws {
        guard let socketPath else {
            try? await gracefulShutdown()
            return
        }
        await ready()
        Self.notify("READY=1\nSTATUS=\(await manager.statusLine())", socket: socketPath)
        let interval = min(watchdogInterval ?? 5, 5)
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            try? await Task.sleep(for: .milliseconds(Int64(interval * 1000)))
            var message = "STATUS=\(await manager.statusLine())"
            if watchdogInterval != nil { message += "\nWATCHDOG=1" }
            Self.notify(message, socket: socketPath)
        }
        Self.notify("STOPPING=1", socket: socketPath)
    }

    /// Sends one datagram to systemd's notification socket (abstract names start with `@`).
    static func notify(_ message: String, socket path: String) {
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return }
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        var bytes = Array(path.utf8)
        if bytes.first == UInt8(ascii: "@") { bytes[0] = 0 }
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return }
        withUnsafeMutableBytes(of: &address.sun_path) { buffer in
            buffer.copyBytes(from: bytes)
        }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count)
        let payload = Array(message.utf8)
        _ = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                sendto(fd, payload, payload.count, Int32(MSG_NOSIGNAL), sa, length)
            }
        }
    }
}

/// The daemon's socket file: refuses to start beside a live daemon, replaces a stale file.
public enum SocketGuard {
    public enum State: Equatable {
        case free, stale, live
        /// Something is there that is not ours to remove (not a socket, or not reachable for a
        /// reason other than "nobody listens"): the daemon stops rather than delete it.
        case unusable(String)
    }

    /// Whether something answers on `path`. Only a socket that refuses connections
    /// (`ECONNREFUSED`: its daemon is gone) is stale and may be replaced.
    public static func probe(_ path: String) -> State {
        var info = stat()
        guard lstat(path, &info) == 0 else { return .free }
        guard (info.st_mode & S_IFMT) == S_IFSOCK else { return .unusable("it exists and is not a socket") }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return .unusable("socket(): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return .unusable("the path is too long") }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        var wait = timeval(tv_sec: 1, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &wait, socklen_t(MemoryLayout<timeval>.size))
        let result = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        if result == 0 { return .live }
        switch errno {
        case ECONNREFUSED: return .stale
        case EAGAIN, EINPROGRESS: return .live  // a daemon with a full backlog is still a daemon
        case let code: return .unusable(String(cString: strerror(code)))
        }
    }

    /// Creates the socket's directory if needed (0755 so other users can reach the socket).
    public static func prepareDirectory(for path: String) throws {
        let directory = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        guard !directory.isEmpty else { return }
        var prefix = directory.hasPrefix("/") ? "" : "."
        for component in directory.split(separator: "/") {
            prefix += "/" + component
            if mkdir(prefix, 0o755) == 0 {
                chmod(prefix, 0o755)  // the daemon's umask is 077
            } else if errno != EEXIST {
                throw ConfigurationError("cannot create directory \(prefix) for the socket: \(String(cString: strerror(errno)))")
            }
        }
    }
}
