import LMXCore
import LMXDiscovery
import LMXProbe
import LMXStatusClient
import LMXStore
import LMXSystem
import Logging
import NIOCore
import ServiceLifecycle
import Synchronization

/// `lmx-agentd`: checks its paths, opens the store, wires the manager to its inputs and outputs,
/// and runs them all as one service group until SIGTERM or SIGINT.
public struct AgentDaemon {
    let options: DaemonOptions
    let environment: [String: String]

    public init(options: DaemonOptions, environment: [String: String]) {
        self.options = options
        self.environment = environment
    }

    public func run() async throws(StartupError) {
        FileSystem.setUmask(0o077)
        // Every local client holds a descriptor: use what the hard limit allows.
        ProcessLimits.raiseOpenFiles()
        var paths = AgentPaths.daemon(uid: Users.effective, environment: environment)
        if let socket = options.socket { paths.socket = socket }
        if let database = options.database { paths.database = database }
        let configPath = options.config ?? paths.config
        let load: @Sendable () throws -> AgentConfiguration = { [options] in try options.configuration(path: configPath)
        }
        let configuration: AgentConfiguration
        do { configuration = try load() } catch { throw .configuration("lmx-agentd: \(error)") }
        let logger = Self.bootstrapLogging(configuration, environment: environment)
        Self.warnUnknownKeys(configuration, file: configPath, logger: logger)

        try claimSocket(paths, logger: logger)
        let store: AgentStore
        do {
            store = try AgentStore.open(path: paths.database, eventRetention: configuration.eventRetention) {
                logger.warning("\($0)")
            }
        } catch {
            throw .database(
                "lmx-agentd: cannot open the database \(paths.database): \(error); check its directory's permissions or pass --db"
            )
        }
        let prober: Prober
        do { prober = try Prober(extraCAFile: configuration.extraCAFile) } catch {
            throw .configuration("lmx-agentd: cannot read the CA file \(configuration.extraCAFile ?? ""): \(error)")
        }

        // Inputs → manager → snapshot + events → outputs.
        let board = StateBoard(policy: configuration.policy)
        let executor = StoreExecutor(store: store, logger: logger)
        let metrics = AgentMetrics()
        let hub = WatchHub(board: board, heartbeat: configuration.watchHeartbeat, logger: logger)
        // endpoint.env beside the socket: the active endpoint for shells and EnvironmentFile=.
        let endpointFile = EndpointFileWriter(file: EndpointFile.beside(socket: paths.socket), logger: logger)
        // The ribbons of the last run end where it stopped (or was killed), before anything new.
        do { try store.closeHistory(now: SystemClock.realtime()) } catch {
            logger.warning("could not close the history of the last run: \(error)")
        }
        let history = HistoryRecorder(store: executor, board: board)
        let manager = ConnectionManager(
            configuration: configuration, prober: prober, store: executor, board: board,
            sinks: [EventLog(logger: logger), EventRecorder(store: executor), history, metrics, hub, endpointFile],
            logger: logger)
        let follower = PassiveHealthFollower(manager: manager, prober: prober, board: board)
        let agent = Agent(
            manager: manager, board: board, watch: hub, store: executor, metrics: metrics, history: history)

        let (readyStream, readyContinuation) = AsyncStream<Void>.makeStream()
        let statusBound = BindFlag()
        let statusAPI = StatusServer.application(agent: agent, socketPath: paths.socket, logger: logger) {
            statusBound.set()
            readyContinuation.yield()
            readyContinuation.finish()
        }
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [
            .init(service: ManagerService(manager: manager), serviceName: "manager"),
            .init(service: follower, serviceName: "passive-health"),
            .init(service: history, serviceName: "history"),
        ]
        let requery = configuration.discovery ? AvahiRequery() : nil
        if configuration.discovery {
            let browse = BrowseConfiguration(
                interfaces: InterfaceFilter(
                    include: configuration.interfaces, exclude: configuration.excludeInterfaces), waitForDaemon: true)
            services.append(
                .init(
                    service: DiscoveryService(
                        manager: manager, configuration: browse, requery: requery, logger: logger),
                    successTerminationBehavior: .ignore,
                    serviceName: "discovery"))
            services.append(
                .init(
                    service: WideAreaDiscoveryService(
                        manager: manager, domains: configuration.browseDomains,
                        announced: configuration.browseAnnouncedDomains, logger: logger),
                    successTerminationBehavior: .ignore, serviceName: "wide-area-discovery"))
            let doctor = DoctorChecks(
                filter: browse.interfaces,
                askFilter: configuration.doctorInterfaces.isEmpty
                    ? nil : InterfaceFilter(include: configuration.doctorInterfaces),
                browseDomains: configuration.browseDomains,
                announcedDomains: configuration.browseAnnouncedDomains)
            services.append(
                .init(
                    service: DoctorService(manager: manager, checks: doctor, updates: board.updates(buffering: 1)),
                    successTerminationBehavior: .ignore, serviceName: "discovery-doctor"))
        } else {
            await manager.discoveryEnded(.disabled)
        }
        if let address = configuration.metricsAddress {
            let app = StatusServer.metricsApplication(agent: agent, address: address, logger: logger)
            services.append(
                .init(
                    service: SoftFailService(base: app, name: "metrics listener", logger: logger),
                    serviceName: "metrics"))
        }
        let books = AddressBookWatcher(
            paths: addressBooks(configuration, logger: logger), manager: manager, store: executor, logger: logger)
        services.append(.init(service: books, successTerminationBehavior: .ignore, serviceName: "address-books"))
        services.append(.init(service: statusAPI, serviceName: "status-api"))
        var gateway: Gateway?
        if configuration.gateway.enabled {
            let (service, entries) = try await startGateway(
                configuration, agent: agent, socket: paths.socket, logger: logger)
            gateway = service
            services += entries
            services.append(
                .init(service: HeapReturn(traffic: agent.traffic, logger: logger), serviceName: "heap-return"))
        }
        let reloadedGateway = gateway
        services.append(
            .init(
                service: ReloadService(logger: logger, load: load, reread: { books.reread() }) { new in
                    Self.warnUnknownKeys(new, file: configPath, logger: logger)
                    await manager.reload(new)
                    hub.setHeartbeat(new.watchHeartbeat)
                    if let reloadedGateway {
                        reloadedGateway.reload(new.gateway, file: configPath)
                    } else if new.gateway.enabled {
                        logger.warning(
                            "config: gateway.enabled changed in \(configPath): the gateway starts when the daemon restarts (sudo systemctl restart lmx-agentd)"
                        )
                    }
                }, serviceName: "reload"))
        // What the agent's use is (the gateway's traffic, watchers): probing follows it.
        let routeLoad = gateway?.load
        await manager.setUsage(
            UsageWitness(traffic: { routeLoad?.observed() ?? [:] }, watchers: { hub.watcherCount }))
        services.append(
            .init(
                service: MachineWatcher(
                    manager: manager, prober: prober, gateway: gateway, requery: requery, logger: logger),
                serviceName: "machine"))
        // After the status API: stops first, ending every watch stream so the HTTP server has no
        // endless answer to wait for.
        services.append(.init(service: hub, serviceName: "watch"))
        services.append(
            .init(
                service: SystemdNotifier(board: board, environment: environment) {
                    for await _ in readyStream { break }
                },
                successTerminationBehavior: .ignore, serviceName: "systemd"))

        logger.info(
            "starting",
            metadata: [
                "version": "\(StatusAPI.version)", "socket": "\(paths.socket)", "db": "\(paths.database)",
                "config": "\(FileSystem.exists(configPath) ? configPath : "none (defaults)")",
            ])
        let group = ServiceGroup(
            configuration: .init(services: services, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        var failure: StartupError?
        do {
            try await group.run()
        } catch {
            logger.error("stopped on an error: \(error)")
            if !statusBound.isSet, error is IOError || error is SocketAddressError {
                // The status socket was never bound: the agent never ran.
                failure = .socketPath(
                    "lmx-agentd: cannot bind the status socket \(paths.socket): \(error); check its directory, or pick another path with --socket"
                )
            }
        }
        await prober.shutdown()
        endpointFile.remove()
        try? store.close()
        if statusBound.isSet { FileSystem.remove(paths.socket) }
        logger.info("Stopped.")
        if let failure { throw failure }
    }

    /// Under systemd, stderr is the journal: lines carry sd-daemon priorities, no timestamps.
    static func bootstrapLogging(_ configuration: AgentConfiguration, environment: [String: String]) -> Logger {
        let level = Logger.Level(rawValue: configuration.logLevel) ?? .info
        let journal = JournalLogHandler.stderrIsJournal(environment: environment)
        LoggingSystem.bootstrap { label in
            var handler: any LogHandler =
                journal ? JournalLogHandler(label: label) : StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        var logger = Logger(label: "lmx-agentd")
        logger.logLevel = level
        return logger
    }

    /// Refuses to start beside a live daemon or in an unsafe directory; replaces a stale socket.
    func claimSocket(_ paths: AgentPaths, logger: Logger) throws(StartupError) {
        // Without XDG_RUNTIME_DIR (and HOME) the files go under /tmp/lmx-<uid>: only ever a
        // directory of our own, 0700, never one another user made first.
        if let why = SocketPathLimit.problem(paths.socket) {
            throw .socketPath(
                "lmx-agentd: cannot use the status socket: \(why); pass a shorter path with --socket (or LMX_SOCKET), or use a shorter XDG_RUNTIME_DIR"
            )
        }
        let uid = Users.effective
        if RuntimeDirectory.fallbackContaining(paths.socket, uid: uid) != nil
            || RuntimeDirectory.fallbackContaining(paths.database, uid: uid) != nil,
            let problem = RuntimeDirectory.prepare(uid: uid)
        {
            throw .socket(
                "lmx-agentd: refusing \(RuntimeDirectory.fallback(uid: uid)): \(problem); XDG_RUNTIME_DIR is not set and another user may have made it: set XDG_RUNTIME_DIR, or pass --socket and --db"
            )
        }
        switch SocketFile.probe(paths.socket) {
        case .live:
            throw .socket(
                "lmx-agentd: another lmx-agentd is already serving \(paths.socket); stop it first, or pick another path with --socket"
            )
        case .stale:
            logger.notice(
                "replacing a stale socket file left by a daemon that is gone", metadata: ["socket": "\(paths.socket)"])
            FileSystem.remove(paths.socket)
        case .free:
            break
        case .unusable(let why):
            throw .socket(
                "lmx-agentd: cannot use \(paths.socket): \(why); it is left as it is: remove it yourself if it is yours, or pick another path with --socket"
            )
        }
        do { try SocketFile.prepareDirectory(for: paths.socket) } catch { throw .socket("lmx-agentd: \(error)") }
    }

    /// The address books to follow, `~/` resolved.
    func addressBooks(_ configuration: AgentConfiguration, logger: Logger) -> [String] {
        let home = environment["HOME"].flatMap { $0.hasPrefix("/") ? $0 : nil }
        return configuration.addressBooks.compactMap { path in
            guard path.hasPrefix("~/") else { return path }
            guard let home else {
                logger.warning("address book \(path) not followed: HOME is not set")
                return nil
            }
            return home + path.dropFirst(1)
        }
    }

    /// The gateway's listeners: its socket beside the status socket (unless taken) and TCP.
    func startGateway(
        _ configuration: AgentConfiguration, agent: Agent, socket: String, logger: Logger
    ) async throws(StartupError) -> (Gateway, [ServiceGroupConfiguration.ServiceConfiguration]) {
        let gateway: Gateway
        do {
            gateway = try Gateway(
                agent: agent, configuration: configuration.gateway, extraCAFile: configuration.extraCAFile,
                logger: logger)
        } catch {
            throw .configuration("lmx-agentd: \(error)")
        }
        let socketPath = configuration.gateway.socket ?? FileSystem.directory(of: socket) + "/gateway.sock"
        var usableSocket: String? = socketPath
        var socketProblem: String?
        if let why = SocketPathLimit.problem(socketPath) {
            // A path the user named is refused as a bad setting; the one the agent chose beside
            // the status socket costs the gateway its socket (reported in /v1/status), not the agent.
            if configuration.gateway.socket != nil {
                throw .socketPath(
                    "lmx-agentd: cannot use the gateway socket (gateway.socket, --gateway-socket): \(why); name a shorter path"
                )
            }
            socketProblem =
                "gateway socket beside the status socket not made: \(why); set gateway.socket to a shorter path, or shorten --socket"
            usableSocket = nil
        } else {
            switch SocketFile.probe(socketPath) {
            case .free: break
            case .stale: FileSystem.remove(socketPath)
            case .live:
                socketProblem = "gateway socket \(socketPath) is already served by another process"
                usableSocket = nil
            case .unusable(let why):
                socketProblem = "gateway socket \(socketPath) is unusable (\(why))"
                usableSocket = nil
            }
        }
        if let socketProblem {
            logger.warning("\(socketProblem): the gateway is on TCP only", metadata: ["socket": "\(socketPath)"])
        }
        if configuration.gateway.group != nil, configuration.gateway.listen != nil {
            logger.notice(
                "gateway.group is set: no TCP listener (a TCP caller cannot be identified); use the gateway socket")
        }
        // A port in use (another user, another agent) costs the TCP listener, not the daemon: it
        // is retried, and advertised only once it is the agent's (`Gateway.listenerChanged`).
        let services = gateway.applications(socketPath: usableSocket).map { name, service in
            ServiceGroupConfiguration.ServiceConfiguration(
                service: SoftFailService(base: service, name: name, logger: logger), serviceName: name)
        }
        // The socket is advertised once it is bound (`Gateway.socketChanged`).
        await agent.manager.setGatewaySocket(nil, problem: socketProblem)
        return (gateway, services)
    }

    /// Keys of the config file that no setting has: each said once per load, with the file.
    static func warnUnknownKeys(_ configuration: AgentConfiguration, file: String, logger: Logger) {
        for key in configuration.unknownKeys {
            logger.warning(
                "config: unknown key \(key) in \(file), ignored: misspelt? Every key is in the commented example config (/etc/lmx/agent.json from the package, examples/agent.json in the source)"
            )
        }
    }
}

/// Whether a socket was bound: set once, from its server's start.
final class BindFlag: Sendable {
    private let bound = Atomic<Bool>(false)

    func set() { bound.store(true, ordering: .releasing) }
    var isSet: Bool { bound.load(ordering: .acquiring) }
}
