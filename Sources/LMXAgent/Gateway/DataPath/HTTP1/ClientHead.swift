import LMXCore
import NIOCore
import NIOHTTP1

/// A client's request head as the data path reads it (``ClientRequestParser``): its bytes as read
/// and where each header is in them. No `HTTPRequestHead` is made for it, and no `String` of a
/// header but of those the rules read (``first(_:)``).
struct ClientHead {
    var method: HTTPMethod
    /// The origin-form target, as sent.
    var uri: String
    /// `HTTP/1.<minor>` (0 or 1).
    var minor: Int
    /// The head's bytes as read, through its blank line.
    var raw: ByteBuffer
    /// Each header line's name and value (without the spaces around it), as offsets into `raw`'s
    /// readable bytes, in the order sent.
    var fields: [Field]
    /// Which of the headers the rules look up (``knownBit(_:)``) are present: a look-up of one
    /// that is absent (most of them, on most requests) reads no header.
    var known: UInt16
    /// The connection stays open after the answer (HTTP/1.1 unless `Connection: close`; HTTP/1.0
    /// only with `Connection: keep-alive`), as llhttp reads it.
    var keepAlive: Bool
    /// More than one `Host` line came (RFC 9112 §3.2: refused with 400; the policy would read
    /// only the first).
    var hostTwice = false

    /// The headers the data path and its rules look up, each a bit of ``known`` (0: another).
    static func knownBit(_ name: UnsafeRawBufferPointer) -> UInt16 {
        func bit(_ header: Known) -> UInt16 { HTTPSyntax.equalsLowercased(name, header.lower) ? header.rawValue : 0 }
        return switch name.count {
        case 4: bit(.host)
        case 6: bit(.origin) | bit(.expect) | bit(.cookie)
        case 7: bit(.upgrade)
        case 9: bit(.xAPIKey)
        case 10: bit(.connection) | bit(.userAgent)
        case 13: bit(.authorization)
        case 14: bit(.secFetchSite)
        default: 0
        }
    }

    /// The headers the data path and its rules look up by name (each a bit of ``known``, the
    /// bit ``knownBit(_:)`` gives its name): whether one is present is told by its bit alone.
    enum Known: UInt16, CaseIterable {
        case host = 0x1, origin = 0x2, expect = 0x4, cookie = 0x8, upgrade = 0x10, xAPIKey = 0x20
        case connection = 0x40, userAgent = 0x80, authorization = 0x100, secFetchSite = 0x200

        /// Its name, lower case.
        var lower: StaticString {
            switch self {
            case .host: "host"
            case .origin: "origin"
            case .expect: "expect"
            case .cookie: "cookie"
            case .upgrade: "upgrade"
            case .xAPIKey: "x-api-key"
            case .connection: "connection"
            case .userAgent: "user-agent"
            case .authorization: "authorization"
            case .secFetchSite: "sec-fetch-site"
            }
        }
    }

    /// Whether a `header` is present (read from ``known``: no header line is read).
    func contains(_ header: Known) -> Bool { known & header.rawValue != 0 }

    /// Whether any header of `bits` (``Known`` values, ORed) is present.
    func contains(anyOf bits: UInt16) -> Bool { known & bits != 0 }

    /// The bits of known headers named `names` (lower case); nil when one is not a known one.
    static func bits(of names: Set<String>) -> UInt16? {
        var bits: UInt16 = 0
        for name in names {
            guard let header = Known.allCases.first(where: { String(describing: $0.lower) == name }) else {
                return nil
            }
            bits |= header.rawValue
        }
        return bits
    }

    /// The first value of `header`, ignoring case (nil at once when its bit says it is absent).
    func first(_ header: Known) -> String? {
        guard contains(header) else { return nil }
        return header.lower.withUTF8Buffer { first(lower: UnsafeRawBufferPointer($0)) }
    }

    /// Whether a header named `lower` may be present: false only when it is a known one that is absent.
    private func mayHave(_ lower: UnsafeRawBufferPointer) -> Bool {
        let bit = Self.knownBit(lower)
        return bit == 0 || known & bit != 0
    }

    struct Field {
        var name: Range<Int>
        var value: Range<Int>
    }

    /// The header lines as `String`s, in order.
    var headers: [(name: String, value: String)] {
        raw.withUnsafeReadableBytes { bytes in
            fields.map { (Self.text(bytes, $0.name), Self.text(bytes, $0.value)) }
        }
    }

