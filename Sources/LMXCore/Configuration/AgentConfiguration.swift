#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Where the agent keeps its socket, database and config file.
public struct AgentPaths: Sendable, Hashable {
    public var socket: String
    public var database: String
    public var config: String

    /// The standard paths: system ones for root, XDG ones for everybody else.
    /// - Parameters:
    ///   - uid: the effective user id.
    ///   - environment: the process environment (`XDG_*`, `HOME`, `LMX_SOCKET`, `LMX_DB`).
    public static func standard(uid: UInt32, environment: [String: String]) -> AgentPaths {
        var paths: AgentPaths
        if uid == 0 {
            paths = system
        } else {
            let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? fallbackRuntimeDirectory(uid: uid)
            func xdg(_ key: String, _ fallback: String) -> String {
                guard let value = environment[key], value.hasPrefix("/") else { return fallback }
                return value
            }
            let runtime = xdg("XDG_RUNTIME_DIR", fallbackRuntimeDirectory(uid: uid))
            paths = AgentPaths(
                socket: runtime + "/lmx/agent.sock",
                database: xdg("XDG_STATE_HOME", home + "/.local/state") + "/lmx/agent.db",
                config: xdg("XDG_CONFIG_HOME", home + "/.config") + "/lmx/agent.json")
        }
        if let socket = environment["LMX_SOCKET"], !socket.isEmpty { paths.socket = socket }
        if let db = environment["LMX_DB"], !db.isEmpty { paths.database = db }
        return paths
    }

    /// Where a user's files go when neither `XDG_RUNTIME_DIR` nor `HOME` is set. It lies in the
    /// shared `/tmp`: the daemon and clients use it only as a directory of the user's own, 0700.
    public static func fallbackRuntimeDirectory(uid: UInt32) -> String { "/tmp/lmx-\(uid)" }

    /// The system agent's paths: root's, and the packaged service's.
    public static let system = AgentPaths(
        socket: "/run/lmx/agent.sock", database: "/var/lib/lmx/agent.db", config: "/etc/lmx/agent.json")

    /// The daemon's paths: `standard`, except that under systemd the unit's `RuntimeDirectory=`,
    /// `StateDirectory=` and `ConfigurationDirectory=` (their first entries) place the socket,
    /// database and config file. `LMX_SOCKET` and `LMX_DB` still win.
    public static func daemon(uid: UInt32, environment: [String: String]) -> AgentPaths {
        var paths = standard(uid: uid, environment: environment)
        func directory(_ key: String) -> String? {
            guard let first = environment[key]?.split(separator: ":").first, first.hasPrefix("/") else { return nil }
            return String(first)
        }
        if environment["LMX_SOCKET"].map(\.isEmpty) ?? true, let runtime = directory("RUNTIME_DIRECTORY") {
            paths.socket = runtime + "/agent.sock"
        }
        if environment["LMX_DB"].map(\.isEmpty) ?? true, let state = directory("STATE_DIRECTORY") {
            paths.database = state + "/agent.db"
        }
        if let configuration = directory("CONFIGURATION_DIRECTORY") { paths.config = configuration + "/agent.json" }
        return paths
    }

    /// The paths a client (`lmx-status`, `lmx-pair`) uses: `standard`, except that a user who runs
    /// no agent of their own, while the system agent runs, talks to the system agent.
    /// - Parameter exists: whether a file exists (injected for tests).
    public static func client(uid: UInt32, environment: [String: String], exists: (String) -> Bool) -> AgentPaths {
        let own = standard(uid: uid, environment: environment)
        guard uid != 0, environment["LMX_SOCKET"].map(\.isEmpty) ?? true, !exists(own.socket), exists(system.socket)
        else {
            return own
        }
        var paths = system
        if let db = environment["LMX_DB"], !db.isEmpty { paths.database = db }
        return paths
    }
}

/// A manual endpoint from the config file or the command line.
public struct ManualEndpoint: Sendable, Hashable, Codable {
    public var url: String
    public var via: Via?
    public var name: String?
    public var path: String?
    public var instance: String?
    public var adminKey: String?
    public var apiKey: String?
    public var accessClientID: String?
    public var accessClientSecret: String?
    /// Send the keys over plain `http://` anyway (anyone on the path can read them).
    public var allowInsecure: Bool?

