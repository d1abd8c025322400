import LMXCore
import NIOCore
import NIOHTTP1

/// Clients' requests as the data path reads them: a strict subset of HTTP/1.1, read from the
/// bytes in one pass, and everything else left to llhttp (SwiftNIO's decoder, behind).
///
/// A request is read here only when nobody could read it differently: a request line of a
/// common method, an origin-form target of visible ASCII, `HTTP/1.1` or `HTTP/1.0`; header lines
/// of a token, a colon and a value of visible ASCII, spaces and tabs, each ending in CRLF; its
/// body framed by one `Content-Length` of digits, or absent. Anything else — `Transfer-Encoding`,
/// an upgrade, a bare CR or LF, a folded line, bytes past ASCII, a head past 16 KiB, more than
/// 100 headers — and the connection's bytes from that request on go to llhttp, which reads (or
/// refuses) them as it always did: this reader never accepts what llhttp would refuse or read
/// otherwise (`ClientCodecTests` holds it to that against llhttp on generated and mutated
/// requests), so the two can never disagree on where a request ends.
///
/// Each request's head comes with its bytes as read (`raw`): a request handed to the general path
/// is given to llhttp as those bytes and its body's, and read there afresh.
struct ClientRequestParser {
    enum Part {
        /// A head (with its bytes as read, ``ClientHead/raw``) and its body's length (0: none).
        case head(ClientHead, length: Int)
        case body(ByteBuffer)
        case end
        /// Bytes not read here: llhttp reads them, and every byte after them.
        case other(ByteBuffer)
    }

    private enum State {
        case head
        case body(remaining: Int)
        /// llhttp reads the rest of the connection.
        case other
        /// The last request said the connection closes after its answer: nothing more is read.
        case closed
    }

    /// A head is read here only up to this length (llhttp takes up to 80 KiB).
    static let maxHead = 16 << 10
    static let maxHeaders = 100

    private var state = State.head
    /// The start of a head not yet whole.
    private var held: ByteBuffer?

    /// Reads `bytes`, handing each part to `emit` as it is whole, until `pause` says to stop
    /// (asked before each part): then returns the bytes not read yet, to be read later (nil when
    /// all were read). A connection's pipelined requests are read one at a time this way, as the
    /// gateway gets to them, not all at once into memory.
    @discardableResult
    mutating func read(_ bytes: ByteBuffer, emit: (Part) -> Void, pause: () -> Bool = { false }) -> ByteBuffer? {
        var input = bytes
        if var earlier = held {
            held = nil
            earlier.writeBuffer(&input)
            input = earlier
        }
        while input.readableBytes > 0 {
            if pause() { return input }
            switch state {
            case .other:
                emit(.other(input))
                return nil
            case .closed:
                return nil
            case .body(let remaining):
                let n = min(remaining, input.readableBytes)
                emit(.body(input.readSlice(length: n)!))
                if n == remaining {
                    ended(emit)
                } else {
                    state = .body(remaining: remaining - n)
                }
            case .head:
                switch Self.readHead(input) {
                case .incomplete:
                    if input.readableBytes > Self.maxHead {
                        state = .other
                        continue
                    }
                    held = input
                    return nil
                case .other:
                    state = .other
                case .request(var request, let headLength):
                    request.head.raw = input.readSlice(length: headLength)!
                    // Nothing after a request that closes the connection is read (llhttp refuses
                    // it; the connection closes once this one is answered).
                    closesAfter = !request.head.keepAlive
                    emit(.head(request.head, length: request.length))
                    if request.length > 0 {
                        state = .body(remaining: request.length)
                    } else {
                        ended(emit)
                    }
                }
            }
        }
        return nil
    }

    private var closesAfter = false

    private mutating func ended(_ emit: (Part) -> Void) {
        state = closesAfter ? .closed : .head
        emit(.end)
    }

    enum HeadRead {
        /// The head has not all come (nothing in it so far is refused).
        case incomplete
        /// Not a head read here: llhttp reads it.
        case other
        /// A whole head (its `raw` bytes not yet set: the first `headLength` bytes of the input).
        case request(Request, headLength: Int)
    }

    struct Request {
        var head: ClientHead
        var length: Int
    }

