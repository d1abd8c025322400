import LMXCore
import NIOCore
import NIOHTTP1

/// HTTP/1.1 on a connection to a server, of the data path's own: requests written straight into
/// bytes, answers read from the bytes as they come — the head into an ``HTTPResponseHead``, the
/// body passed on as the slices read (a chunked body's framing taken off), never copied. It
/// replaces SwiftNIO's HTTP/1 client handlers there: their encoder, llhttp and the parts passed
/// through the pipeline cost more than the rest of a request's work on that connection
/// (`Benchmarks/ceiling`: a relay that reads and writes heads itself runs at nginx's rate).
///
/// Only servers' answers are read here, never clients' requests (those stay with llhttp). An
/// answer is read strictly (RFC 9112): what is not understood fails the connection, never
/// guesses. A connection whose answer did not end exactly where its bytes did, or whose framing
/// was anything but `Content-Length` or chunked, is not reused (``reusable``): no byte of one
/// answer can be taken as the start of another.
struct UpstreamResponseParser {
    enum Part {
        case head(UpstreamAnswerHead)
        case body(ByteBuffer)
        case end
    }

    struct Malformed: Error, CustomStringConvertible {
        let reason: String
        var description: String { "the server's answer is not valid HTTP/1.1: \(reason)" }
    }

    private enum State {
        case head
        case fixed(remaining: Int)
        case chunkSize
        case chunkData(remaining: Int)
        case chunkDataEnd
        case trailers(read: Int)
        case untilClose
        /// The answer ended; nothing more is expected until the next request.
        case idle
        case failed
    }

    /// A head (status line and headers) is at most this long, as llhttp's default.
    static let maxHead = 80 << 10
    /// A chunk-size line (with its extensions) is at most this long.
    static let maxChunkLine = 4 << 10

    private var state = State.idle
    /// Bytes read but not yet taken (a head or a chunk line not yet whole).
    private var held: ByteBuffer?
    /// The request being answered is a HEAD: its answer has no body whatever it says.
    private var headRequest = false
    /// The connection may carry another request once this answer has ended.
    private(set) var reusable = true

    /// A request went: its answer is read next.
    mutating func expectAnswer(toHEAD: Bool) {
        guard case .idle = state else {
            state = .failed
            reusable = false
            return
        }
        headRequest = toHEAD
        state = .head
    }

    /// Whether an answer is being read (between a request and its answer's end).
    var inAnswer: Bool {
        switch state {
        case .idle, .failed: false
        default: true
        }
    }

    /// Reads `bytes`, handing each part of the answer to `emit` as it is whole.
    mutating func read(_ bytes: ByteBuffer, emit: (Part) -> Void) throws(Malformed) {
        var input = bytes
        if var earlier = held {
            held = nil
            earlier.writeBuffer(&input)
            input = earlier
        }
        do throws(Malformed) {
            while true {
                switch state {
                case .idle:
                    // Bytes nobody asked for: the connection is not reused.
                    if input.readableBytes > 0 { reusable = false }
                    return
                case .failed:
                    return
                case .head:
                    guard let length = Self.headLength(input) else {
                        if input.readableBytes > Self.maxHead { throw Malformed(reason: "a head longer than 80 KiB") }
                        if input.readableBytes > 0 { held = input }
                        return
                    }
                    guard length <= Self.maxHead else { throw Malformed(reason: "a head longer than 80 KiB") }
                    let head = input.readSlice(length: length)!
                    try startAnswer(head, more: input.readableBytes > 0, emit: emit)
                case .fixed(let remaining):
                    guard input.readableBytes > 0 else { return }
                    let n = min(remaining, input.readableBytes)
                    emit(.body(input.readSlice(length: n)!))
                    if n == remaining {
                        finish(more: input.readableBytes > 0, emit: emit)
                    } else {
                        state = .fixed(remaining: remaining - n)
                    }
                case .chunkSize:
                    guard let line = try Self.line(&input, limit: Self.maxChunkLine) else {
                        if input.readableBytes > 0 { held = input }
                        return
                    }
                    let size = try Self.chunkSize(line)
                    state = size == 0 ? .trailers(read: 0) : .chunkData(remaining: size)
                case .chunkData(let remaining):
                    guard input.readableBytes > 0 else { return }
                    let n = min(remaining, input.readableBytes)
                    emit(.body(input.readSlice(length: n)!))
                    state = n == remaining ? .chunkDataEnd : .chunkData(remaining: remaining - n)
                case .chunkDataEnd:
                    guard input.readableBytes >= 2 else {
                        if input.readableBytes > 0 { held = input }
                        return
                    }
                    guard input.readInteger(as: UInt16.self) == 0x0D0A else {
                        throw Malformed(reason: "a chunk not followed by CRLF")
                    }
                    state = .chunkSize
                case .trailers(let read):
                    guard let line = try Self.line(&input, limit: max(0, Self.maxHead - read)) else {
                        if input.readableBytes > 0 { held = input }
                        return
                    }
                    if line.readableBytes == 0 {
                        finish(more: input.readableBytes > 0, emit: emit)
                    } else {
                        // Read as a header line, then dropped (the client gets no trailers).
                        var ignored = Head()
                        try line.withUnsafeReadableBytes { bytes throws(Malformed) in
                            let control = bytes.contains { ($0 < 0x20 && $0 != 0x09) || $0 == 0x7F }
                            let colon = bytes.firstIndex(of: UInt8(ascii: ":")) ?? -1
                            try Self.headerLine(bytes, at: 0, colon: colon, control: control, into: &ignored)
                        }
                        state = .trailers(read: read + line.readableBytes + 2)
                    }
                case .untilClose:
                    if input.readableBytes > 0 { emit(.body(input)) }
                    return
                }
            }
        } catch {
            state = .failed
            reusable = false
            held = nil
            throw error
        }
    }