    /// The first value of header `name` (lower case), ignoring case.
    func first(_ name: StaticString) -> String? {
        name.withUTF8Buffer { first(lower: UnsafeRawBufferPointer($0)) }
    }

    /// The first value of header `name` (lower case), ignoring case.
    func first(_ name: String) -> String? {
        var name = name
        return name.withUTF8 { first(lower: UnsafeRawBufferPointer($0)) }
    }

    /// Whether header `name` (lower case) is present, ignoring case.
    func contains(_ name: StaticString) -> Bool {
        name.withUTF8Buffer { contains(lower: UnsafeRawBufferPointer($0)) }
    }

    /// Whether header `name` (lower case) is present, ignoring case.
    func contains(_ name: String) -> Bool {
        var name = name
        return name.withUTF8 { contains(lower: UnsafeRawBufferPointer($0)) }
    }

    private func contains(lower: UnsafeRawBufferPointer) -> Bool {
        guard mayHave(lower) else { return false }
        return raw.withUnsafeReadableBytes { bytes in fields.contains { Self.named(bytes, $0, lower) } }
    }

    /// The headers named `name` (lower case), as `String`s.
    func all(_ name: StaticString) -> [(name: String, value: String)] {
        name.withUTF8Buffer { lower in
            guard mayHave(UnsafeRawBufferPointer(lower)) else { return [] }
            return raw.withUnsafeReadableBytes { bytes in
                fields.filter { Self.named(bytes, $0, UnsafeRawBufferPointer(lower)) }.map {
                    (Self.text(bytes, $0.name), Self.text(bytes, $0.value))
                }
            }
        }
    }

    private func first(lower: UnsafeRawBufferPointer) -> String? {
        guard mayHave(lower) else { return nil }
        return raw.withUnsafeReadableBytes { bytes in
            for field in fields where Self.named(bytes, field, lower) { return Self.text(bytes, field.value) }
            return nil
        }
    }

    private static func named(_ bytes: UnsafeRawBufferPointer, _ field: Field, _ lower: UnsafeRawBufferPointer) -> Bool
    {
        guard field.name.count == lower.count else { return false }
        var index = field.name.lowerBound
        for expected in lower {
            let byte = bytes[index]
            if (byte >= 0x41 && byte <= 0x5A ? byte | 0x20 : byte) != expected { return false }
            index += 1
        }
        return true
    }

