import Glibc
import NIOCore
import NIOPosix

// The ceiling of an HTTP proxy on SwiftNIO: a relay that parses nothing. Each client connection
// gets its own upstream connection on the same event loop, and bytes pass both ways as they are
// read (one flush per read batch; a side is read only while the other can take more). Not a
// proxy anyone should use: it cannot route, check or count anything. It measures what SwiftNIO's
// event loops and the system calls cost on their own, beside nginx and the gateway (ceiling.py).
//
// Usage: lmx-relay-ceiling LISTEN_PORT UPSTREAM_PORT (both on 127.0.0.1)

final class Glue: ChannelDuplexHandler, @unchecked Sendable {  // confined to one event loop
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    var partner: Glue?
    private var context: ChannelHandlerContext?
    private var readPending = false

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        partner = nil
    }
    func channelRead(context: ChannelHandlerContext, data: NIOAny) { partner?.context?.write(data, promise: nil) }
    func channelReadComplete(context: ChannelHandlerContext) { partner?.context?.flush() }
    func channelInactive(context: ChannelHandlerContext) { partner?.context?.close(promise: nil) }
    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable, let partner, partner.readPending {
            partner.readPending = false
            partner.context?.read()
        }
    }
    func read(context: ChannelHandlerContext) {
        if partner?.context?.channel.isWritable ?? true { context.read() } else { readPending = true }
    }
}

let arguments = CommandLine.arguments
guard arguments.count == 3, let listenPort = Int(arguments[1]), let upstreamPort = Int(arguments[2]) else {
    print("usage: lmx-relay-ceiling LISTEN_PORT UPSTREAM_PORT")
    exit(64)
}
let group = MultiThreadedEventLoopGroup(numberOfThreads: System.coreCount)
let server = try ServerBootstrap(group: group)
    .serverChannelOption(.backlog, value: 256)
    .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
    .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
    .childChannelInitializer { client in
        let downstream = Glue()
        let upstream = Glue()
        downstream.partner = upstream
        upstream.partner = downstream
        return ClientBootstrap(group: client.eventLoop)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelInitializer { $0.pipeline.addHandler(upstream) }
            .connect(host: "127.0.0.1", port: upstreamPort)
            .flatMap { _ in client.pipeline.addHandler(downstream) }
    }
    .bind(host: "127.0.0.1", port: listenPort).wait()
try server.closeFuture.wait()
