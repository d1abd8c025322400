import LMXSystem
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle
import Synchronization

/// A listener of the gateway (the Unix socket, a TCP address), on SwiftNIO directly: each accepted
/// connection gets its pipeline (``GatewayChildChannel``) on its event loop and nothing else: no
/// task, no asynchronous stream, until a request on it needs the general path. (Hummingbird's
/// server hands every connection to a task of its own through an asynchronous stream: about a
/// quarter of the CPU a one-request connection cost.) Hummingbird still answers what reaches the
/// general path, through ``GatewayChildChannel/startGeneralPath(on:logger:)``.
///
/// At most `maxConnections` connections are open at once (past that, accepting waits); on the
/// daemon's graceful shutdown it stops accepting, each connection closes once what it is
/// answering has ended, and `run()` returns when all have closed.
struct GatewayListener: Service {
    enum Address: Sendable {
        case tcp(host: String, port: Int)
        case unix(path: String)
    }

    let address: Address
    let connection: GatewayChildChannel
    let maxConnections: Int
    let logger: Logger
    /// Called once the address is bound.
    let onRunning: @Sendable () async -> Void

    func run() async throws {
        let group = connection.dataPath.group
        var listening: [(channel: any Channel, gate: ListenerGate)] = []
        do {
            switch address {
            case .tcp(let host, let port):
                // One listening socket per event loop (SO_REUSEPORT: the kernel spreads new
                // connections over them), each loop serving the connections it accepts. With one
                // socket, a connection accepted on one loop and served on another cost about a
                // third more CPU (the hand-over and, at its close, the bookkeeping go back across),
                // 128 µs where 87 on one loop, for one-request connections from 8 clients. Only
                // sockets of the same user can share a port this way: the kernel refuses others
                // (EADDRINUSE, as before). A socket of the same user would join them silently (a
                // second agent on the same port, each served a share of the connections): the
                // port is first claimed by a socket that shares it with nobody.
                let loops = Array(group.makeIterator())
                if loops.count > 1, port != 0, let refusal = PortClaim.refusal(host: host, port: port) {
                    throw IOError(errnoCode: refusal, reason: "bind(\(host):\(port))")
                }
                var boundPort = port
                for loop in loops {
                    let bound = try await listen(
                        on: loop, serving: loop, shared: loops.count > 1,
                        maxConnections: max(1, maxConnections / loops.count)
                    ) { try await $0.bind(host: host, port: boundPort).get() }
                    listening.append(bound)
                    boundPort = bound.channel.localAddress?.port ?? port
                }
            case .unix(let path):
                listening.append(
                    try await listen(on: group.next(), serving: group, shared: false, maxConnections: maxConnections) {
                        try await $0.bind(unixDomainSocketPath: path, cleanupExistingSocketFile: true).get()
                    })
            }
        } catch {
            for bound in listening { try? await bound.channel.close() }
            throw error
        }
        await onRunning()
        let sockets = listening
        let stopping = Mutex<[EventLoopFuture<Void>]>([])
        await withTaskCancellationHandler {
            await withGracefulShutdownHandler {
                for bound in sockets { try? await bound.channel.closeFuture.get() }
            } onGracefulShutdown: {
                for bound in sockets {
                    let done = bound.channel.eventLoop.makePromise(of: Void.self)
                    stopping.withLock { $0.append(done.futureResult) }
                    bound.gate.quiesce(done)
                }
            }
        } onCancel: {
            for bound in sockets { bound.channel.close(promise: nil) }
        }
        // After a graceful shutdown: until every connection has closed.
        for stopped in stopping.withLock({ $0 }) { try? await stopped.get() }
    }

    /// One listening socket on `loop`, its connections served on `serving`.
    private func listen(
        on loop: any EventLoop, serving: any EventLoopGroup, shared: Bool, maxConnections: Int,
        bind: (ServerBootstrap) async throws -> any Channel
    ) async throws -> (channel: any Channel, gate: ListenerGate) {
        let gate = ListenerGate(loop: loop, maxConnections: maxConnections)
        let connection = connection
        let logger = logger
        var bootstrap = ServerBootstrap(group: loop, childGroup: serving)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
        if shared {
            bootstrap = bootstrap.serverChannelOption(.socketOption(.init(rawValue: SO_REUSEPORT)), value: 1)
        }
        bootstrap =
            bootstrap
            .serverChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(gate) }
            }
            .childChannelInitializer { channel in
                connection.start(channel: channel, logger: logger)
            }
        return (try await bind(bootstrap), gate)
    }
}