    /// The server closed the connection: true when that ends an answer read until then (false:
    /// the answer was cut, or none was asked for).
    mutating func closed() -> Bool {
        reusable = false
        guard case .untilClose = state else { return false }
        state = .idle
        return true
    }

    /// The answer ended; `more`: bytes came after it (the connection is then not reused, and
    /// says so before the end is handed on, as that is when the connection goes back to its pool).
    private mutating func finish(more: Bool, emit: (Part) -> Void) {
        if more { reusable = false }
        state = .idle
        emit(.end)
    }

    /// A whole head: parsed, emitted (an interim `1xx` answer is skipped), and the body's framing chosen.
    private mutating func startAnswer(_ head: ByteBuffer, more: Bool, emit: (Part) -> Void) throws(Malformed) {
        let parsed = try Self.parseHead(head)
        let code = parsed.status
        if (100..<200).contains(code) {
            // 101 would switch protocols: never asked for. HTTP/1.0 has no interim answers.
            guard code != 101 else { throw Malformed(reason: "101 Switching Protocols, never asked for") }
            guard parsed.version == 1 else { throw Malformed(reason: "an interim answer in HTTP/1.0") }
            state = .head  // the final answer follows
            return
        }
        if parsed.version != 1 || parsed.close { reusable = false }
        emit(
            .head(
                UpstreamAnswerHead(
                    minor: parsed.version, status: code, bytes: head, fields: parsed.fields, read: parsed.read)))
        if headRequest || code == 204 || code == 304 {
            return finish(more: more, emit: emit)
        }
        if parsed.chunked {
            state = .chunkSize
        } else if parsed.transferEncoded {
            // Another coding last: the body runs until the server closes.
            reusable = false
            state = .untilClose
        } else if let length = parsed.read.contentLength {
            if length == 0 { return finish(more: more, emit: emit) }
            state = .fixed(remaining: length)
        } else {
            reusable = false
            state = .untilClose
        }
    }

    struct Head {
        var version = 1
        var status = 0
        /// Where each header line's name and value are in the head's bytes.
        var fields: [UpstreamAnswerHead.Field] = []
        /// What the data path's rules read of the headers.
        var read = AnswerHeaders()
        var chunked = false
        var transferEncoded = false
        var close = false
    }

    /// The length of the head at the start of `buffer` (through its blank line), or nil when it
    /// has not all come.
    static func headLength(_ buffer: ByteBuffer) -> Int? {
        buffer.withUnsafeReadableBytes { bytes -> Int? in
            var index = 3
            while index < bytes.count {
                let byte = bytes[index]
                if byte == 0x0A {
                    if bytes[index - 1] == 0x0D, bytes[index - 2] == 0x0A, bytes[index - 3] == 0x0D { return index + 1 }
                    index += 1
                } else if byte == 0x0D || byte == 0x0A {
                    index += 1
                } else {
                    // Neither byte of a line break: the blank line cannot end before index + 4.
                    index += 4
                }
            }
            return nil
        }
    }