    enum CodingKeys: String, CodingKey, CaseIterable {
        case url, via, name, path, instance
        case allowInsecure = "allow_insecure"
        case adminKey = "admin_key"
        case apiKey = "api_key"
        case accessClientID = "cf_access_client_id"
        case accessClientSecret = "cf_access_client_secret"
    }

    public init(url: String, via: Via? = nil, name: String? = nil) {
        self.url = url
        self.via = via
        self.name = name
    }

    /// The route this entry describes; `via` defaults to `wan` for `https://` URLs, `lan` otherwise.
    /// The URL as it may appear in a message: no query (it may carry a key), no user name.
    public static func redacted(_ url: String) -> String {
        var text = url
        if let query = text.firstIndex(where: { $0 == "?" || $0 == "#" }) { text = text[..<query] + "?…" }
        if let at = text.lastIndex(of: "@"), let scheme = text.firstRange(of: "://"), scheme.upperBound <= at {
            text = text[..<scheme.upperBound] + "…@" + text[text.index(after: at)...]
        }
        return String(text.unicodeScalars.map { $0.value < 0x20 || $0.value == 0x7F ? "?" : Character($0) }).prefix(200)
            .description
    }

    /// The route, as configured; with `lan_keys: never` no key travels over plain HTTP, whatever
    /// the endpoint says.
    public func route(lanKeys: LANKeys) throws(ConfigurationError) -> Route {
        var route = try route()
        if lanKeys == .never, route.baseURL.hasPrefix("http://") {
            route.credentials = Credentials(
                accessClientID: route.credentials.accessClientID,
                accessClientSecret: route.credentials.accessClientSecret)
        }
        return route
    }

    public func route() throws(ConfigurationError) -> Route {
        let base = BaseURL(url)
        let shown = Self.redacted(url)
        guard base.scheme == "http" || base.scheme == "https", !base.hostPort.isEmpty else {
            throw ConfigurationError("endpoint url \"\(shown)\" must start with http:// or https://")
        }
        guard base.isWellFormed else {
            throw ConfigurationError(
                "endpoint url \"\(shown)\" must be scheme://host[:port], with no path, query or user name")
        }
        if (accessClientID == nil) != (accessClientSecret == nil) {
            throw ConfigurationError("endpoint \(shown): cf_access_client_id and cf_access_client_secret go together")
        }
        let hasKeys = [adminKey, apiKey, accessClientID, accessClientSecret].contains { !($0 ?? "").isEmpty }
        if base.isPlainHTTP, hasKeys, allowInsecure != true {
            throw ConfigurationError(
                "endpoint \(shown): keys over plain http:// can be read by anyone on the network; use https://, or set \"allow_insecure\": true on this endpoint"
            )
        }
        let via = self.via ?? (base.scheme == "https" ? .wan : .lan)
        return Route(
            baseURL: base.text, via: via, source: .manual, name: name ?? base.hostPort,
            servicePath: path ?? TXTRecord.defaultServicePath, pinnedInstance: instance,
            credentials: Credentials(
                adminKey: adminKey, inferenceKey: apiKey, accessClientID: accessClientID,
                accessClientSecret: accessClientSecret))
    }
}

/// A config file problem, naming the key and the file.
/// A config file or a setting that cannot be used: which file, which key (a path such as
/// `health.stability_window` or `endpoints[1].url`), and what is wrong with it.
public struct ConfigurationError: Error, CustomStringConvertible, Sendable, Hashable {
    /// The file, when the setting came from one.
    public var file: String?
    /// The key's path in the file, when one key is at fault.
    public var key: String?
    /// What is wrong (and, where it helps, the next step).
    public var message: String

    public init(file: String? = nil, key: String? = nil, _ message: String) {
        self.file = file
        self.key = key
        self.message = message
    }

    public var description: String {
        [file, key].compactMap { $0 }.map { $0 + ": " }.joined() + message
    }

    /// The same error, said of `file`.
    func inFile(_ file: String) -> ConfigurationError {
        var error = self
        error.file = file
        return error
    }
}