    private static func text(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> String {
        String(decoding: UnsafeRawBufferPointer(rebasing: bytes[range]), as: UTF8.self)
    }
}

/// The first handler of a gateway connection: reads clients' requests (``ClientRequestParser``)
/// and hands their parts straight to the data path's handler, past SwiftNIO's decoder; bytes
/// the parser leaves to llhttp, and requests the data path hands to the general path, go to that
/// decoder as bytes (``toLLHTTP(_:)``), which reads them as it always did.
final class ClientFront: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private var parser = ClientRequestParser()
    /// Its context: where the data path's answers are written as bytes (added before the data
    /// path's handler, which takes it from here rather than searching the pipeline for it).
    private(set) var context: ChannelHandlerContext?
    var handler: GatewayConnectionHandler?
    /// Bytes read from the client so far (the handler's stall check).
    private(set) var bytesRead = 0
    /// The connection's receive buffers are limited (``GatewayChildChannel/limitReceiveBuffers(of:)``).
    private var receiveLimited = false

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        handler = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let bytes = unwrapInboundIn(data)
        bytesRead &+= bytes.readableBytes
        if !receiveLimited, bytes.readableBytes >= GatewayChildChannel.initialReceiveBuffer {
            // A read filled the first buffer: from here the buffers would grow (to SwiftNIO's
            // 64 KiB, four a wake-up); they are limited now, before the next read.
            receiveLimited = true
            GatewayChildChannel.limitReceiveBuffers(of: context.channel)
        }
        guard let handler else {
            context.fireChannelRead(data)
            return
        }
        if handler.lingering {
            // Closing (``GatewayConnectionHandler/lingerThenClose()``): dropped unread.
            return
        }
        handler.readAsked = false
        if var earlier = unread {
            // (Only when a read was already under way as the handler stopped taking parts.)
            unread = nil
            var more = bytes
            earlier.writeBuffer(&more)
            parse(earlier, for: handler)
        } else {
            parse(bytes, for: handler)
        }
    }

    /// Bytes read from the client that the parser has not read yet: the handler holds a request
    /// parsed ahead of the one it is answering, and takes the next when it gets to it
    /// (``readHeld()``). At most what one read brought.
    private var unread: ByteBuffer?

    /// The connection closes (``GatewayConnectionHandler/lingerThenClose()``): bytes read and not
    /// parsed are let go of.
    func dropUnread() { unread = nil }
    private var parsing = false

    /// Whether bytes wait to be parsed (reads from the client wait meanwhile).
    var holdsUnread: Bool { unread != nil }

    /// The storage the bytes waiting for either reader hold (``GatewayConnectionHandler/bytesHeld``):
    /// a read's whole buffer, not only its bytes left to parse.
    var bytesWaiting: Int { (unread?.storageCapacity ?? 0) + (forLLHTTP?.storageCapacity ?? 0) }

    private func parse(_ bytes: ByteBuffer, for handler: GatewayConnectionHandler) {
        parsing = true
        defer { parsing = false }
        // (Moved out and back: an access to the property spanning the read would be checked at
        // run time.)
        var parser = ClientRequestParser()
        swap(&parser, &self.parser)
        unread = parser.read(bytes, emit: { handler.receive($0) }, pause: { handler.queueFull })
        swap(&parser, &self.parser)
        // (A part read now may have closed the connection: nothing more of it is parsed.)
        if handler.lingering { unread = nil }
    }

    /// The handler took what it held: the bytes waiting are parsed, as far as it takes them.
    /// (Not while a parse is under way: that parse goes on by itself.)
    func readHeld() {
        guard !parsing, let handler, let bytes = unread else { return }
        unread = nil
        parse(bytes, for: handler)
    }

    /// Bytes for llhttp (SwiftNIO's HTTP/1 decoder, behind this handler once the general path is set up).
    func toLLHTTP(_ bytes: ByteBuffer) {
        context?.fireChannelRead(wrapInboundOut(bytes))
    }

    /// The connection's bytes that llhttp reads from here on (the rest of a connection whose
    /// head this reader left to it), held and given to it a slice at a time while the handler
    /// takes more of what it parses (``GatewayConnectionHandler/llhttpQueueFull``): llhttp parses
    /// all it is given at once. At most one read's bytes wait here; reads wait meanwhile.
    private var forLLHTTP: ByteBuffer?
    private var feeding = false
    var holdsForLLHTTP: Bool { forLLHTTP != nil }
    /// The bytes llhttp is given at a time: a slice of pipelined requests parses into at most
    /// about 30 heads held by the handler (``GatewayConnectionHandler/llhttpQueue``).
    static let llhttpSlice = 512

    /// Adds `bytes` (if any) to those held for llhttp and gives it slices while the handler takes them.
    func feedLLHTTP(_ bytes: ByteBuffer?) {
        if var bytes {
            if var held = forLLHTTP {
                // (Into a buffer of their size: the held read's storage, most of it given to
                // llhttp already, is not kept growing.)
                forLLHTTP = nil
                var merged = ByteBufferAllocator().buffer(capacity: held.readableBytes + bytes.readableBytes)
                merged.writeBuffer(&held)
                merged.writeBuffer(&bytes)
                forLLHTTP = merged
            } else if bytes.readableBytes > 0 {
                forLLHTTP = bytes
            }
        }
        guard !feeding else { return }
        feeding = true
        defer { feeding = false }
        while var held = forLLHTTP, context != nil, handler?.llhttpQueueFull != true {
            let slice = held.readSlice(length: min(held.readableBytes, Self.llhttpSlice))!
            forLLHTTP = held.readableBytes > 0 ? held : nil
            toLLHTTP(slice)
        }
        // What is left waits in a buffer of its size once most of the read's storage is given to
        // llhttp (each copy at most half the last: the copies together at most the read's bytes).
        if let held = forLLHTTP, held.storageCapacity > 2 * held.readableBytes + Self.compactAbove {
            var rest = ByteBufferAllocator().buffer(capacity: held.readableBytes)
            rest.writeImmutableBuffer(held)
            forLLHTTP = rest
        }
    }
    /// Storage left unused in the bytes held for llhttp, at most, beyond as much as they hold.
    static let compactAbove = 4096
}