    /// A head: the status line and the header lines, strictly.
    static func parseHead(_ head: ByteBuffer) throws(Malformed) -> Head {
        try head.withUnsafeReadableBytes { bytes throws(Malformed) -> Head in
            var parsed = Head()
            parsed.fields.reserveCapacity(16)
            // Lines end with CRLF; the last two bytes are the blank line's.
            var start = 0
            var first = true
            let end = bytes.count - 2
            while start < end {
                // One pass over the line: its end, and whether it has a control character
                // (other than a tab) that a header line may not have.
                var index = start
                var control = false
                var colon = -1  // the line's first colon, found in the same pass
                line: while index < end {
                    // Past the bytes of a word that need no look (no control character, no DEL,
                    // no colon until the first is found) to the first that does.
                    if end - index >= 8 {
                        let word = ByteWord.word(bytes, at: index)
                        var marks = ByteWord.bytes(below: 0x20, in: word) | ByteWord.bytes(equalTo: 0x7F, in: word)
                        if colon < 0 { marks |= ByteWord.bytes(equalTo: UInt8(ascii: ":"), in: word) }
                        if marks == 0 {
                            index += 8
                            continue
                        }
                        index += ByteWord.firstMarked(marks)
                    }
                    let byte = bytes[index]
                    if byte == UInt8(ascii: ":"), colon < 0 { colon = index - start }
                    if byte < 0x20 || byte == 0x7F {
                        if byte == 0x0D { break line }
                        guard byte != 0x0A, byte != 0 else {
                            throw Malformed(reason: "a bare line feed or NUL in the head")
                        }
                        if byte != 0x09 { control = true }
                    }
                    index += 1
                }
                guard index + 1 < bytes.count, bytes[index + 1] == 0x0A else {
                    throw Malformed(reason: "a bare carriage return in the head")
                }
                let line = UnsafeRawBufferPointer(rebasing: bytes[start..<index])
                if first {
                    first = false
                    try statusLine(line, into: &parsed)
                } else {
                    try headerLine(line, at: start, colon: colon, control: control, into: &parsed)
                }
                start = index + 2
            }
            guard !first else { throw Malformed(reason: "no status line") }
            if parsed.transferEncoded, parsed.read.contentLength != nil {
                // Both: the framing a request smuggler relies on (RFC 9112 §6.3 allows reading the
                // coding; llhttp refuses it, and so does this).
                throw Malformed(reason: "both Transfer-Encoding and Content-Length")
            }
            return parsed
        }
    }

    /// `HTTP/1.` (48 54 54 50 2F 31 2E) as the low seven bytes of a word read by
    /// ``ByteWord/word(_:at:)`` (little-endian: the first byte lowest).
    private static let httpSlashOne: UInt64 = 0x002E_312F_5054_5448

    /// `HTTP/1.x SP 3DIGIT [SP reason]`.
    private static func statusLine(_ line: UnsafeRawBufferPointer, into parsed: inout Head) throws(Malformed) {
        // `HTTP/1.` compared as one word (a generic `starts(with:)` cost about 300 instructions).
        guard line.count >= 12, ByteWord.word(line, at: 0) & 0x00FF_FFFF_FFFF_FFFF == Self.httpSlashOne,
            line[8] == 0x20, line[7] == UInt8(ascii: "0") || line[7] == UInt8(ascii: "1")
        else { throw Malformed(reason: "a status line that is not HTTP/1.0 or HTTP/1.1") }
        parsed.version = Int(line[7] - UInt8(ascii: "0"))
        var status = 0
        for byte in line[9..<12] {
            guard (0x30...0x39).contains(byte) else { throw Malformed(reason: "a status code that is not 3 digits") }
            status = status * 10 + Int(byte - 0x30)
        }
        guard status >= 100, line.count == 12 || line[12] == 0x20 else {
            throw Malformed(reason: "a status code that is not 3 digits")
        }
        parsed.status = status
    }

