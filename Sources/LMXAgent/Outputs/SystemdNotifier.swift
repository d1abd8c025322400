import LMXCore
import LMXSystem
import ServiceLifecycle

/// Tells systemd about readiness, status and liveness over `NOTIFY_SOCKET`, when it is set.
public struct SystemdNotifier: Service {
    let board: StateBoard
    let socketPath: String?
    let watchdogInterval: Double?
    let ready: @Sendable () async -> Void

    /// - Parameter ready: returns once the daemon serves its socket.
    public init(board: StateBoard, environment: [String: String], ready: @escaping @Sendable () async -> Void) {
        self.board = board
        self.socketPath = environment["NOTIFY_SOCKET"].flatMap { $0.isEmpty ? nil : $0 }
        // Digits only (as systemd writes it); anything else means no watchdog interval.
        let usec = environment["WATCHDOG_USEC"].flatMap(OutsideInput.contentLength)
        self.watchdogInterval = usec.map { min(max(Double($0) / 1_000_000 / 2, 0.1), 5) }
        self.ready = ready
    }

    public func run() async throws {
        guard let socketPath else {
            try? await gracefulShutdown()
            return
        }
        await ready()
        ServiceNotification.send("READY=1\nSTATUS=\(board.snapshot.statusLine)", socket: socketPath)
        let interval = min(watchdogInterval ?? 5, 5)
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            try? await Task.sleep(for: .milliseconds(Int64(interval * 1000)))
            var message = "STATUS=\(board.snapshot.statusLine)"
            if watchdogInterval != nil { message += "\nWATCHDOG=1" }
            ServiceNotification.send(message, socket: socketPath)
        }
        ServiceNotification.send("STOPPING=1", socket: socketPath)
    }
}
