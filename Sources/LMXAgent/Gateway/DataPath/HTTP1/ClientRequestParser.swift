import LMXCore
import NIOCore
import NIOHTTP1

/// Clients' requests as the data path reads them: a strict subset of HTTP/1.1, read from the
/// bytes in one pass, and everything else left to llhttp (SwiftNIO's decoder, behind).
///
/// A request is read here only when nobody could read it differently: a request line of a
/// common method, an origin-form (or absolute-form: its path and query) target of visible ASCII, `HTTP/1.1` or `HTTP/1.0`; header lines
/// of a token, a colon and a value of visible ASCII, bytes past ASCII (obs-text), spaces and
/// tabs, each ending in CRLF; its body framed by one `Content-Length` of digits, by
/// `Transfer-Encoding: chunked`, or absent; the whole head within 80 KiB (llhttp's bound). An
/// upgrade (`Upgrade: h2c`, `websocket`) is read as a plain request when its target is one the
/// data path forwards (`/v1/`, `/admin/`): the gateway upgrades nothing, and `Upgrade` and what
/// `Connection` lists do not travel on, as with nginx. Anything else — another
/// `Transfer-Encoding`, a bare CR or LF, a folded line, more than 100 headers, an upgrade of
/// another target — and the connection's bytes from that request on go to llhttp, which reads
/// (or refuses) them; the general path behind it answers them (the dashboard) or refuses them,
/// and forwards nothing. This reader never accepts what llhttp would refuse or read otherwise
/// but for those upgrades (`ClientCodecTests` holds it to that against llhttp on generated and
/// mutated requests), so the two can never disagree on where a request ends.
///
/// Each request's head comes with its bytes as read (`raw`): a request handed to the general path
/// is given to llhttp as those bytes and its body's, and read there afresh.
struct ClientRequestParser {
    enum Part {
        /// A head (with its bytes as read, ``ClientHead/raw``) and its body's length (0: none;
        /// ``chunked``: the body comes in chunks, its length known at its end).
        case head(ClientHead, length: Int)
        /// A part of the body (a chunked body's data, without its framing).
        case body(ByteBuffer)
        case end
        /// Bytes not read here: llhttp reads them, and every byte after them.
        case other(ByteBuffer)
        /// A chunked body broke its framing: nothing more of the connection is read.
        case malformed
        /// A head longer than ``ClientRequestParser/maxHead`` (whole or not): refused with 431,
        /// nothing more of the connection is read.
        case headTooLarge
    }

    /// The length of a head's body that comes chunked (`Transfer-Encoding: chunked`).
    static let chunked = -1
    /// A chunk-size line (with extensions, refused) and the trailers are at most this long.
    static let maxChunkLine = 4 << 10

    enum State {
        case head
        case body(remaining: Int)
        /// A chunked body: the next chunk's size line.
        case chunkSize
        /// A chunk's data, then its CRLF.
        case chunkData(remaining: Int)
        case chunkEnd
        /// After the last chunk: trailer lines (read and dropped) up to the blank line.
        case trailers(read: Int)
        /// llhttp reads the rest of the connection.
        case other
        /// The last request said the connection closes after its answer: nothing more is read.
        case closed
    }

    /// The longest head read, whole or not (nginx's default, `large_client_header_buffers 4 8k`:
    /// 32 KiB): a longer one is refused with 431 and the connection closed, never handed on.
    /// (An API client's head is well under 2 KiB; a browser's, cookies and all, under 16 KiB.)
    static let maxHead = 32 << 10
    static let maxHeaders = 100