    /// The head at the start of `buffer`, read in one pass: each line is read as its end is
    /// found, and the head is refused (`.other`) as soon as a line is not one read here — a
    /// first byte that is no method's, a bare CR or LF, a request line or header line not read
    /// here — or it is longer than ``maxHead``, without waiting for the rest of it (llhttp reads
    /// the same bytes, from the same start, whenever they come).
    static func readHead(_ buffer: ByteBuffer) -> HeadRead {
        buffer.withUnsafeReadableBytes { bytes -> HeadRead in
            let count = bytes.count
            guard count > 0 else { return .incomplete }
            guard (0x41...0x5A).contains(bytes[0]) else { return .other }
            var fields: [ClientHead.Field] = []
            var known: UInt16 = 0
            var length: Int?
            // What `Connection` says, as llhttp reads it (SwiftNIO's `isKeepAlive` of a head it
            // decoded): HTTP/1.1 closes with a `close` token, HTTP/1.0 keeps only with `keep-alive`.
            var connectionClose = false
            var connectionKeepAlive = false
            // The names the `Connection` headers list (as ``GatewayPolicy/connectionListed(_:)``
            // counts them): past its bound, llhttp reads the request and the general path refuses it.
            var connectionNames = 0
            // The request line: its end (any byte but a bare LF before the CRLF; read after).
            var index = 0
            requestLine: while index < count {
                if count - index >= 8 {
                    let word = ByteWord.word(bytes, at: index)
                    let marks = ByteWord.bytes(equalTo: 0x0D, in: word) | ByteWord.bytes(equalTo: 0x0A, in: word)
                    if marks == 0 {
                        index += 8
                        continue
                    }
                    index += ByteWord.firstMarked(marks)
                }
                if bytes[index] == 0x0D { break requestLine }
                if bytes[index] == 0x0A { return .other }
                index += 1
            }
            guard index + 1 < count else { return .incomplete }  // (past maxHead: the caller's `.other`)
            guard bytes[index + 1] == 0x0A,
                let (method, target, minor) = Self.requestLine(UnsafeRawBufferPointer(rebasing: bytes[0..<index]))
            else { return .other }
            index += 2
            fields.reserveCapacity(16)
            while true {
                // A header line, or the blank line; the name is read (a token) up to its colon,
                // then the value (visible ASCII, spaces and tabs) up to the line's CRLF.
                let start = index
                guard index < count else { return .incomplete }
                if bytes[index] == 0x0D {
                    guard index + 1 < count else { return .incomplete }
                    guard bytes[index + 1] == 0x0A else { return .other }
                    break
                }
                guard fields.count < maxHeaders else { return .other }
                name: while index < count {
                    // Letters, digits and dashes eight at a time; any other byte by itself.
                    if count - index >= 8 {
                        let run = ByteWord.firstUnmarked(ByteWord.nameBytes(in: ByteWord.word(bytes, at: index)))
                        index += run
                        if run == 8 { continue }
                    }
                    if bytes[index] == UInt8(ascii: ":") { break name }
                    guard HTTPSyntax.isTokenByte(bytes[index]) else { return .other }
                    index += 1
                }
                guard index < count else { return .incomplete }
                guard index > start else { return .other }  // no name
                let colon = index
                index += 1
                var valueStart = -1  // the first byte that is not a space or tab
                var valueEnd = index  // after the last byte that is not a space or tab
                var tab = false
                value: while index < count {
                    // Past a word's visible bytes at once, to the first that is not (a space, a
                    // tab, the line's end, or one refused), read by itself.
                    if count - index >= 8 {
                        let marks = ByteWord.invisibleBytes(in: ByteWord.word(bytes, at: index))
                        let visible = ByteWord.firstMarked(marks)
                        if visible > 0 {
                            if valueStart < 0 { valueStart = index }
                            index += visible
                            valueEnd = index
                            if visible == 8 { continue }
                        }
                    }
                    let byte = bytes[index]
                    if byte == 0x0D { break value }
                    if byte == 0x20 || byte == 0x09 {
                        if byte == 0x09 { tab = true }
                    } else {
                        guard byte > 0x20, byte < 0x7F else { return .other }
                        if valueStart < 0 { valueStart = index }
                        valueEnd = index + 1
                    }
                    index += 1
                }
                guard index + 1 < count else { return .incomplete }
                guard bytes[index + 1] == 0x0A else { return .other }
                if valueStart < 0 { valueStart = valueEnd }
                let lineEnd = index
                index += 2
                guard index <= maxHead else { return .other }
                let name = UnsafeRawBufferPointer(rebasing: bytes[start..<colon])
                let value = bytes[valueStart..<valueEnd]
                switch name.count {
                case 14 where HTTPSyntax.equalsLowercased(name, "content-length"):
                    // One, digits only, nothing after them (llhttp refuses two even when equal,
                    // and trailing spaces).
                    guard length == nil, !value.isEmpty, value.count <= 15, valueEnd == lineEnd,
                        value.allSatisfy({ (0x30...0x39).contains($0) })
                    else { return .other }
                    length = value.reduce(0) { $0 * 10 + Int($1 - 0x30) }
                case 17 where HTTPSyntax.equalsLowercased(name, "transfer-encoding"):
                    return .other
                case 7 where HTTPSyntax.equalsLowercased(name, "upgrade"):
                    return .other
                case 10 where HTTPSyntax.equalsLowercased(name, "connection"):
                    // (llhttp reads a tab anywhere on the line otherwise than a space: left to llhttp.)
                    let valueBytes = UnsafeRawBufferPointer(rebasing: value)
                    if tab || containsLowercased(valueBytes[...], "upgrade") { return .other }
                    connectionNames += Self.connectionTokens(
                        valueBytes[...], close: &connectionClose, keepAlive: &connectionKeepAlive)
                    guard connectionNames <= GatewayPolicy.maxConnectionListed else { return .other }
                default:
                    break
                }
                known |= ClientHead.knownBit(name)
                // Where the name and value are in the head (no `String` is made of them here).
                fields.append(ClientHead.Field(name: start..<colon, value: valueStart..<valueEnd))
            }
            guard index + 2 <= maxHead else { return .other }
            let keepAlive = minor == 1 ? !connectionClose : connectionKeepAlive
            return .request(
                Request(
                    head: ClientHead(
                        method: method, uri: target, minor: minor, raw: ByteBuffer(), fields: fields, known: known,
                        keepAlive: keepAlive),
                    length: length ?? 0),
                headLength: index + 2)
        }
    }