    /// A header line (`offset`: where it starts in the head's bytes; `colon`: where its first
    /// colon is in it, -1 for none; `control`: it has a control character other than a tab).
    private static func headerLine(
        _ line: UnsafeRawBufferPointer, at offset: Int, colon: Int, control: Bool, into parsed: inout Head
    ) throws(Malformed) {
        guard colon > 0 else { throw Malformed(reason: "a header line without a name") }
        var index = 0
        while index < colon {
            // Letters, digits and dashes eight at a time; any other byte by itself.
            if colon - index >= 8 {
                let run = ByteWord.firstUnmarked(ByteWord.nameBytes(in: ByteWord.word(line, at: index)))
                index += run
                if run == 8 { continue }
            }
            // Folded lines, spaces before the colon: never framing anybody could disagree on.
            guard HTTPSyntax.isTokenByte(line[index]) else {
                throw Malformed(reason: "a header name that is not a token")
            }
            index += 1
        }
        var from = colon + 1
        var to = line.count
        while from < to, line[from] == 0x20 || line[from] == 0x09 { from += 1 }
        while to > from, line[to - 1] == 0x20 || line[to - 1] == 0x09 { to -= 1 }
        let nameBytes = UnsafeRawBufferPointer(rebasing: line[0..<colon])
        let valueBytes = UnsafeRawBufferPointer(rebasing: line[from..<to])
        // Not in the name (a token): in the value.
        if control { throw Malformed(reason: "a control character in a header value") }
        // The framing headers, by the name's length first (most headers are none of them). None
        // goes to the client as it came (hop-by-hop, or written anew: GatewayPolicy's rule).
        var framing = true
        switch colon {
        case 14 where HTTPSyntax.equalsLowercased(nameBytes, "content-length"):
            // One header, digits only: as strict as llhttp (which refuses even two that agree).
            guard parsed.read.contentLength == nil else { throw Malformed(reason: "more than one Content-Length") }
            guard to == line.count else { throw Malformed(reason: "a Content-Length with spaces after it") }
            var value = 0
            for byte in valueBytes {
                guard (0x30...0x39).contains(byte), value < 100_000_000_000_000 else {
                    throw Malformed(reason: "a Content-Length that is not a number")
                }
                value = value * 10 + Int(byte - 0x30)
            }
            guard !valueBytes.isEmpty else { throw Malformed(reason: "a Content-Length that is not a number") }
            parsed.read.contentLength = value
        case 17 where HTTPSyntax.equalsLowercased(nameBytes, "transfer-encoding"):
            parsed.transferEncoded = true
            // Chunked only when it is the last coding (what follows the last comma, trimmed).
            let lastComma = valueBytes.lastIndex(of: UInt8(ascii: ","))
            let last = valueBytes[(lastComma.map { $0 + 1 } ?? valueBytes.startIndex)...]
            parsed.chunked = HTTPSyntax.equalsLowercased(trimmed(last), "chunked")
        case 10 where HTTPSyntax.equalsLowercased(nameBytes, "connection"):
            // Each comma-separated item, trimmed, in place (no array of the items).
            var itemStart = valueBytes.startIndex
            for index in valueBytes.startIndex...valueBytes.endIndex
            where index == valueBytes.endIndex || valueBytes[index] == UInt8(ascii: ",") {
                if HTTPSyntax.equalsLowercased(trimmed(valueBytes[itemStart..<index]), "close") { parsed.close = true }
                itemStart = index + 1
            }
        default:
            framing = false
        }
        guard parsed.read.read(name: nameBytes, value: valueBytes) else {
            throw Malformed(
                reason: "a Connection header listing more than \(GatewayPolicy.maxConnectionListed) names")
        }
        parsed.fields.append(
            UpstreamAnswerHead.Field(
                name: offset..<offset + colon, value: offset + from..<offset + to,
                kept: !framing && GatewayPolicy.keepsDownstream(nameBytes: nameBytes, connectionListed: [])))
    }

    /// A line through its CRLF, taken from `input`; nil while it has not all come.
    private static func line(_ input: inout ByteBuffer, limit: Int) throws(Malformed) -> ByteBuffer? {
        let found = input.withUnsafeReadableBytes { bytes -> Int? in
            for index in 0..<min(bytes.count, limit + 2) where bytes[index] == 0x0A { return index }
            return nil
        }
        guard let newline = found else {
            if input.readableBytes >= limit + 2 { throw Malformed(reason: "a chunk or trailer line too long") }
            return nil
        }
        guard newline > 0, input.getInteger(at: input.readerIndex + newline - 1, as: UInt8.self) == 0x0D else {
            throw Malformed(reason: "a bare line feed in a chunked body")
        }
        let line = input.readSlice(length: newline - 1)!
        input.moveReaderIndex(forwardBy: 2)
        return line
    }

    /// `1*HEXDIG [ext]`: the size; extensions are ignored.
    static func chunkSize(_ line: ByteBuffer) throws(Malformed) -> Int {
        // Over the line's contiguous bytes (walking a `ByteBufferView` cost about 200
        // instructions a line).
        try line.withUnsafeReadableBytes { line throws(Malformed) -> Int in try chunkSize(line) }
    }

