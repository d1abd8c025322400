import Hummingbird
import HummingbirdCore
import LMXCore
import LMXProbe
import LMXSystem
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Prometheus
import ServiceLifecycle
import Synchronization

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The local OpenAI-compatible gateway: forwards `/v1/*` (and `/admin/*` when enabled) to the
/// active endpoint with that route's credentials, streams answers through as they come, and
/// tries the next usable route only before any byte of an answer has reached the client.
public final class Gateway: Sendable {
    let agent: Agent
    let configuration: GatewayConfiguration
    let logger: Logger
    let metrics: AgentMetrics
    /// Who may use the gateway when `gateway.group` is set.
    let groupGate: GroupMembership?
    /// Requests in flight per route and busy servers' cool-downs.
    let load = RouteLoad()
    /// Request bytes read ahead by all requests together.
    let readAhead: ReadAheadBudget
    /// What the TCP listeners could bind (the `localhost` rule).
    let listeners: GatewayListeners
    /// The read-only dashboard at `/`.
    let dashboard: Dashboard
    /// Which server holds which agent run, RAG collection or stored response.
    let affinity = ServerAffinityBook()
    /// `gateway.admin` and `gateway.max_request_bytes` as the last reload set them (SIGHUP applies
    /// them to every request from then on; the other gateway settings take effect at a restart).
    private let adminSetting: Atomic<Bool>
    private let maxRequestSetting: Atomic<Int>
    /// Whether `/admin/*` is forwarded now.
    var adminEnabled: Bool { adminSetting.load(ordering: .relaxed) }
    /// The largest request body forwarded now.
    var maxRequestBytes: Int { maxRequestSetting.load(ordering: .relaxed) }
    /// The data path: each event loop's state and connections (set once, in `init`).
    private let dataPathBox = Mutex<GatewayDataPath?>(nil)
    var dataPath: GatewayDataPath? { dataPathBox.withLock { $0 } }

    public init(agent: Agent, configuration: GatewayConfiguration, extraCAFile: String?, logger: Logger) throws {
        self.agent = agent
        self.metrics = agent.metrics
        self.configuration = configuration
        self.adminSetting = Atomic(configuration.admin)
        self.maxRequestSetting = Atomic(configuration.maxRequestBytes)
        self.logger = logger
        self.dashboard = Dashboard(agent: agent)
        self.readAhead = ReadAheadBudget(bytes: configuration.readAheadBudgetBytes)
        self.listeners = GatewayListeners(
            pairsFamilies: configuration.listen.map { Self.listenAddresses($0).count == 2 } ?? false)
        let tls = try HTTPClients.tls(extraCAFile: extraCAFile)
        if let group = configuration.group {
            guard Users.groupID(named: group) != nil else {
                throw ConfigurationError("gateway.group: no group named \(group) on this machine")
            }
            groupGate = GroupMembership(group: group)
        } else {
            groupGate = nil
        }
        let dataPath = try GatewayDataPath(gateway: self, tls: tls)
        dataPathBox.withLock { $0 = dataPath }
    }

    /// The config file was read again (SIGHUP): `admin` and `max_request_bytes` apply to every
    /// request from now on; any other gateway setting that changed is named in the log, to take
    /// effect when the daemon restarts. Returns the keys left for the restart.
    @discardableResult
    public func reload(_ new: GatewayConfiguration, file: String) -> [String] {
        adminSetting.store(new.admin, ordering: .relaxed)
        maxRequestSetting.store(new.maxRequestBytes, ordering: .relaxed)
        let waiting = GatewayConfiguration.changedKeys(from: configuration, to: new).filter {
            $0 != "admin" && $0 != "max_request_bytes"
        }
        if !waiting.isEmpty {
            logger.warning(
                "config: \(waiting.map { "gateway." + $0 }.joined(separator: ", ")) changed in \(file): the gateway keeps its settings until the daemon restarts (sudo systemctl restart lmx-agentd); gateway.admin and gateway.max_request_bytes apply now"
            )
        }
        return waiting
    }

    /// This machine's network changed: new requests open new connections; those streaming now
    /// finish on theirs.
    public func dropConnections() {
        dataPath?.dropConnections()
    }

