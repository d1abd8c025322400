import LMXCore
import LMXSystem

/// What `lmx-agentd` was asked on its command line; applied over the config file at start and at
/// every reload.
public struct DaemonOptions: Sendable {
    public var socket: String?
    public var database: String?
    public var config: String?
    public var endpoints: [String] = []
    public var noDiscovery = false
    public var interfaces: [String] = []
    public var doctorInterfaces: [String] = []
    public var extraCAFile: String?
    public var logLevel: String?
    public var gateway: String?
    public var gatewaySocket: String?
    public var noGateway = false
    public var metricsAddress: String?
    public var addressBooks: [String] = []

    public init() {}

    /// The config file (`path`; a missing file means the defaults unless it was named on the
    /// command line) with the command line applied over it.
    public func configuration(path: String) throws -> AgentConfiguration {
        var configuration = try Self.load(path, required: config != nil)
        if let metricsAddress {
            configuration.metricsAddress = try AgentConfiguration.parseMetricsAddress(metricsAddress)
        }
        configuration.addressBooks += addressBooks
        if let gateway { configuration.gateway.listen = try GatewayConfiguration.parseListen(gateway) }
        if let gatewaySocket { configuration.gateway.socket = gatewaySocket }
        if noGateway { configuration.gateway.enabled = false }
        configuration.endpoints += endpoints.map { ManualEndpoint(url: $0) }
        if noDiscovery { configuration.discovery = false }
        if !interfaces.isEmpty { configuration.interfaces = interfaces }
        if !doctorInterfaces.isEmpty { configuration.doctorInterfaces = doctorInterfaces }
        if let extraCAFile { configuration.extraCAFile = extraCAFile }
        if let logLevel { configuration.logLevel = logLevel }
        return configuration
    }

    static func load(_ path: String, required: Bool) throws -> AgentConfiguration {
        do {
            return try AgentConfiguration.parse(try FileSystem.read(path, limit: 1_048_576), file: path)
        } catch FileSystem.ReadError.missing {
            if !required { return AgentConfiguration() }
            throw ConfigurationError("cannot read config file \(path): no such file")
        } catch FileSystem.ReadError.unreadable(let why) {
            throw ConfigurationError("cannot read config file \(path): \(why)")
        } catch FileSystem.ReadError.tooLarge {
            throw ConfigurationError("config file \(path) is larger than 1 MiB")
        }
    }
}

/// Why the daemon could not start, with its exit code (sysexits: 73 the socket is taken or
/// unusable, 74 the database cannot be opened, 78 a configuration error; 79 a socket path that
/// cannot be bound).
public struct StartupError: Error, CustomStringConvertible {
    public let exitCode: Int32
    public let description: String

    static func configuration(_ message: String) -> StartupError {
        StartupError(exitCode: ExitStatus.configuration.rawValue, description: message)
    }
    static func socket(_ message: String) -> StartupError {
        StartupError(exitCode: ExitStatus.cannotCreate.rawValue, description: message)
    }
    static func socketPath(_ message: String) -> StartupError {
        StartupError(exitCode: ExitStatus.socketPath.rawValue, description: message)
    }
    static func database(_ message: String) -> StartupError {
        StartupError(exitCode: ExitStatus.ioError.rawValue, description: message)
    }
}