    private static func chunkSize(_ line: UnsafeRawBufferPointer) throws(Malformed) -> Int {
        var size = 0
        var digits = 0
        var rest = line[...]
        for byte in line {
            let value: Int
            switch byte {
            case 0x30...0x39: value = Int(byte - 0x30)
            case 0x41...0x46: value = Int(byte - 0x41 + 10)
            case 0x61...0x66: value = Int(byte - 0x61 + 10)
            default: value = -1
            }
            guard value >= 0 else { break }
            guard digits < 15 else { throw Malformed(reason: "a chunk size too large") }
            size = size * 16 + value
            digits += 1
            rest = rest.dropFirst()
        }
        guard digits > 0 else { throw Malformed(reason: "a chunk size that is not hexadecimal") }
        // Extensions, ignored, but read as RFC 9112 §7.1.1 writes them (llhttp refuses less):
        // `*( ";" token [ "=" ( token / quoted-string ) ] )`.
        var bytes = rest
        while let first = bytes.first {
            guard first == UInt8(ascii: ";") else { throw Malformed(reason: "a chunk size that is not hexadecimal") }
            bytes = bytes.dropFirst()
            let name = bytes.prefix { HTTPSyntax.isTokenByte($0) }
            guard !name.isEmpty else { throw Malformed(reason: "a chunk extension without a name") }
            bytes = bytes.dropFirst(name.count)
            guard bytes.first == UInt8(ascii: "=") else { continue }
            bytes = bytes.dropFirst()
            if bytes.first == UInt8(ascii: "\"") {
                bytes = bytes.dropFirst()
                var closed = false
                while let byte = bytes.first {
                    bytes = bytes.dropFirst()
                    if byte == UInt8(ascii: "\"") {
                        closed = true
                        break
                    }
                    if byte == UInt8(ascii: "\\") {
                        guard let escaped = bytes.first, escaped == 0x09 || (0x20...0x7E).contains(escaped) else {
                            throw Malformed(reason: "a chunk extension's quoted value")
                        }
                        bytes = bytes.dropFirst()
                    } else if !(byte == 0x09 || byte == 0x20 || (0x21...0x7E).contains(byte)) {
                        throw Malformed(reason: "a chunk extension's quoted value")
                    }
                }
                guard closed else { throw Malformed(reason: "a chunk extension's quoted value") }
            } else {
                let value = bytes.prefix { HTTPSyntax.isTokenByte($0) }
                guard !value.isEmpty else { throw Malformed(reason: "a chunk extension without a value") }
                bytes = bytes.dropFirst(value.count)
            }
        }
        return size
    }

    private static func trimmed(_ bytes: Slice<UnsafeRawBufferPointer>) -> Slice<UnsafeRawBufferPointer> {
        var slice = bytes
        while let first = slice.first, first == 0x20 || first == 0x09 { slice = slice.dropFirst() }
        while let last = slice.last, last == 0x20 || last == 0x09 { slice = slice.dropLast() }
        return slice
    }

}

/// A server's answer head as the data path reads it: its bytes as they came, where each header is
/// in them, and what the rules read of them (``AnswerHeaders``), in the one pass that checks the
/// head. No `String` is made of a header the gateway only passes on: the kept ones are written to
/// the client from these bytes (read strictly by ``UpstreamResponseParser``: names are tokens,
/// values have no line breaks or control characters).
final class UpstreamAnswerHead {
    struct Field {
        /// Where the name and the value (without the spaces around it) are in ``bytes``.
        var name: Range<Int>
        var value: Range<Int>
        /// Not one the gateway drops (hop-by-hop, cookies, its own): ``GatewayPolicy/keepsDownstream(nameBytes:connectionListed:)``
        /// before what `Connection` lists is known.
        var kept: Bool
    }

    /// `HTTP/1.<minor>`.
    let minor: Int
    let status: Int
    /// The head, status line through the blank line.
    let bytes: ByteBuffer
    let fields: [Field]
    let read: AnswerHeaders

    /// (An object: the parser's parts are handed on, and copied, several times per answer; a
    /// struct of buffers, arrays and texts was retained and released whole at every copy.)
    init(minor: Int, status: Int, bytes: ByteBuffer, fields: [Field], read: AnswerHeaders) {
        self.minor = minor
        self.status = status
        self.bytes = bytes
        self.fields = fields
        self.read = read
    }

    /// The headers as text (tests, logs): the data path itself reads ``fields``.
    var headers: [(name: String, value: String)] {
        bytes.withUnsafeReadableBytes { raw in
            fields.map {
                (
                    String(decoding: UnsafeRawBufferPointer(rebasing: raw[$0.name]), as: UTF8.self),
                    String(decoding: UnsafeRawBufferPointer(rebasing: raw[$0.value]), as: UTF8.self)
                )
            }
        }
    }
}

