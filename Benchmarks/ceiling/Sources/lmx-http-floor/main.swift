import Glibc
import NIOCore
import NIOHTTP1
import NIOPosix

// The floor of any HTTP server on SwiftNIO: SwiftNIO's HTTP/1 server pipeline and one handler
// that answers every request with the same small JSON from memory (no routing, no policy, no
// upstream). What accepting, parsing, answering and closing cost SwiftNIO itself, measured beside
// nginx answering the same from its configuration (ceiling.py). Not part of lmx-agent.
//
// Usage: lmx-http-floor LISTEN_PORT (on 127.0.0.1)

final class Answer: ChannelInboundHandler, @unchecked Sendable {  // confined to one event loop
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private static let body = ByteBuffer(string: #"{"object":"list","data":[{"id":"test/model","object":"model"}]}"#)
    private var keepAlive = true

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            keepAlive = head.isKeepAlive
        case .body:
            break
        case .end:
            var headers = HTTPHeaders()
            headers.add(name: "Content-Type", value: "application/json")
            headers.add(name: "Content-Length", value: String(Self.body.readableBytes))
            if !keepAlive { headers.add(name: "Connection", value: "close") }
            context.write(
                wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))), promise: nil
            )
            context.write(wrapOutboundOut(.body(.byteBuffer(Self.body))), promise: nil)
            if keepAlive {
                context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
            } else {
                let channel = context.channel
                context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in channel.close(promise: nil) }
            }
        }
    }
}

let arguments = CommandLine.arguments
guard arguments.count == 2, let port = Int(arguments[1]) else {
    print("usage: lmx-http-floor LISTEN_PORT")
    exit(64)
}
let group = MultiThreadedEventLoopGroup(numberOfThreads: System.coreCount)
let server = try ServerBootstrap(group: group)
    .serverChannelOption(.backlog, value: 256)
    .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
    .childChannelInitializer { channel in
        channel.eventLoop.makeCompletedFuture {
            try channel.pipeline.syncOperations.configureHTTPServerPipeline(withPipeliningAssistance: false)
            try channel.pipeline.syncOperations.addHandler(Answer())
        }
    }
    .bind(host: "127.0.0.1", port: port).wait()
try server.closeFuture.wait()
