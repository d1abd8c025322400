import ArgumentParser
import LMXAgent
import LMXCore
import LMXDiscovery
import LMXProbe
import LMXStatusClient
import LMXStore
import Logging
import ServiceLifecycle

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Glibc)
import Glibc
#endif

@main
struct LMXAgentd: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lmx-agentd",
        abstract: "Keep track of which Opta LMX server this machine should use, and tell local tools.",
        discussion: """
            Finds servers on the LAN over mDNS (_opta-lmx._tcp), probes them and any paired or \
            configured endpoints by the LMX contract, picks the active one (LAN first, the WAN \
            tunnel when no LAN server is healthy) and serves its state over a Unix socket for \
            lmx-status, curl --unix-socket and any other tool.

            Paths, as root: /run/lmx/agent.sock, /var/lib/lmx/agent.db, /etc/lmx/agent.json; \
            otherwise under $XDG_RUNTIME_DIR, $XDG_STATE_HOME and $XDG_CONFIG_HOME; under systemd, \
            in the unit's RuntimeDirectory=, StateDirectory= and ConfigurationDirectory=. LMX_SOCKET \
            and LMX_DB override the socket and database paths. The config file is JSON; comments \
            and trailing commas are allowed (JSON5).

            Signals: SIGTERM and SIGINT stop gracefully; SIGHUP reloads the config file.

            Exit codes: 0 stopped cleanly, 64 usage error, 73 another lmx-agentd serves the \
            socket, 74 the database cannot be opened, 78 configuration error.
            """,
        version: StatusAPI.version)

    @Option(name: .long, help: ArgumentHelp("Unix socket to serve the status API on.", valueName: "path"))
    var socket: String?

    @Option(name: .long, help: ArgumentHelp("SQLite database file.", valueName: "path"))
    var db: String?

    @Option(name: .long, help: ArgumentHelp("JSON config file (absent: defaults).", valueName: "path"))
    var config: String?

    @Option(
        name: .customLong("endpoint"),
        help: ArgumentHelp(
            "A manual endpoint, scheme://host[:port] (repeatable). https:// is treated as WAN, http:// as LAN.",
            valueName: "url"))
    var endpoints: [String] = []

    @Flag(name: .customLong("no-discovery"), help: "Do not browse mDNS; use only paired and configured endpoints.")
    var noDiscovery = false

    @Option(name: [.customShort("i"), .long], help: ArgumentHelp("Only these interfaces for mDNS (glob, repeatable).", valueName: "glob"))
    var interface: [String] = []

    @Option(name: .customLong("extra-ca-file"), help: ArgumentHelp("PEM file of extra trusted CAs for HTTPS endpoints.", valueName: "path"))
    var extraCAFile: String?

    @Option(name: .customLong("log-level"), help: "trace, debug, info, notice, warning or error.")
    var logLevel: String?

    @Option(
        name: .customLong("gateway"),
        help: ArgumentHelp(
            "The local OpenAI-compatible gateway's TCP address, loopback only (default 127.0.0.1:1235), or off.",
            valueName: "host:port|off"))
    var gateway: String?

    @Option(
        name: .customLong("gateway-socket"),
        help: ArgumentHelp("The gateway's Unix socket (default: gateway.sock beside the status socket).", valueName: "path"))
    var gatewaySocket: String?

    @Flag(name: .customLong("no-gateway"), help: "Do not serve the local gateway at all.")
    var noGateway = false

    @Option(
        name: .customLong("metrics-address"),
        help: ArgumentHelp("Also serve /metrics over TCP for Prometheus, e.g. 127.0.0.1:9466 (default: only on the socket).", valueName: "host:port"))
    var metricsAddress: String?

    @Option(
        name: .customLong("address-book"),
        help: ArgumentHelp(
            "An lmx-connections.json address book to follow: a rewritten tunnel URL updates its pairing (repeatable).",
            valueName: "path"))
    var addressBooks: [String] = []

    func validate() throws {
        for url in endpoints {
            do { _ = try ManualEndpoint(url: url).route() } catch { throw ValidationError("--endpoint: \(error.description)") }
        }
        if let gateway {
            do { _ = try GatewayConfiguration.parseListen(gateway) } catch { throw ValidationError("--gateway: \(error.description)") }
        }
        if let metricsAddress {
            do { _ = try AgentConfiguration.parseMetricsAddress(metricsAddress) } catch { throw ValidationError("--metrics-address: \(error.description)") }
        }
        if let logLevel, Logger.Level(rawValue: logLevel) == nil {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error")
        }
    }

    func run() async throws {
        umask(0o077)
        // Every local client holds a descriptor: use what the hard limit allows (systemd sets
        // LimitNOFILE=; by hand the soft limit is often 1024, which a busy socket can exhaust).
        var files = rlimit()
        if getrlimit(RLIMIT_NOFILE_CONSTANT, &files) == 0, files.rlim_cur < files.rlim_max {
            files.rlim_cur = min(files.rlim_max, 65_536)
            _ = setrlimit(RLIMIT_NOFILE_CONSTANT, &files)
        }
        let environment = ProcessInfo.processInfo.environment
        var paths = AgentPaths.daemon(uid: geteuid(), environment: environment)
        if let socket { paths.socket = socket }
        if let db { paths.database = db }
        let configPath = config ?? paths.config
        let explicitConfig = config != nil

        let load: @Sendable () throws -> AgentConfiguration = { [endpoints, noDiscovery, interface, extraCAFile, logLevel, gateway, gatewaySocket, noGateway, addressBooks, metricsAddress] in
            var configuration = try Self.loadConfiguration(configPath, required: explicitConfig)
            if let metricsAddress { configuration.metricsAddress = try AgentConfiguration.parseMetricsAddress(metricsAddress) }
            configuration.addressBooks += addressBooks
            if let gateway { configuration.gateway.listen = try GatewayConfiguration.parseListen(gateway) }
            if let gatewaySocket { configuration.gateway.socket = gatewaySocket }
            if noGateway { configuration.gateway.enabled = false }
            configuration.endpoints += endpoints.map { ManualEndpoint(url: $0) }
            if noDiscovery { configuration.discovery = false }
            if !interface.isEmpty { configuration.interfaces = interface }
            if let extraCAFile { configuration.extraCAFile = extraCAFile }
            if let logLevel { configuration.logLevel = logLevel }
            return configuration
        }
        let configuration: AgentConfiguration
        do {
            configuration = try load()
        } catch {
            Self.fail("lmx-agentd: \(error)", code: 78)
        }

        let level = Logger.Level(rawValue: configuration.logLevel) ?? .info
        // Under systemd, stderr is the journal: lines carry sd-daemon priorities, no timestamps.
        let journal = JournalLogHandler.stderrIsJournal(environment: environment)
        LoggingSystem.bootstrap { label in
            if journal {
                var handler = JournalLogHandler(label: label)
                handler.logLevel = level
                return handler
            }
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        var logger = Logger(label: "lmx-agentd")
        logger.logLevel = level

        // Without XDG_RUNTIME_DIR (and HOME) the files go under /tmp/lmx-<uid>: only ever a
        // directory of our own, 0700, never one another user made first.
        let uid = geteuid()
        if RuntimeDirectory.fallbackContaining(paths.socket, uid: uid) != nil
            || RuntimeDirectory.fallbackContaining(paths.database, uid: uid) != nil,
            let problem = RuntimeDirectory.prepare(uid: uid)
        {
            Self.fail(
                "lmx-agentd: refusing \(RuntimeDirectory.fallback(uid: uid)): \(problem); XDG_RUNTIME_DIR is not set and another user may have made it: set XDG_RUNTIME_DIR, or pass --socket and --db",
                code: 73)
        }

        switch SocketGuard.probe(paths.socket) {
        case .live:
            Self.fail(
                "lmx-agentd: another lmx-agentd is already serving \(paths.socket); stop it first, or pick another path with --socket",
                code: 73)
        case .stale:
            logger.notice("replacing a stale socket file left by a daemon that is gone", metadata: ["socket": "\(paths.socket)"])
            unlink(paths.socket)
        case .free:
            break
        case .unusable(let why):
            Self.fail(
                "lmx-agentd: cannot use \(paths.socket): \(why); it is left as it is: remove it yourself if it is yours, or pick another path with --socket",
                code: 73)
        }
        do {
            try SocketGuard.prepareDirectory(for: paths.socket)
        } catch {
            Self.fail("lmx-agentd: \(error)", code: 73)
        }

        let store: AgentStore
        do {
            store = try AgentStore.open(path: paths.database, eventRetention: configuration.eventRetention) { line in
                logger.warning("\(line)")
            }
        } catch {
            Self.fail("lmx-agentd: cannot open the database \(paths.database): \(error); check its directory's permissions or pass --db", code: 74)
        }
        let prober: Prober
        do {
            prober = try Prober(extraCAFile: configuration.extraCAFile)
        } catch {
            Self.fail("lmx-agentd: cannot read the CA file \(configuration.extraCAFile ?? ""): \(error)", code: 78)
        }

        let manager = ConnectionManager(configuration: configuration, prober: prober, store: store, logger: logger)
        // endpoint.env beside the socket: the active endpoint for shells and EnvironmentFile=.
        await manager.setEndpointFile(EndpointFile.beside(socket: paths.socket))
        let (readyStream, readyContinuation) = AsyncStream<Void>.makeStream()
        let app = StatusServer.application(manager: manager, socketPath: paths.socket, logger: logger) {
            readyContinuation.yield()
            readyContinuation.finish()
        }
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [
            .init(service: ManagerService(manager: manager), serviceName: "manager")
        ]
        if configuration.discovery {
            let browse = BrowseConfiguration(
                interfaces: InterfaceFilter(include: configuration.interfaces, exclude: configuration.excludeInterfaces),
                waitForDaemon: true)
            services.append(.init(service: DiscoveryService(manager: manager, configuration: browse, logger: logger), successTerminationBehavior: .ignore, serviceName: "discovery"))
        } else {
            await manager.setDiscoveryState("disabled", detail: nil)
        }
        if let address = configuration.metricsAddress {
            services.append(.init(
                service: SoftFailService(base: StatusServer.metricsApplication(manager: manager, address: address, logger: logger), name: "metrics listener", logger: logger),
                serviceName: "metrics"))
        }
        let home = environment["HOME"].flatMap { $0.hasPrefix("/") ? $0 : nil }
        let books = configuration.addressBooks.compactMap { path -> String? in
            guard path.hasPrefix("~/") else { return path }
            guard let home else {
                logger.warning("address book \(path) not followed: HOME is not set")
                return nil
            }
            return home + path.dropFirst(1)
        }
        services.append(.init(
            service: AddressBookWatcher(paths: books, manager: manager, logger: logger), successTerminationBehavior: .ignore,
            serviceName: "address-books"))
        services.append(.init(service: ReloadService(manager: manager, logger: logger, load: load), serviceName: "reload"))
        services.append(.init(service: app, serviceName: "status-api"))
        var gatewayService: Gateway?
        if configuration.gateway.enabled {
            do {
                let gateway = try Gateway(
                    manager: manager, configuration: configuration.gateway, extraCAFile: configuration.extraCAFile, logger: logger)
                gatewayService = gateway
                let socketPath = configuration.gateway.socket ?? EndpointFile.beside(socket: paths.socket).directory + "/gateway.sock"
                var usableSocket: String? = socketPath
                switch SocketGuard.probe(socketPath) {
                case .free: break
                case .stale: unlink(socketPath)
                case .live:
                    logger.warning("gateway socket already served by another process: the gateway is on TCP only", metadata: ["socket": "\(socketPath)"])
                    usableSocket = nil
                case .unusable(let why):
                    logger.warning("gateway socket unusable (\(why)): the gateway is on TCP only", metadata: ["socket": "\(socketPath)"])
                    usableSocket = nil
                }
                if configuration.gateway.group != nil, configuration.gateway.listen != nil {
                    logger.notice("gateway.group is set: no TCP listener (a TCP caller cannot be identified); use the gateway socket")
                }
                for (name, service) in gateway.applications(socketPath: usableSocket) {
                    // A port in use (another agent) costs the TCP listener, not the daemon.
                    services.append(.init(service: SoftFailService(base: service, name: name, logger: logger), serviceName: name))
                }
                await manager.setGatewayInfo(
                    url: configuration.gateway.group == nil ? configuration.gateway.listen.map { "http://\($0.description)" } : nil,
                    socket: usableSocket)
            } catch {
                Self.fail("lmx-agentd: \(error)", code: 78)
            }
        }
        services.append(.init(service: WatchDrainService(manager: manager), serviceName: "watch-drain"))
        services.append(.init(
            service: SystemdNotifier(manager: manager, environment: environment) {
                for await _ in readyStream { break }
            }, successTerminationBehavior: .ignore, serviceName: "systemd"))

        logger.info(
            "starting",
            metadata: [
                "version": "\(StatusAPI.version)", "socket": "\(paths.socket)", "db": "\(paths.database)",
                "config": "\(access(configPath, F_OK) == 0 ? configPath : "none (defaults)")",
            ])
        let group = ServiceGroup(configuration: .init(
            services: services, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        do {
            try await group.run()
        } catch {
            logger.error("stopped on an error: \(error)")
        }
        await prober.shutdown()
        await gatewayService?.shutdown()
        await manager.setEndpointFile(nil)
        try? store.close()
        unlink(paths.socket)
        logger.info("stopped")
    }

    static func loadConfiguration(_ path: String, required: Bool) throws -> AgentConfiguration {
        guard let handle = fopen(path, "rb") else {
            if errno == ENOENT && !required { return AgentConfiguration() }
            throw ConfigurationError("cannot read config file \(path): \(String(cString: strerror(errno)))")
        }
        defer { fclose(handle) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = fread(&buffer, 1, buffer.count, handle)
            if n <= 0 { break }
            bytes += buffer[0..<n]
            if bytes.count > 1_048_576 { throw ConfigurationError("config file \(path) is larger than 1 MiB") }
        }
        return try AgentConfiguration.parse(bytes, file: path)
    }

    static func fail(_ message: String, code: Int32) -> Never {
        let line = Array((message + "\n").utf8)
        _ = line.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
        Glibc.exit(code)
    }
}

/// `RLIMIT_NOFILE` as Glibc's Swift overlay spells it.
private let RLIMIT_NOFILE_CONSTANT = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