/// What the data path reads of a server's answer's headers, as they are read: the
/// `Content-Length`, the first `Content-Type` and `Retry-After` (as `HTTPHeaders.first(name:)`
/// would give them), what `Connection` lists, and the keep-alive hints. `String`s are made only of
/// the few headers these need.
struct AnswerHeaders {
    var contentLength: Int?
    var retryAfter: String?
    var eventStream = false
    private var contentTypeSeen = false
    var connectionListed: [String] = []
    var keepAlive = UpstreamKeepAlive()

    /// False when the `Connection` headers list more than ``GatewayPolicy/maxConnectionListed``
    /// names (the answer is refused: ``GatewayPolicy/connectionListed(_:)``).
    mutating func read(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> Bool {
        // Lengths first: most headers are none of these.
        switch name.count {
        case 12 where !contentTypeSeen && HTTPSyntax.equalsLowercased(name, "content-type"):
            contentTypeSeen = true
            eventStream =
                value.count >= 17
                && HTTPSyntax.equalsLowercased(UnsafeRawBufferPointer(rebasing: value[0..<17]), "text/event-stream")
        case 11 where retryAfter == nil && HTTPSyntax.equalsLowercased(name, "retry-after"):
            retryAfter = String(decoding: value, as: UTF8.self)
        case 6:
            // CF-RAY and Server (behind Cloudflare's edge): read from the bytes.
            if HTTPSyntax.equalsLowercased(name, "cf-ray") {
                keepAlive.readRayID(present: !value.isEmpty)
            } else if HTTPSyntax.equalsLowercased(name, "server") {
                // (The value's spaces are already trimmed.)
                keepAlive.readServer(isCloudflare: HTTPSyntax.equalsLowercased(value, "cloudflare"))
            }
        case 10:
            // `Connection: keep-alive` or `close` (the usual values) name no other header and say
            // nothing of how long the connection is kept: no `String`s. Otherwise, and
            // `Keep-Alive`, read as text by the rules they belong to.
            let connection = HTTPSyntax.equalsLowercased(name, "connection")
            guard connection || HTTPSyntax.equalsLowercased(name, "keep-alive") else { return true }
            if connection,
                HTTPSyntax.equalsLowercased(value, "keep-alive") || HTTPSyntax.equalsLowercased(value, "close")
            {
                return true
            }
            let name = String(decoding: name, as: UTF8.self)
            let value = String(decoding: value, as: UTF8.self)
            guard GatewayPolicy.addConnectionListed(name: name, value: value, to: &connectionListed) else {
                return false
            }
            keepAlive.read(name: name, value: value)
        default:
            break
        }
        return true
    }
}

/// The bytes of HTTP/1.1's grammar both sides of the data path read (RFC 9110 §5.6.2).
enum HTTPSyntax {
    /// A `tchar`: a byte of a token (header names, methods).
    static func isTokenByte(_ byte: UInt8) -> Bool {
        switch byte {
        case 0x30...0x39, 0x41...0x5A, 0x61...0x7A: true
        case UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"),
            UInt8(ascii: "'"), UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."),
            UInt8(ascii: "^"), UInt8(ascii: "_"), UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
            true
        default: false
        }
    }

    /// Whether `bytes` are `lower` (lowercase letters and `-`) in any case.
    static func equalsLowercased(_ bytes: some Collection<UInt8>, _ lower: StaticString) -> Bool {
        // Most names asked about differ in length: answered without reading a byte.
        // (A one-scalar literal has no pointer, nor a count without one.)
        guard !lower.hasPointerRepresentation || bytes.count == lower.utf8CodeUnitCount else { return false }
        return lower.withUTF8Buffer { expected in
            guard bytes.count == expected.count else { return false }
            var index = 0
            for byte in bytes {
                guard byte | 0x20 == expected[index] else { return false }
                index += 1
            }
            return true
        }
    }
}

/// An HTTP/1.1 head made straight into a buffer's memory, in one access to it: every
/// `ByteBuffer.write…` call is an access of its own to the buffer's storage (its capacity and
/// uniqueness checked, and in a build with run-time exclusivity checks — not the release build,
/// scripts/lib.sh — checked for that too), which for the twenty-odd pieces of a head cost more
/// than the rest of making it (appending them to an array first still cost about 150
/// instructions a piece).
struct HeadLines {
    private let base: UnsafeMutableRawPointer
    private let capacity: Int
    private(set) var count = 0
    /// A piece did not fit: the head is made again in a larger buffer (``make(_:estimate:_:)``).
    private(set) var overflowed = false

