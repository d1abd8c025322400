import LMXCore
import LMXDiscovery
import Logging
import ServiceLifecycle

/// Browses `_opta-lmx._tcp` through avahi-daemon (waiting for it when absent, reconnecting after
/// restarts) and feeds merged events to the manager.
public struct DiscoveryService: Service {
    let manager: ConnectionManager
    let configuration: BrowseConfiguration
    /// Asks avahi-daemon again when a link comes up (`MachineWatcher`).
    let requery: AvahiRequery?
    let logger: Logger

    public init(
        manager: ConnectionManager, configuration: BrowseConfiguration, requery: AvahiRequery? = nil, logger: Logger
    ) {
        self.manager = manager
        self.configuration = configuration
        self.requery = requery
        self.logger = logger
    }

    public func run() async throws {
        var registry = ServerRegistry()
        do {
            for try await event in AvahiBrowser.events(configuration, requery: requery).cancelOnGracefulShutdown() {
                for change in registry.apply(event) {
                    await manager.discovery(change)
                }
            }
        } catch is CancellationError {
        } catch {
            // Discovery is a hint: the agent keeps serving paired and remembered endpoints.
            logger.error("mDNS discovery stopped: \(error)")
            await manager.discoveryEnded(.failed("\(error)"))
            try? await gracefulShutdown()
        }
    }
}
