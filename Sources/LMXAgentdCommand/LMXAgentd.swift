import ArgumentParser
import LMXAgent
import LMXCore
import LMXSystem
import Logging

public struct LMXAgentd: AsyncParsableCommand {
    public init() {}

    public static let configuration = CommandConfiguration(
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

            Signals: SIGTERM and SIGINT stop gracefully; SIGHUP reloads the config file and reads \
            the address books again.

            Exit codes: 0 stopped cleanly, 64 usage error, 73 another lmx-agentd serves the \
            socket, 74 the database cannot be opened, 78 configuration error, 79 a socket path \
            that cannot be bound (over 103 bytes).
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

    @Option(
        name: [.customShort("i"), .long],
        help: ArgumentHelp("Only these interfaces for mDNS (glob, repeatable).", valueName: "glob"))
    var interface: [String] = []

    @Option(
        name: .customLong("doctor-interface"),
        help: ArgumentHelp(
            "Interfaces on which the discovery checks may ask the link directly while nothing is usable (glob, repeatable; default: those of mDNS).",
            valueName: "glob"))
    var doctorInterface: [String] = []

    @Option(
        name: .customLong("extra-ca-file"),
        help: ArgumentHelp("PEM file of extra trusted CAs for HTTPS endpoints.", valueName: "path"))
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
        help: ArgumentHelp(
            "The gateway's Unix socket (default: gateway.sock beside the status socket).", valueName: "path"))
    var gatewaySocket: String?

    @Flag(name: .customLong("no-gateway"), help: "Do not serve the local gateway at all.")
    var noGateway = false

    @Option(
        name: .customLong("metrics-address"),
        help: ArgumentHelp(
            "Also serve /metrics over TCP for Prometheus, e.g. 127.0.0.1:9466 (default: only on the socket).",
            valueName: "host:port"))
    var metricsAddress: String?

    @Option(
        name: .customLong("address-book"),
        help: ArgumentHelp(
            "An lmx-connections.json address book to follow: a rewritten tunnel URL updates its pairing (repeatable).",
            valueName: "path"))
    var addressBooks: [String] = []

    public func validate() throws {
        for url in endpoints {
            do { _ = try ManualEndpoint(url: url).route() } catch {
                throw ValidationError("--endpoint: \(error.description)")
            }
        }
        if let gateway {
            do { _ = try GatewayConfiguration.parseListen(gateway) } catch {
                throw ValidationError("--gateway: \(error.description)")
            }
        }
        if let metricsAddress {
            do { _ = try AgentConfiguration.parseMetricsAddress(metricsAddress) } catch {
                throw ValidationError("--metrics-address: \(error.description)")
            }
        }
        if let logLevel, Logger.Level(rawValue: logLevel) == nil {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error")
        }
    }

    public func run() async throws {
        // First: SwiftNIO's thread counts can be set only before its shared loops are used.
        DaemonThreads.configure(environment: ProcessEnvironment.current)
        var options = DaemonOptions()
        options.socket = socket
        options.database = db
        options.config = config
        options.endpoints = endpoints
        options.noDiscovery = noDiscovery
        options.interfaces = interface
        options.doctorInterfaces = doctorInterface
        options.extraCAFile = extraCAFile
        options.logLevel = logLevel
        options.gateway = gateway
        options.gatewaySocket = gatewaySocket
        options.noGateway = noGateway
        options.metricsAddress = metricsAddress
        options.addressBooks = addressBooks
        do {
            try await AgentDaemon(options: options, environment: ProcessEnvironment.current).run()
        } catch {
            ProcessLimits.exit(error.exitCode, message: error.description)
        }
    }
}