    private init(base: UnsafeMutableRawPointer, capacity: Int) {
        self.base = base
        self.capacity = capacity
    }

    /// A head made by `build` (which must make the same head every time it is called), in a
    /// buffer of `estimate` bytes, or a larger one while it does not fit.
    static func make(_ allocator: ByteBufferAllocator, estimate: Int, _ build: (inout HeadLines) -> Void) -> ByteBuffer
    {
        var size = max(estimate, 256)
        while true {
            var out = allocator.buffer(capacity: size)
            var fitted = false
            out.writeWithUnsafeMutableBytes(minimumWritableBytes: size) { memory in
                guard let base = memory.baseAddress else { return 0 }
                var lines = HeadLines(base: base, capacity: memory.count)
                build(&lines)
                fitted = !lines.overflowed
                return fitted ? lines.count : 0
            }
            if fitted { return out }
            size *= 2
        }
    }

    mutating func add(_ bytes: UnsafeRawBufferPointer) {
        guard !overflowed, bytes.count <= capacity - count else {
            overflowed = true
            return
        }
        if let source = bytes.baseAddress { (base + count).copyMemory(from: source, byteCount: bytes.count) }
        count += bytes.count
    }

    /// (Chosen for literals: a `String` would be retained and released around each piece.)
    mutating func add(_ text: StaticString) { text.withUTF8Buffer { add(UnsafeRawBufferPointer($0)) } }

    @_disfavoredOverload
    mutating func add(_ text: String) {
        var text = text
        text.withUTF8 { add(UnsafeRawBufferPointer($0)) }
    }

    /// `value` in decimal, written in place (no `String` made for it).
    mutating func add(decimal value: Int) {
        if value < 0 { add("-") }
        let magnitude = value.magnitude
        var digits = 1
        var rest = magnitude / 10
        while rest > 0 {
            digits += 1
            rest /= 10
        }
        guard !overflowed, digits <= capacity - count else {
            overflowed = true
            return
        }
        var left = magnitude
        for index in stride(from: count + digits - 1, through: count, by: -1) {
            base.storeBytes(of: UInt8(truncatingIfNeeded: 0x30 + left % 10), toByteOffset: index, as: UInt8.self)
            left /= 10
        }
        count += digits
    }

    mutating func add(_ bytes: [UInt8]) { bytes.withUnsafeBytes { add($0) } }

    /// `name: value` and its line end.
    mutating func header(_ name: StaticString, _ value: String) {
        add(name)
        add(": ")
        add(value)
        add("\r\n")
    }

    /// `name: value` and its line end.
    @_disfavoredOverload
    mutating func header(_ name: String, _ value: String) {
        add(name)
        add(": ")
        add(value)
        add("\r\n")
    }

    /// The lines of a client's head that travel upstream (``GatewayPolicy/upstreamHeaders``), as
    /// its bytes, then the route's headers and, if the client sent none, our `User-Agent`.
    mutating func clientHeaders(_ head: ClientHead, keeping rule: GatewayPolicy.UpstreamHeaderRule, userAgent: String) {
        var hasUserAgent = false
        head.raw.withUnsafeReadableBytes { bytes in
            for field in head.fields {
                let name = UnsafeRawBufferPointer(rebasing: bytes[field.name])
                guard rule.keeps(nameBytes: name) else { continue }
                add(name)
                add(": ")
                add(UnsafeRawBufferPointer(rebasing: bytes[field.value]))
                add("\r\n")
                if HTTPSyntax.equalsLowercased(name, "user-agent") { hasUserAgent = true }
            }
        }
        for header in rule.routeHeaders { self.header(header.name, header.value) }
        if !hasUserAgent { header("User-Agent", userAgent) }
    }
}

/// HTTP/1.1 body parts of requests and answers written as they come (as they are, or chunked
/// when their length is not known).
enum HTTP1Bytes {
    static let lineEnd = ByteBuffer(string: "\r\n")
    static let lastChunk = ByteBuffer(string: "0\r\n\r\n")

    /// Parts up to this size are copied into the bytes gathered for the next write
    /// (``Gathered``); larger ones are written as they are.
    static let gatherLimit = 4096

