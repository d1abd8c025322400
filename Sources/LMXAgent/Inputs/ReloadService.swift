import LMXCore
import Logging
import ServiceLifecycle
import UnixSignals

/// Reloads the config file on SIGHUP and hands it to whoever follows it; `reread` runs on every
/// SIGHUP, whether the config file loads or not (the address books are read again).
public struct ReloadService: Service {
    let load: @Sendable () throws -> AgentConfiguration
    let apply: @Sendable (AgentConfiguration) async -> Void
    let reread: @Sendable () async -> Void
    let logger: Logger

    public init(
        logger: Logger, load: @escaping @Sendable () throws -> AgentConfiguration,
        reread: @escaping @Sendable () async -> Void = {},
        apply: @escaping @Sendable (AgentConfiguration) async -> Void
    ) {
        self.load = load
        self.apply = apply
        self.reread = reread
        self.logger = logger
    }

    public func run() async throws {
        for await _ in await UnixSignalsSequence(trapping: .sighup).cancelOnGracefulShutdown() {
            await reread()
            do {
                await apply(try load())
            } catch {
                logger.error("configuration not reloaded, keeping the previous one: \(error)")
            }
        }
    }
}