/// The agent's configuration: every key optional, every default documented in the README.
public struct AgentConfiguration: Sendable, Hashable, Decodable {
    public var policy = HealthPolicy()
    public var endpoints: [ManualEndpoint] = []
    /// Interface globs for mDNS (empty: all but container and VPN links).
    public var interfaces: [String] = []
    public var excludeInterfaces: [String] = []
    /// Browse mDNS at all.
    public var discovery = true
    /// Unicast DNS domains to browse for servers (wide-area DNS-SD, RFC 6763): a site lists its
    /// servers on other subnets in its own DNS.
    public var browseDomains: [String] = []
    /// Also browse the domains the network announces under its search domains
    /// (`b._dns-sd._udp.<search domain>`, `lb._dns-sd._udp.…`).
    public var browseAnnouncedDomains = true
    /// Interfaces (globs) on which the agent's discovery checks may ask the link directly (one
    /// mDNS question now and then while nothing is usable); empty: those mDNS uses.
    public var doctorInterfaces: [String] = []
    /// PEM file of extra certificate authorities for HTTPS endpoints.
    public var extraCAFile: String?
    /// Seconds between heartbeat lines on `/v1/watch`.
    public var watchHeartbeat: Double = 15
    /// Connection events kept in the database.
    public var eventRetention = 5000
    /// `trace`, `debug`, `info`, `notice`, `warning`, `error`.
    public var logLevel = "info"
    /// The local OpenAI-compatible gateway.
    public var gateway = GatewayConfiguration()
    /// Also serve `/metrics` over TCP here (Prometheus cannot scrape a Unix socket).
    public var metricsAddress: HostPort?
    /// Address books (`lmx-connections.json`) followed for changes: a rewritten tunnel URL
    /// updates the pairing of the same entry. `~/` is the daemon user's home.
    public var addressBooks: [String] = []
    /// Keys of the file that no setting has (`health.stabilty_window`): ignored, and said in the
    /// log with the file, since a misspelt key would otherwise leave its default in force unseen.
    public var unknownKeys: [String] = []

    public init() {}

    enum CodingKeys: String, CodingKey, CaseIterable {
        case policy = "health"
        case endpoints, interfaces
        case excludeInterfaces = "exclude_interfaces"
        case discovery
        case browseDomains = "browse_domains"
        case browseAnnouncedDomains = "browse_announced_domains"
        case doctorInterfaces = "doctor_interfaces"
        case extraCAFile = "extra_ca_file"
        case watchHeartbeat = "watch_heartbeat"
        case eventRetention = "event_retention"
        case logLevel = "log_level"
        case trust
        case lanKeys = "lan_keys"
        case gateway, prefer
        case addressBooks = "address_books"
        case metricsAddress = "metrics_address"
    }

    public init(from decoder: any Decoder) throws {
        let c = try ConfigurationReader(decoder, keys: CodingKeys.self)
        let d = AgentConfiguration()
        policy = try c.value(.policy, or: d.policy)
        policy.trust = try c.choice(.trust, or: policy.trust)
        policy.lanKeys = try c.choice(.lanKeys, or: policy.lanKeys)
        // `prefer`: instance ids in order of preference among equally healthy servers.
        policy.preferredInstances = try c.value(.prefer, or: policy.preferredInstances)
        endpoints = try c.value(.endpoints, or: d.endpoints)
        interfaces = try c.value(.interfaces, or: d.interfaces)
        excludeInterfaces = try c.value(.excludeInterfaces, or: d.excludeInterfaces)
        discovery = try c.value(.discovery, or: d.discovery)
        browseDomains = try c.value(.browseDomains, or: d.browseDomains).map {
            $0.hasSuffix(".") ? String($0.dropLast()) : $0
        }
        guard browseDomains.count <= 16,
            browseDomains.allSatisfy({
                (try? HostPort.parseHost($0, field: "browse_domains")) != nil && $0.contains(".")
            })
        else {
            throw c.invalid(.browseDomains, "at most 16 DNS domain names, such as \"lmx.example.com\"")
        }
        browseAnnouncedDomains = try c.value(.browseAnnouncedDomains, or: d.browseAnnouncedDomains)
        doctorInterfaces = try c.value(.doctorInterfaces, or: d.doctorInterfaces)
        extraCAFile = try c.optional(.extraCAFile)
        watchHeartbeat = try c.number(.watchHeartbeat, or: d.watchHeartbeat, in: 0.1...3600, unit: "seconds")
        eventRetention = try c.number(.eventRetention, or: d.eventRetention, in: 100...10_000_000)
        gateway = try c.value(.gateway, or: d.gateway)
        addressBooks = try c.value(.addressBooks, or: d.addressBooks)
        metricsAddress = try c.parsed(.metricsAddress, or: d.metricsAddress, Self.parseMetricsAddress)
        guard addressBooks.count <= 16, addressBooks.allSatisfy({ $0.hasPrefix("/") || $0.hasPrefix("~/") }) else {
            throw c.invalid(.addressBooks, "at most 16 absolute paths (or ~/…)")
        }
        logLevel = try c.value(.logLevel, or: d.logLevel)
        guard Self.logLevels.contains(logLevel) else {
            throw c.invalid(.logLevel, "must be one of \(Self.logLevels.joined(separator: ", "))")
        }
    }