    /// `METHOD SP origin-form SP HTTP/1.x`, of the methods clients of the gateway use.
    private static func requestLine(_ line: UnsafeRawBufferPointer) -> (HTTPMethod, String, Int)? {
        // At least one byte of target between the spaces (the method is at most 7 bytes).
        var space = 0
        while space < min(line.count, 8), line[space] != 0x20 { space += 1 }
        guard space < line.count, line[space] == 0x20, line.count >= space + 11 else { return nil }
        let method: HTTPMethod
        switch space {
        case 3 where matches(line, "GET"): method = .GET
        case 3 where matches(line, "PUT"): method = .PUT
        case 4 where matches(line, "POST"): method = .POST
        case 4 where matches(line, "HEAD"): method = .HEAD
        case 5 where matches(line, "PATCH"): method = .PATCH
        case 6 where matches(line, "DELETE"): method = .DELETE
        case 7 where matches(line, "OPTIONS"): method = .OPTIONS
        default: return nil
        }
        // ` HTTP/1.0` or ` HTTP/1.1` at the end.
        let version = line.count - 9
        let minor = line[line.count - 1]
        guard line[version] == 0x20, matches(UnsafeRawBufferPointer(rebasing: line[(version + 1)...]), "HTTP/1."),
            minor == UInt8(ascii: "1") || minor == UInt8(ascii: "0")
        else { return nil }
        // An origin-form target of visible ASCII.
        guard line[space + 1] == UInt8(ascii: "/") else { return nil }
        for index in (space + 1)..<version where line[index] < 0x21 || line[index] > 0x7E { return nil }
        let target = UnsafeRawBufferPointer(rebasing: line[(space + 1)..<version])
        return (method, String(decoding: target, as: UTF8.self), Int(minor - 0x30))
    }

    /// `bytes` start with `text`.
    private static func matches(_ bytes: UnsafeRawBufferPointer, _ text: StaticString) -> Bool {
        text.withUTF8Buffer { text in
            guard bytes.count >= text.count else { return false }
            for index in 0..<text.count where bytes[index] != text[index] { return false }
            return true
        }
    }

    /// Reads a `Connection` value's comma-separated tokens (spaces around them trimmed, case
    /// ignored) for `close` and `keep-alive`. Returns how many names it lists, as
    /// ``GatewayPolicy/addConnectionListed(name:value:to:)`` counts them (none for a value that
    /// is `close` or `keep-alive` alone).
    private static func connectionTokens(
        _ value: Slice<UnsafeRawBufferPointer>, close: inout Bool, keepAlive: inout Bool
    ) -> Int {
        var names = 0
        var tokens = 0
        var usual = false  // the last token was `close` or `keep-alive`
        var start = value.startIndex
        while start <= value.endIndex {
            let end = value[start...].firstIndex(of: UInt8(ascii: ",")) ?? value.endIndex
            var from = start
            var to = end
            while from < to, value[from] == 0x20 { from += 1 }
            while to > from, value[to - 1] == 0x20 { to -= 1 }
            let token = value[from..<to]
            if !token.isEmpty { names += 1 }
            tokens += 1
            usual = false
            if token.count == 5, zip(token, "close".utf8).allSatisfy({ ($0 | 0x20) == $1 }) {
                close = true
                usual = true
            }
            if token.count == 10, zip(token, "keep-alive".utf8).allSatisfy({ ($0 | 0x20) == $1 }) {
                keepAlive = true
                usual = true
            }
            start = end + 1
        }
        // A value that is `close` or `keep-alive` alone lists no other header.
        return tokens == 1 && usual ? 0 : names
    }

    private static func containsLowercased(_ bytes: Slice<UnsafeRawBufferPointer>, _ lower: StaticString) -> Bool {
        lower.withUTF8Buffer { expected in
            guard bytes.count >= expected.count else { return false }
            var start = bytes.startIndex
            while start + expected.count <= bytes.endIndex {
                if zip(bytes[start..<(start + expected.count)], expected).allSatisfy({ ($0 | 0x20) == $1 }) {
                    return true
                }
                start += 1
            }
            return false
        }
    }
}

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
    private var parsing = false

    /// Whether bytes wait to be parsed (reads from the client wait meanwhile).
    var holdsUnread: Bool { unread != nil }

    private func parse(_ bytes: ByteBuffer, for handler: GatewayConnectionHandler) {
        parsing = true
        defer { parsing = false }
        // (Moved out and back: an access to the property spanning the read would be checked at
        // run time.)
        var parser = ClientRequestParser()
        swap(&parser, &self.parser)
        unread = parser.read(bytes, emit: { handler.receive($0) }, pause: { handler.queueFull })
        swap(&parser, &self.parser)
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
}
