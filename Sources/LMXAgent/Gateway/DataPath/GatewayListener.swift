import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import NIOExtras
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
        let quiescing = ServerQuiescingHelper(group: group)
        let connection = connection
        let logger = logger
        let maxConnections = maxConnections
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    try sync.addHandler(AvailableConnectionsChannelHandler(maxConnections: maxConnections))
                    try sync.addHandler(quiescing.makeServerChannelHandler(channel: channel))
                }
            }
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelInitializer { channel in
                connection.setup(channel: channel, logger: logger).map { _ in () }
            }
        let channel: any Channel
        switch address {
        case .tcp(let host, let port):
            channel = try await bootstrap.bind(host: host, port: port).get()
        case .unix(let path):
            channel = try await bootstrap.bind(unixDomainSocketPath: path, cleanupExistingSocketFile: true).get()
        }
        await onRunning()
        let stopping = Mutex<EventLoopFuture<Void>?>(nil)
        await withTaskCancellationHandler {
            await withGracefulShutdownHandler {
                try? await channel.closeFuture.get()
            } onGracefulShutdown: {
                let done = group.next().makePromise(of: Void.self)
                stopping.withLock { $0 = done.futureResult }
                quiescing.initiateShutdown(promise: done)
            }
        } onCancel: {
            channel.close(promise: nil)
        }
        // After a graceful shutdown: until every connection has closed.
        if let stopped = stopping.withLock({ $0 }) { try? await stopped.get() }
    }
}
