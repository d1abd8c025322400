import LMXCore
import NIOCore
import NIOHTTP1

/// The answer's head and chunk lines, read strictly (``UpstreamResponseParser``).
extension UpstreamResponseParser {
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
    static let httpSlashOne: UInt64 = 0x002E_312F_5054_5448

    /// `HTTP/1.x SP 3DIGIT [SP reason]`.
    static func statusLine(_ line: UnsafeRawBufferPointer, into parsed: inout Head) throws(Malformed) {
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
    static func headerLine(
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
            // Chunked alone, once: the gateway asks for no other transfer coding (it sends no
            // `TE`), and one it passed on would reach the client still coded with the header that
            // says so dropped (hop-by-hop): a gzip-coded stream read as events. nginx refuses it
            // the same way ("upstream sent unknown Transfer-Encoding").
            guard !parsed.transferEncoded, HTTPSyntax.equalsLowercased(trimmed(valueBytes[...]), "chunked") else {
                throw Malformed(reason: "a transfer coding other than chunked")
            }
            parsed.transferEncoded = true
            parsed.chunked = true
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
    static func line(_ input: inout ByteBuffer, limit: Int) throws(Malformed) -> ByteBuffer? {
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

    static func chunkSize(_ line: UnsafeRawBufferPointer) throws(Malformed) -> Int {
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

    static func trimmed(_ bytes: Slice<UnsafeRawBufferPointer>) -> Slice<UnsafeRawBufferPointer> {
        var slice = bytes
        while let first = slice.first, first == 0x20 || first == 0x09 { slice = slice.dropFirst() }
        while let last = slice.last, last == 0x20 || last == 0x09 { slice = slice.dropLast() }
        return slice
    }
}