    var state = State.head
    /// The start of a head not yet whole.
    var held: ByteBuffer?

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
            case .chunkSize, .chunkData, .chunkEnd, .trailers:
                if !readChunked(&input, emit: emit) { return nil }
            case .head:
                // Empty lines before a request line are ignored (RFC 9112 §2.2: old clients send
                // a CRLF after a POST's body), as llhttp ignores them.
                while input.readableBytes >= 2, input.readableBytesView.starts(with: Self.crlf) {
                    input.moveReaderIndex(forwardBy: 2)
                }
                if input.readableBytes == 1, input.readableBytesView.first == 0x0D {
                    held = input
                    return nil
                }
                if input.readableBytes == 0 { return nil }
                switch Self.readHead(input) {
                case .incomplete:
                    if input.readableBytes > Self.maxHead {
                        state = .closed
                        emit(.headTooLarge)
                        return nil
                    }
                    held = input
                    return nil
                case .tooLarge:
                    state = .closed
                    emit(.headTooLarge)
                    return nil
                case .other:
                    state = .other
                case .request(var request, let headLength):
                    request.head.raw = input.readSlice(length: headLength)!
                    // Nothing after a request that closes the connection is read (llhttp refuses
                    // it; the connection closes once this one is answered).
                    closesAfter = !request.head.keepAlive
                    emit(.head(request.head, length: request.length))
                    if request.length == Self.chunked {
                        state = .chunkSize
                    } else if request.length > 0 {
                        state = .body(remaining: request.length)
                    } else {
                        ended(emit)
                    }
                }
            }
        }
        return nil
    }

    var closesAfter = false
    static let crlf: [UInt8] = [0x0D, 0x0A]

    mutating func ended(_ emit: (Part) -> Void) {
        state = closesAfter ? .closed : .head
        emit(.end)
    }

    enum HeadRead {
        /// The head has not all come (nothing in it so far is refused).
        case incomplete
        /// Not a head read here: llhttp reads it.
        case other
        /// Longer than ``maxHead``.
        case tooLarge
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
            var chunked = false
            // What `Connection` says, as llhttp reads it (SwiftNIO's `isKeepAlive` of a head it
            // decoded): HTTP/1.1 closes with a `close` token, HTTP/1.0 keeps only with `keep-alive`.
            var connectionClose = false
            var connectionKeepAlive = false
            // The names the `Connection` headers list (as ``GatewayPolicy/connectionListed(_:)``
            // counts them): past its bound, llhttp reads the request and the general path refuses it.
            var connectionNames = 0
            var hostTwice = false
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
            guard index + 1 < count else { return .incomplete }  // (past maxHead: the caller's `.headTooLarge`)
            guard bytes[index + 1] == 0x0A,
                let (method, target, minor) = Self.requestLine(UnsafeRawBufferPointer(rebasing: bytes[0..<index]))
            else { return .other }
            index += 2
            // A target the data path forwards: an upgrade of it is read as a plain request.
            let forwarded = target.utf8.starts(with: "/v1/".utf8) || target.utf8.starts(with: "/admin/".utf8)
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
                        // Visible ASCII, or obs-text (RFC 9110 §5.5; llhttp reads it too): passed on as
                        // the bytes they are. Controls and DEL go to llhttp.
                        guard byte > 0x20, byte != 0x7F else { return .other }
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
                guard index <= maxHead else { return .tooLarge }
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
                    // One, `chunked` in any case (RFC 9112 §7), from an HTTP/1.1 client, and no Content-Length
                    // (checked at the end): anything else to llhttp.
                    guard minor == 1, !chunked, valueEnd == lineEnd,
                        HTTPSyntax.equalsLowercased(UnsafeRawBufferPointer(rebasing: value), "chunked")
                    else {
                        return .other
                    }
                    chunked = true
                case 4 where HTTPSyntax.equalsLowercased(name, "host"):
                    if known & ClientHead.Known.host.rawValue != 0 { hostTwice = true }
                case 7 where HTTPSyntax.equalsLowercased(name, "upgrade"):
                    guard forwarded else { return .other }
                case 10 where HTTPSyntax.equalsLowercased(name, "connection"):
                    // (llhttp reads a tab anywhere on the line otherwise than a space: left to llhttp.)
                    let valueBytes = UnsafeRawBufferPointer(rebasing: value)
                    if tab || (!forwarded && containsLowercased(valueBytes[...], "upgrade")) { return .other }
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
            guard index + 2 <= maxHead else { return .tooLarge }
            guard !(chunked && length != nil) else { return .other }
            let keepAlive = minor == 1 ? !connectionClose : connectionKeepAlive
            return .request(
                Request(
                    head: ClientHead(
                        method: method, uri: target, minor: minor, raw: ByteBuffer(), fields: fields, known: known,
                        keepAlive: keepAlive, hostTwice: hostTwice),
                    length: chunked ? Self.chunked : length ?? 0),
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
        // A target of visible ASCII: origin-form, or absolute-form (`http://host/path`, which a
        // server must accept: RFC 9112 §3.2.2), read as its path and query alone (the scheme and
        // authority are never forwarded, and `Host` stays what the client sent).
        for index in (space + 1)..<version where line[index] < 0x21 || line[index] > 0x7E { return nil }
        var start = space + 1
        var target = UnsafeRawBufferPointer(rebasing: line[start..<version])
        if line[start] != UInt8(ascii: "/") {
            guard let pathStart = absoluteFormPath(target) else { return nil }
            start += pathStart
            target = UnsafeRawBufferPointer(rebasing: line[start..<version])
            // `http://host` or `http://host?query`: the path is `/`.
            if target.first != UInt8(ascii: "/") {
                return (method, "/" + String(decoding: target, as: UTF8.self), Int(minor - 0x30))
            }
        }
        return (method, String(decoding: target, as: UTF8.self), Int(minor - 0x30))
    }

    /// Where an absolute-form target's path (or query) starts: after `http://` or `https://`
    /// (either case) and a non-empty authority; nil for any other form.
    private static func absoluteFormPath(_ target: UnsafeRawBufferPointer) -> Int? {
        var index = 0
        for letter in "http".utf8 {
            guard index < target.count, target[index] | 0x20 == letter else { return nil }
            index += 1
        }
        if index < target.count, target[index] | 0x20 == UInt8(ascii: "s") { index += 1 }
        for mark in "://".utf8 {
            guard index < target.count, target[index] == mark else { return nil }
            index += 1
        }
        let authority = index
        while index < target.count, target[index] != UInt8(ascii: "/"), target[index] != UInt8(ascii: "?") {
            // (No user info: `user@host` names another authority than it seems.)
            guard target[index] != UInt8(ascii: "@"), target[index] != UInt8(ascii: "#") else { return nil }
            index += 1
        }
        return index > authority ? index : nil
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
