import Glibc
import NIOCore
import NIOPosix

// The floor of any server on SwiftNIO's channels: for each request head read, the same small JSON
// answer from memory, written as bytes (no HTTP codec, no routing, no policy, no upstream; the
// head is only looked at for its end and for `Connection: close`), on the gateway's listeners (one
// listening socket per event loop, SO_REUSEPORT, each loop serving what it accepts) and built with
// its release flags. What accepting, reading, answering and closing cost SwiftNIO itself, measured
// beside nginx answering the same from its configuration (ceiling.py). Not part of lmx-agent.
//
// Usage: lmx-http-floor LISTEN_PORT (on 127.0.0.1)

final class Answer: ChannelInboundHandler, @unchecked Sendable {  // confined to one event loop
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private static let body = #"{"object":"list","data":[{"id":"test/model","object":"model"}]}"#
    private static let kept = ByteBuffer(
        string: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)")
    private static let closing = ByteBuffer(
        string:
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)"
    )
    private static let end = Array("\r\n\r\n".utf8)
    private static let close = Array("connection: close".utf8)

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let bytes = unwrapInboundIn(data).readableBytesView
        // (A head per read, as wrk and the benchmarks send them.)
        guard bytes.count >= 4, bytes.suffix(4).elementsEqual(Self.end) else { return }
        let lowered = bytes.lazy.map { $0 >= 65 && $0 <= 90 ? $0 | 0x20 : $0 }
        let closes = Array(lowered).firstRange(of: Self.close) != nil
        if closes {
            context.writeAndFlush(wrapOutboundOut(Self.closing), promise: nil)
            context.close(promise: nil)
        } else {
            context.writeAndFlush(wrapOutboundOut(Self.kept), promise: nil)
        }
    }
}

let arguments = CommandLine.arguments
guard arguments.count == 2, let port = Int(arguments[1]) else {
    print("usage: lmx-http-floor LISTEN_PORT")
    exit(64)
}
let group = MultiThreadedEventLoopGroup(numberOfThreads: System.coreCount)
var servers: [any Channel] = []
for loop in group.makeIterator() {
    servers.append(
        try ServerBootstrap(group: loop, childGroup: loop)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelOption(.socketOption(.init(rawValue: SO_REUSEPORT)), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(Answer()) }
            }
            .bind(host: "127.0.0.1", port: port).wait())
}
try servers[0].closeFuture.wait()