    /// The listeners to run: the Unix socket always, TCP on loopback when configured.
    public func applications(socketPath: String?) -> [(name: String, app: any Service)] {
        guard let dataPath else { return [] }
        var apps: [(String, any Service)] = [("gateway-state", FollowService { await dataPath.follow() })]
        // Per user, on the socket and over TCP together (the kernel names the user of a loopback
        // TCP peer too): one user's connections cannot crowd out another's.
        let limiter = ConnectionLimiter(perUser: configuration.maxConnectionsPerUser)
        let connection = GatewayChildChannel(
            responder: Self.generalPath(GatewayResponder(gateway: self), logger: logger), limiter: limiter,
            dataPath: dataPath)
        if let socketPath {
            let listener = GatewayListener(
                address: .unix(path: socketPath), connection: connection, maxConnections: 2048, logger: logger,
                onRunning: { [logger, agent, group = configuration.group] in
                    // With a group gate the check is per request (SO_PEERCRED); the file itself
                    // stays connectable, as the status socket is.
                    FileSystem.setMode(socketPath, 0o666)
                    logger.info(
                        "The gateway serves \(group.map { "members of \($0)" } ?? "any local user") on its Unix socket.",
                        metadata: ["socket": "\(socketPath)"])
                    await agent.manager.setGatewaySocket(socketPath, problem: nil)
                })
            apps.append(
                (
                    "gateway-socket",
                    ReportingListener(base: listener) { [agent] error in
                        await agent.manager.setGatewaySocket(
                            nil, problem: "gateway socket \(socketPath) cannot be bound: \(error)")
                    }
                ))
        }
        if let listen = configuration.listen, configuration.group == nil {
            for address in Self.listenAddresses(listen) {
                let family: GatewayListeners.Family = address.isIPv6 ? .v6 : .v4
                let service = RetryingListener(
                    address: address, logger: logger,
                    make: { [logger] onRunning in
                        GatewayListener(
                            address: .tcp(host: address.host, port: address.port), connection: connection,
                            maxConnections: 2048, logger: logger, onRunning: onRunning)
                    },
                    report: { [self] outcome in
                        await self.listenerChanged(family: family, address: address, outcome: outcome)
                    })
                apps.append((family == .v4 ? "gateway-tcp" : "gateway-tcp6", service))
            }
        }
        return apps
    }

    /// What answers the requests the data path hands over: Hummingbird's request and response
    /// types around ``GatewayResponder`` (as a Hummingbird application would call it).
    static func generalPath(_ responder: GatewayResponder, logger: Logger) -> HTTPChannelHandler.Responder {
        { request, writer, channel in
            let context = AgentRequestContext(source: .init(channel: channel, logger: logger))
            let response = try await responder.respond(to: request, context: context)
            do {
                try await writer.write(response: response.head, body: response.body)
            } catch is HTTPParserError {
                // Not the parser error itself: the connection's handler would answer it with a
                // second response.
                throw AnswerNotWritten()
            }
        }
    }

    struct AnswerNotWritten: Error {}

    /// The addresses to bind for `listen`: 127.0.0.1 and ::1 together for the default (clients
    /// resolve `localhost` to ::1 first, so the port there is held too, or someone else could take
    /// it and receive other users' prompts); any other address alone.
    static func listenAddresses(_ listen: HostPort) -> [HostPort] {
        guard listen.host == "127.0.0.1" || listen.host.lowercased() == "localhost" else { return [listen] }
        return [HostPort(host: "127.0.0.1", port: listen.port), HostPort(host: "::1", port: listen.port)]
    }

    /// A listener bound, or failed to: what is advertised follows (the TCP URL only while the
    /// listener of the configured address serves), and `localhost` is accepted only while no one
    /// else holds the port on either family.
    func listenerChanged(family: GatewayListeners.Family, address: HostPort, outcome: RetryingListener.Outcome) async {
        let state: GatewayListeners.Bind
        switch outcome {
        case .serving:
            state = .serving
            logger.info("The gateway serves http://\(address.description)/v1.")
        case .failed(let error):
            if family == .v6, RetryingListener.noIPv6Loopback(error) {
                // No IPv6 loopback on this machine: nobody can listen there either.
                state = .unavailable
                logger.notice(
                    "gateway: no IPv6 loopback here; serving 127.0.0.1 only",
                    metadata: ["address": "\(address.description)"])
            } else {
                let holder =
                    (error as? IOError)?.errnoCode == EADDRINUSE
                    ? ListeningSockets.owner(port: address.port, ipv6: family == .v6).map {
                        // The agent's own user: most likely a second agent (or an earlier one
                        // still running) on the same port.
                        "held by \(Users.describe($0))"
                            + ($0 == Users.effective ? ", the agent's own user (another lmx-agentd?)" : "")
                    } ?? "in use"
                    : "cannot be bound: \(error)"
                let why = "\(address.description) is \(holder); retrying"
                state = .failed(why)
                logger.error(
                    "gateway: \(why); the gateway's TCP address is not advertised until it is the agent's",
                    metadata: ["address": "\(address.description)"])
            }
        }
        let (v4, v6, generation) = listeners.set(family, state)
        let primaryIsV4 = configuration.listen.map { !$0.isIPv6 } ?? true
        let primary = primaryIsV4 ? v4 : v6
        var problems: [String] = []
        if case .failed(let why) = v4 { problems.append(why) }
        if case .failed(let why) = v6 {
            problems.append(why + (primaryIsV4 ? " (Host: localhost refused meanwhile)" : ""))
        }
        await agent.manager.setGatewayListener(
            url: primary == .serving
                ? configuration.listen.map {
                    "http://\(primaryIsV4 && $0.host.lowercased() == "localhost" ? "127.0.0.1:\($0.port)" : $0.description)"
                } : nil,
            problem: problems.isEmpty ? nil : problems.joined(separator: "; "), generation: generation)
    }
}

