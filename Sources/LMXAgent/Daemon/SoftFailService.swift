import Logging
import ServiceLifecycle

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