    /// The words `log_level` takes.
    static let logLevels = ["trace", "debug", "info", "notice", "warning", "error", "critical"]

    /// `127.0.0.1:9466`, `[::1]:9466`, `0.0.0.0:9466` (to be scraped from elsewhere: the metrics
    /// carry no secret, but say which servers exist), or `off`.
    public static func parseMetricsAddress(_ text: String) throws(ConfigurationError) -> HostPort? {
        if text.lowercased() == "off" || text.isEmpty { return nil }
        guard let parsed = try? HostPort.parseAuthority(text, field: "metrics_address"), let port = parsed.port else {
            throw ConfigurationError(key: "metrics_address", "\(text) is not host:port (127.0.0.1:9466)")
        }
        return HostPort(host: parsed.host.lowercased() == "localhost" ? "127.0.0.1" : parsed.host, port: port)
    }

    /// Parses a config file's bytes.
    /// - Throws: `ConfigurationError` naming the file, the key path and what is wrong.
    public static func parse(_ bytes: [UInt8], file: String) throws(ConfigurationError) -> AgentConfiguration {
        // An empty file (or only whitespace) means "all defaults".
        if bytes.allSatisfy({ [0x20, 0x09, 0x0A, 0x0D].contains($0) }) { return AgentConfiguration() }
        let configuration: AgentConfiguration
        do {
            // JSON5: comments, trailing commas and unquoted keys, so the shipped file can explain itself.
            let decoder = JSONDecoder()
            decoder.allowsJSON5 = true
            configuration = try decoder.decode(AgentConfiguration.self, from: Data(bytes))
        } catch let error as DecodingError {
            throw describe(error).inFile(file)
        } catch {
            throw ConfigurationError(file: file, "not valid JSON")
        }
        for (index, endpoint) in configuration.endpoints.enumerated() {
            do {
                _ = try endpoint.route()
            } catch {
                throw ConfigurationError(file: file, key: "endpoints[\(index)]", error.message)
            }
        }
        var checked = configuration
        checked.unknownKeys = ConfigurationKeys.unknown(in: bytes)
        return checked
    }

    /// What the decoder found wrong, with the key's path.
    static func describe(_ error: DecodingError) -> ConfigurationError {
        func path(_ keys: [any CodingKey]) -> String? {
            let text = keys.map { $0.intValue.map { "[\($0)]" } ?? ".\($0.stringValue)" }.joined().drop { $0 == "." }
                .description
            return text.isEmpty ? nil : text
        }
        switch error {
        case .typeMismatch(let type, let context):
            return ConfigurationError(key: path(context.codingPath), "expected \(type)")
        case .valueNotFound(_, let context):
            return ConfigurationError(key: path(context.codingPath), "missing value")
        case .keyNotFound(let key, let context):
            return ConfigurationError(key: path(context.codingPath + [key]), "required")
        case .dataCorrupted(let context):
            guard let at = path(context.codingPath) else { return ConfigurationError("not valid JSON") }
            return ConfigurationError(key: at, context.debugDescription)
        @unknown default:
            return ConfigurationError("invalid")
        }
    }
}
