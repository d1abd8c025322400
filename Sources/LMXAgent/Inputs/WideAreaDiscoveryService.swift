import LMXCore
import LMXDiscovery
import Logging
import ServiceLifecycle

/// Follows `_opta-lmx._tcp` in unicast DNS domains (wide-area DNS-SD): the configured
/// `browse_domains` and those the network announces under its search domains. Servers found
/// this way are candidates like those mDNS announces, under the same trust rules.
public struct WideAreaDiscoveryService: Service {
    let manager: ConnectionManager
    let domains: [String]
    let announced: Bool
    let logger: Logger

    public init(manager: ConnectionManager, domains: [String], announced: Bool, logger: Logger) {
        self.manager = manager
        self.domains = domains
        self.announced = announced
        self.logger = logger
    }

    public func run() async throws {
        var registry = ServerRegistry()
        for await event in WideAreaBrowser.events(domains: domains, announced: announced).cancelOnGracefulShutdown() {
            for change in registry.apply(event) {
                if case .added(let server) = change {
                    logger.info(
                        "\(ServerTable.printable(server.name)) is listed in the DNS domain \(server.id.domain).",
                        metadata: ["addresses": "\(server.addresses.joined(separator: ", "))"])
                }
                await manager.discovery(change)
            }
        }
    }
}

/// While nothing is usable, runs the checks of `lmx-discover --doctor` now and then and puts
/// their findings in the status (`lmx-status`, the dashboard); clears them once something is.
/// It probes nothing itself: the agent's own probes say how each server answers.
public struct DoctorService: Service {
    let manager: ConnectionManager
    let checks: DoctorChecks
    /// Seconds with nothing usable before the first check, and between checks.
    let grace: Double
    let interval: Double
    /// Past this many announced servers, discovery works and the routes' own reasons say why none
    /// is usable: the checks (a browse that resolves every announcement) are not made.
    static let maxAnnounced = 16

    /// The agent's state as it changes: while something is usable the service waits for the
    /// next change instead of looking every second (an idle daemon's threads sleep). Nil: it looks
    /// every second.
    let updates: AsyncStream<StateBoard.Update>?

    public init(
        manager: ConnectionManager, checks: DoctorChecks, updates: AsyncStream<StateBoard.Update>? = nil,
        grace: Double = 4, interval: Double = 60
    ) {
        self.manager = manager
        self.checks = checks
        self.updates = updates
        self.grace = grace
        self.interval = interval
    }

    public func run() async throws {
        var lastRun: ContinuousClock.Instant?
        var unusableSince: ContinuousClock.Instant?
        var changes = updates?.cancelOnGracefulShutdown().makeAsyncIterator()
        var waitForChange = false
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            if waitForChange, changes != nil {
                // (Updates that came meanwhile are in the stream, the newest kept: none is missed.)
                guard await changes?.next() != nil else { return }
            } else {
                try? await Task.sleep(for: .seconds(1))
            }
            let (usable, announced, hosts, known) = await manager.doctorInput()
            let now = ContinuousClock.now
            waitForChange = usable || announced > Self.maxAnnounced
            if waitForChange {
                unusableSince = nil
                lastRun = nil
                await manager.setDiscoveryFindings([])
                continue
            }
            let since = unusableSince ?? now
            unusableSince = since
            guard now - since >= .seconds(grace) else { continue }
            if let lastRun, now - lastRun < .seconds(interval) { continue }
            lastRun = now
            var run = checks
            run.hosts = hosts
            let report = await run.run(known: known, probe: nil)
            // Something may have become usable meanwhile: the manager decides again next turn.
            await manager.setDiscoveryFindings(report.usable.isEmpty ? report.findings : [])
        }
    }
}
