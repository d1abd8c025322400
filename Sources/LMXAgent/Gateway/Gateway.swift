import AsyncHTTPClient
import Hummingbird
import HummingbirdCore
import LMXCore
import LMXProbe
import Logging
import ServiceLifecycle
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Prometheus
import Synchronization

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import LMXSystem

/// The local OpenAI-compatible gateway: forwards `/v1/*` (and `/admin/*` when enabled) to the
/// active endpoint with that route's credentials, streams answers through as they come, and
/// tries the next usable route only before any byte of an answer has reached the client.
public final class Gateway: Sendable {
    let agent: Agent
    let configuration: GatewayConfiguration
    let logger: Logger
    let metrics: AgentMetrics
    let lanClient: RenewableHTTPClient
    let wanClient: RenewableHTTPClient
    /// Who may use the gateway when `gateway.group` is set.
    let groupGate: GroupMembership?
    /// Requests in flight per route and busy servers' cool-downs.
    let load = RouteLoad()
    /// Request bytes read ahead by all requests together.
    let readAhead: ReadAheadBudget

    public init(agent: Agent, configuration: GatewayConfiguration, extraCAFile: String?, logger: Logger) throws {
        self.agent = agent
        self.metrics = agent.metrics
        self.configuration = configuration
        self.logger = logger
        self.readAhead = ReadAheadBudget(bytes: configuration.readAheadBudgetBytes)
        let tls = try HTTPClients.tls(extraCAFile: extraCAFile)
        // As many connections to a route as streams at once (up to the configured bound): a
        // request never waits behind a pool of our own smaller than what the server takes.
        let perRoute = configuration.maxConnectionsPerRoute
        let connectTimeout = configuration.connectTimeout
        lanClient = RenewableHTTPClient { HTTPClients.make(tls: tls, connectTimeout: connectTimeout, idleTimeout: 60, connectionsPerHost: perRoute) }
        wanClient = RenewableHTTPClient { HTTPClients.make(tls: tls, connectTimeout: max(connectTimeout, 8), idleTimeout: 60, connectionsPerHost: perRoute) }
        if let group = configuration.group {
            guard Users.groupID(named: group) != nil else {
                throw ConfigurationError("gateway.group: no group named \(group) on this machine")
            }
            groupGate = GroupMembership(group: group)
        } else {
            groupGate = nil
        }
    }

    public func shutdown() async {
        await lanClient.shutdown()
        await wanClient.shutdown()
    }

    /// This machine's network changed: new requests open new connections; those streaming now
    /// finish on theirs.
    public func dropConnections() {
        lanClient.renew()
        wanClient.renew()
    }

    /// The applications to run: the Unix socket always, TCP on loopback when configured.
    public func applications(socketPath: String?) -> [(name: String, app: any Service)] {
        var apps: [(String, any Service)] = []
        let responder = GatewayResponder(gateway: self)
        // Per user, on the socket and over TCP together (the kernel names the user of a loopback
        // TCP peer too): one user's connections cannot crowd out another's.
        let limiter = ConnectionLimiter(perUser: configuration.maxConnectionsPerUser)
        let server = HTTPServerBuilder { responder in
            PerUserLimitedChannel(base: HTTP1Channel(responder: responder, configuration: .init(idleTimeout: .seconds(60))), limiter: limiter)
        }
        if let socketPath {
            let app = Application(
                responder: responder,
                server: server,
                configuration: .init(
                    address: .unixDomainSocket(path: socketPath), serverName: nil,
                    availableConnectionsDelegate: .maximum(2048, logger: logger)),
                onServerRunning: { [logger, group = configuration.group] _ in
                    // With a group gate the check is per request (SO_PEERCRED); the file itself
                    // stays connectable, as the status socket is.
                    FileSystem.setMode(socketPath, 0o666)
                    logger.info("gateway serving", metadata: ["socket": "\(socketPath)", "group": "\(group ?? "any local user")"])
                },
                logger: logger)
            apps.append(("gateway-socket", app))
        }
        if let listen = configuration.listen, configuration.group == nil {
            let app = Application(
                responder: responder,
                server: server,
                configuration: .init(
                    address: .hostname(listen.host, port: listen.port), serverName: nil,
                    availableConnectionsDelegate: .maximum(2048, logger: logger)),
                onServerRunning: { [logger] _ in
                    logger.info("gateway serving", metadata: ["url": "http://\(listen.description)"])
                },
                logger: logger)
            apps.append(("gateway-tcp", app))
        }
        return apps
    }
}

/// A request body past its first megabyte: what was read, then the rest as the client sends it,
/// failing once it passes the cap.
struct StreamedBody: AsyncSequence, Sendable {
    typealias Element = ByteBuffer
    let prefix: [ByteBuffer]
    let rest: UnsafeSendableIterator
    let limit: Int

    struct AsyncIterator: AsyncIteratorProtocol {
        var prefix: [ByteBuffer]
        let rest: UnsafeSendableIterator
        let limit: Int
        var total = 0

        mutating func next() async throws -> ByteBuffer? {
            let chunk: ByteBuffer?
            if !prefix.isEmpty {
                chunk = prefix.removeFirst()
            } else {
                chunk = try await rest.next()
            }
            guard let chunk else { return nil }
            total += chunk.readableBytes
            if total > limit { throw RequestBodyTooLarge() }
            return chunk
        }
    }

    func makeAsyncIterator() -> AsyncIterator { AsyncIterator(prefix: prefix, rest: rest, limit: limit) }
}

struct RequestBodyTooLarge: Error {}

/// The request body's iterator, handed to the HTTP client that reads it from one task at a time
/// (the body is consumed once, in order).
final class UnsafeSendableIterator: @unchecked Sendable {
    private var iterator: RequestBody.AsyncIterator

    init(_ iterator: RequestBody.AsyncIterator) { self.iterator = iterator }

    func next() async throws -> ByteBuffer? { try await iterator.next() }
}

struct GatewayResponder: HTTPResponder {
    typealias Context = AgentRequestContext
    let gateway: Gateway

    func respond(to request: Request, context: AgentRequestContext) async throws -> Response {
        await gateway.forward(request, context: context)
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
