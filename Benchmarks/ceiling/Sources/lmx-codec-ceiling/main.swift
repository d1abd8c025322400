import Glibc
import NIOCore
import NIOPosix

// What an HTTP/1 codec of the data path's own would reach: the relay's structure (one upstream
// connection per client, on the same event loop, one flush per read batch, backpressure both
// ways), but every message's head is read from the bytes as they come and written anew as the
// gateway writes it — hop-by-hop headers dropped, `Host` set, the security headers and
// `X-LMX-Via` added, `Content-Length` framing — while bodies pass as the buffers read, never
// decoded into parts or copied. No routing, no policy, no counting: the cost of the codec and of
// SwiftNIO beneath it, measured beside nginx, the relay and the gateway (ceiling.py). Content-
// Length framing only (a message with `Transfer-Encoding` closes the pair): not a proxy anyone
// should use, a measurement.
//
// Usage: lmx-codec-ceiling LISTEN_PORT UPSTREAM_PORT (both on 127.0.0.1)

/// One connection of a pair: reads messages (requests on the client's, answers on the
/// server's) and writes each to the partner, its head rewritten.
final class Side: ChannelDuplexHandler, @unchecked Sendable {  // confined to one event loop
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    let readsRequests: Bool
    let authority: String
    var partner: Side?
    private var context: ChannelHandlerContext?
    private var readPending = false
    /// A head not yet whole.
    private var partial: ByteBuffer?
    /// Body bytes of the current message still to pass.
    private var bodyLeft = 0

    static let maxHead = 64 << 10

