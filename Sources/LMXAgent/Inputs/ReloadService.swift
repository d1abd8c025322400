import LMXCore
import Logging
import ServiceLifecycle
import UnixSignals

/// Reloads the config file on SIGHUP and hands it to whoever follows it.
public struct ReloadService: Service {
    let load: @Sendable () throws -> AgentConfiguration
    let apply: @Sendable (AgentConfiguration) async -> Void
    let logger: Logger

    public init(
        logger: Logger, load: @escaping @Sendable () throws -> AgentConfiguration,
        apply: @escaping @Sendable (AgentConfiguration) async -> Void
    ) {
        self.load = load
        self.apply = apply
        self.logger = logger
    }

    public func run() async throws {
        for await _ in await UnixSignalsSequence(trapping: .sighup).cancelOnGracefulShutdown() {
            do {
                await apply(try load())
            } catch {
                logger.error("configuration not reloaded, keeping the previous one: \(error)")
            }
        }
    }
}