/// A listener whose failure to bind is reported (the gateway's socket: its problem in
/// `/v1/status`), then passed on.
struct ReportingListener: Service {
    let base: any Service
    let report: @Sendable (any Error) async -> Void

    func run() async throws {
        do {
            try await base.run()
        } catch {
            if !Task.isShuttingDownGracefully { await report(error) }
            throw error
        }
    }
}

/// Runs `body` until the service group stops.
struct FollowService: Service {
    let body: @Sendable () async -> Void

    func run() async throws {
        await cancelWhenGracefulShutdown { await body() }
    }
}

/// What each TCP listener of the gateway could bind.
final class GatewayListeners: Sendable {
    enum Family: Sendable { case v4, v6 }
    enum Bind: Sendable, Equatable {
        case pending, serving, unavailable
        case failed(String)
    }
    private let state = Mutex<(v4: Bind, v6: Bind, generation: UInt64)>((.pending, .unavailable, 0))

    init(pairsFamilies: Bool) {
        if pairsFamilies { state.withLock { $0.v6 = .pending } }
    }

    /// Records a listener's state: both, numbered (the latest report wins where they are applied).
    @discardableResult
    func set(_ family: Family, _ bind: Bind) -> (Bind, Bind, UInt64) {
        state.withLock { s in
            if family == .v4 { s.v4 = bind } else { s.v6 = bind }
            s.generation += 1
            return (s.v4, s.v6, s.generation)
        }
    }

    /// `localhost` reaches only us: the IPv6 loopback port is ours or does not exist.
    var localhostIsOurs: Bool {
        state.withLock { s in s.v6 == .serving || s.v6 == .unavailable }
    }
}

/// A listener that keeps trying to bind: a port held by someone else costs the TCP listener
/// (reported, not advertised), not the daemon, and is taken as soon as it is free.
struct RetryingListener: Service {
    enum Outcome: Sendable {
        case serving
        case failed(any Error)
    }

    let address: HostPort
    let logger: Logger
    let make: @Sendable (_ onRunning: @escaping @Sendable () async -> Void) -> any Service
    let report: @Sendable (Outcome) async -> Void

    /// The bind failed because this machine has no IPv6 loopback (nobody can listen there).
    static func noIPv6Loopback(_ error: any Error) -> Bool {
        let code = (error as? IOError)?.errnoCode
        return code == EADDRNOTAVAIL || code == EAFNOSUPPORT
    }

    func run() async throws {
        var delay = 1.0
        while !Task.isShuttingDownGracefully, !Task.isCancelled {
            do {
                try await make { await report(.serving) }.run()
                return
            } catch {
                if Task.isShuttingDownGracefully || Task.isCancelled { return }
                await report(.failed(error))
                if address.isIPv6, Self.noIPv6Loopback(error) {
                    // No IPv6 loopback: nothing to retry; wait for the daemon's end.
                    try? await gracefulShutdown()
                    return
                }
                let wait = delay
                try? await cancelWhenGracefulShutdown { try await Task.sleep(for: .seconds(wait)) }
                delay = min(delay * 2, 10)
            }
        }
    }
}

struct GatewayResponder: HTTPResponder {
    typealias Context = AgentRequestContext
    let gateway: Gateway

    func respond(to request: Request, context: AgentRequestContext) async throws -> Response {
        await gateway.answer(request, context: context)
    }
}

extension AgentRequestContext {
    /// Came in over TCP (the loopback listener), not the Unix socket.
    var isTCP: Bool {
        switch channel.localAddress {
        case .v4, .v6: true
        default: false
        }
    }
}