    init(readsRequests: Bool, authority: String) {
        self.readsRequests = readsRequests
        self.authority = authority
    }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        partner = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        while buffer.readableBytes > 0 {
            if bodyLeft > 0 {
                let n = min(bodyLeft, buffer.readableBytes)
                partner?.context?.write(wrapOutboundOut(buffer.readSlice(length: n)!), promise: nil)
                bodyLeft -= n
                continue
            }
            var head: ByteBuffer
            if var held = partial {
                held.writeBuffer(&buffer)
                head = held
                partial = nil
            } else {
                head = buffer
                buffer.moveReaderIndex(forwardBy: buffer.readableBytes)
            }
            guard let end = Self.headEnd(head) else {
                guard head.readableBytes <= Self.maxHead else { return fail(context) }
                partial = head
                return
            }
            guard let rewritten = rewrite(head.readSlice(length: end)!, allocator: context.channel.allocator) else {
                return fail(context)
            }
            partner?.context?.write(wrapOutboundOut(rewritten), promise: nil)
            // What followed the head goes on in this loop (body, or the next message).
            if head.readableBytes > 0 {
                if buffer.readableBytes > 0 {
                    head.writeBuffer(&buffer)
                }
                buffer = head
            }
        }
    }

    private func fail(_ context: ChannelHandlerContext) {
        context.close(promise: nil)
        partner?.context?.close(promise: nil)
    }

    /// The length of the head (through its blank line), or nil when it has not all come.
    static func headEnd(_ buffer: ByteBuffer) -> Int? {
        buffer.withUnsafeReadableBytes { bytes -> Int? in
            guard bytes.count >= 4, let base = bytes.baseAddress else { return nil }
            var from = 3
            while from < bytes.count {
                guard let found = memchr(base + from, 10, bytes.count - from) else { return nil }
                let at = base.distance(to: UnsafeRawPointer(found))
                if at >= 3, bytes[at - 1] == 13, bytes[at - 2] == 10, bytes[at - 3] == 13 { return at + 1 }
                from = at + 1
            }
            return nil
        }
    }

    static let dropped: [[UInt8]] = [
        "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host",
        "content-length", "x-content-type-options", "content-security-policy", "x-frame-options",
        "cross-origin-resource-policy",
    ].map { Array($0.utf8) }
    static let security = ByteBuffer(
        string:
            "X-Content-Type-Options: nosniff\r\nContent-Security-Policy: default-src 'none'; frame-ancestors 'none'\r\nX-Frame-Options: DENY\r\nCross-Origin-Resource-Policy: same-origin\r\nX-LMX-Via: lan\r\n"
    )

    /// The head written anew; nil for one this codec does not take.
    private func rewrite(_ head: ByteBuffer, allocator: ByteBufferAllocator) -> ByteBuffer? {
        var out = allocator.buffer(capacity: head.readableBytes + 256)
        let ok = head.withUnsafeReadableBytes { bytes -> Bool in
            let count = bytes.count - 2  // the last line break of the blank line
            var lineStart = 0
            var first = true
            var length: Int? = nil
            var index = 0
            while index < count {
                guard bytes[index] == UInt8(ascii: "\r") else {
                    index += 1
                    continue
                }
                guard index + 1 < bytes.count, bytes[index + 1] == UInt8(ascii: "\n") else { return false }
                let line = UnsafeRawBufferPointer(rebasing: bytes[lineStart..<index])
                if first {
                    first = false
                    if readsRequests {
                        // METHOD SP TARGET SP HTTP/1.x: the version written as 1.1.
                        guard line.count > 9, line[line.count - 9] == UInt8(ascii: " ") else { return false }
                        out.writeBytes(UnsafeRawBufferPointer(rebasing: line[0..<(line.count - 8)]))
                        out.writeStaticString("HTTP/1.1\r\nHost: ")
                        out.writeString(authority)
                        out.writeStaticString("\r\n")
                    } else {
                        guard line.count >= 12, line[8] == UInt8(ascii: " ") else { return false }
                        out.writeStaticString("HTTP/1.1")
                        out.writeBytes(UnsafeRawBufferPointer(rebasing: line[8...]))
                        out.writeStaticString("\r\n")
                    }
                } else {
                    guard let colon = line.firstIndex(of: UInt8(ascii: ":")), colon > 0 else { return false }
                    let name = UnsafeRawBufferPointer(rebasing: line[0..<colon])
                    if Self.same(name, "content-length") {
                        var value = 0
                        var digits = 0
                        for byte in line[(colon + 1)...] where byte != UInt8(ascii: " ") && byte != 9 {
                            guard (48...57).contains(byte), digits < 15 else { return false }
                            value = value * 10 + Int(byte - 48)
                            digits += 1
                        }
                        guard digits > 0, length == nil || length == value else { return false }
                        length = value
                    } else if Self.same(name, "transfer-encoding") {
                        return false
                    }
                    if !Self.dropped.contains(where: { Self.same(name, $0) }) {
                        out.writeBytes(line)
                        out.writeStaticString("\r\n")
                    }
                }
                index += 2
                lineStart = index
            }
            if !readsRequests { out.writeImmutableBuffer(Self.security) }
            let body = length ?? 0
            if body > 0 || !readsRequests {
                out.writeStaticString("Content-Length: ")
                out.writeString(String(body))
                out.writeStaticString("\r\n")
            }
            out.writeStaticString("\r\n")
            bodyLeft = body
            return true
        }
        return ok ? out : nil
    }

    static func same(_ name: UnsafeRawBufferPointer, _ lower: some Collection<UInt8>) -> Bool {
        guard name.count == lower.count else { return false }
        return zip(name, lower).allSatisfy { $0 | 0x20 == $1 | 0x20 }
    }

    static func same(_ name: UnsafeRawBufferPointer, _ lower: StaticString) -> Bool {
        lower.withUTF8Buffer { same(name, $0) }
    }

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
    print("usage: lmx-codec-ceiling LISTEN_PORT UPSTREAM_PORT")
    exit(64)
}
let group = MultiThreadedEventLoopGroup(numberOfThreads: System.coreCount)
let authority = "127.0.0.1:\(upstreamPort)"
let server = try ServerBootstrap(group: group)
    .serverChannelOption(.backlog, value: 256)
    .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
    .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
    .childChannelInitializer { client in
        let downstream = Side(readsRequests: true, authority: authority)
        let upstream = Side(readsRequests: false, authority: authority)
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
