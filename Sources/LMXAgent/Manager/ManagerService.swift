import ServiceLifecycle

/// Runs the connection manager for the daemon's lifetime: started first, stopped last, so that
/// its final state (the active endpoint) is remembered after every other service has stopped.
public struct ManagerService: Service {
    let manager: ConnectionManager

    public init(manager: ConnectionManager) { self.manager = manager }

    public func run() async throws {
        await withGracefulShutdownHandler {
            await manager.run()
        } onGracefulShutdown: { [manager] in
            Task { await manager.stop() }
        }
    }
}