    /// Writes a body part through `context`: as it is, or as one chunk.
    static func writeBody(_ bytes: ByteBuffer, chunked: Bool, to context: ChannelHandlerContext) {
        guard bytes.readableBytes > 0 else { return }
        if chunked {
            context.write(NIOAny(chunkHeader(bytes.readableBytes, allocator: context.channel.allocator)), promise: nil)
            context.write(NIOAny(bytes), promise: nil)
            context.write(NIOAny(lineEnd), promise: nil)
        } else {
            context.write(NIOAny(bytes), promise: nil)
        }
    }

    /// A chunk's size line.
    static func chunkHeader(_ size: Int, allocator: ByteBufferAllocator) -> ByteBuffer {
        var out = allocator.buffer(capacity: 18)
        writeChunkSize(size, to: &out)
        return out
    }

    /// `size` in hexadecimal and CRLF, in one access to the buffer's memory.
    static func writeChunkSize(_ size: Int, to out: inout ByteBuffer) {
        let digits = hexDigits(size)
        out.writeWithUnsafeMutableBytes(minimumWritableBytes: digits + 2) {
            putChunkSize(size, digits: digits, at: 0, in: $0)
        }
    }

    /// How many hexadecimal digits `size` takes (1 for 0).
    static func hexDigits(_ size: Int) -> Int {
        var digits = 1
        while digits < 16, size >> (4 * digits) != 0 { digits += 1 }
        return digits
    }

    /// Puts `size`'s `digits` hexadecimal digits and CRLF at `offset` in `out` (room for them
    /// made by the caller); returns the offset past them.
    static func putChunkSize(_ size: Int, digits: Int, at offset: Int, in out: UnsafeMutableRawBufferPointer) -> Int {
        for index in 0..<digits {
            let nibble = UInt8(truncatingIfNeeded: size >> (4 * (digits - 1 - index))) & 0x0F
            out[offset + index] = nibble < 10 ? 0x30 + nibble : 0x57 + nibble
        }
        out[offset + digits] = 0x0D
        out[offset + digits + 1] = 0x0A
        return offset + digits + 2
    }
}

/// Small parts of what goes out on one connection (a head, a small body and its framing, events
/// of a stream), gathered into one buffer and written as one at the flush: each write costs
/// SwiftNIO's channel about as much as copying a few kilobytes (its pending-writes bookkeeping,
/// and a run-time look-up of its generic channel type's metadata), and an answer went as up to
/// five. Larger parts go as they are, after what was gathered. What is gathered is written, in
/// order, before anything else goes out on the connection.
struct Gathered {
    private var bytes = ByteBuffer()

    init() {}

    /// What starts with `head` (a buffer of its own: the next parts are added to it).
    init(head: ByteBuffer) { bytes = head }

    /// Adds `part` (a chunk when `chunked`), or writes what was gathered and then `part` when it
    /// is large.
    mutating func add(_ part: ByteBuffer, chunked: Bool, to context: ChannelHandlerContext) {
        let size = part.readableBytes
        guard size > 0 else { return }
        guard size <= HTTP1Bytes.gatherLimit else {
            write(to: context)
            return HTTP1Bytes.writeBody(part, chunked: chunked, to: context)
        }
        if bytes.capacity == 0 {
            bytes = context.channel.allocator.buffer(capacity: max(size + 32, 1024))
        }
        guard chunked else {
            var part = part
            bytes.writeBuffer(&part)
            return
        }
        // The size line, the part and its CRLF in one access to the buffer's memory (each
        // `ByteBuffer` write is an access of its own, checked at run time).
        let digits = HTTP1Bytes.hexDigits(size)
        bytes.writeWithUnsafeMutableBytes(minimumWritableBytes: digits + size + 4) { out in
            let at = HTTP1Bytes.putChunkSize(size, digits: digits, at: 0, in: out)
            part.withUnsafeReadableBytes {
                UnsafeMutableRawBufferPointer(rebasing: out[at..<(at + size)]).copyMemory(from: $0)
            }
            out[at + size] = 0x0D
            out[at + size + 1] = 0x0A
            return at + size + 2
        }
    }

    /// Starts with `head` (a buffer of its own, the next parts are added to it) when nothing is
    /// gathered.
    mutating func add(head: ByteBuffer) {
        if bytes.readableBytes == 0 {
            bytes = head
        } else {
            var head = head
            bytes.writeBuffer(&head)
        }
    }

    /// Writes what was gathered (not flushed).
    mutating func write(to context: ChannelHandlerContext) {
        guard bytes.readableBytes > 0 else { return }
        context.write(NIOAny(bytes), promise: nil)
        bytes = ByteBuffer()
    }

}
