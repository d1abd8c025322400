import LMXCore
import NIOCore

/// Chunked request bodies (RFC 9112 §7.1), read strictly.
extension ClientRequestParser {
    /// Reads a chunked body's framing from `input` (RFC 9112 §7.1: `1*HEXDIG CRLF data CRLF`…,
    /// `0 CRLF`, trailer lines, CRLF), handing on the data; false when `input` has no whole step
    /// left (what there is, held for the next read) or the framing broke (`.malformed`: chunk
    /// extensions, bytes other than hex digits, a chunk without its CRLF, trailers past the bound).
    mutating func readChunked(_ input: inout ByteBuffer, emit: (Part) -> Void) -> Bool {
        func broken() -> Bool {
            state = .closed
            emit(.malformed)
            return false
        }
        switch state {
        case .chunkData(let remaining):
            let n = min(remaining, input.readableBytes)
            emit(.body(input.readSlice(length: n)!))
            state = n == remaining ? .chunkEnd : .chunkData(remaining: remaining - n)
            return true
        case .chunkEnd:
            guard input.readableBytes >= 2 else {
                held = input
                return false
            }
            guard input.readInteger(as: UInt16.self) == 0x0D0A else { return broken() }
            state = .chunkSize
            return true
        case .chunkSize:
            guard let line = Self.line(in: input) else {
                if input.readableBytes > Self.maxChunkLine { return broken() }
                held = input
                return false
            }
            guard line > 0, line <= 15,
                let size = input.withUnsafeReadableBytes({
                    Self.hexSize(UnsafeRawBufferPointer(rebasing: $0[0..<line]))
                })
            else { return broken() }
            input.moveReaderIndex(forwardBy: line + 2)
            state = size == 0 ? .trailers(read: 0) : .chunkData(remaining: size)
            return true
        case .trailers(let read):
            guard let line = Self.line(in: input) else {
                if read + input.readableBytes > Self.maxChunkLine { return broken() }
                held = input
                return false
            }
            guard line >= 0, read + line + 2 <= Self.maxChunkLine,
                line == 0
                    || input.withUnsafeReadableBytes({ Self.isTrailer(UnsafeRawBufferPointer(rebasing: $0[0..<line])) })
            else { return broken() }
            input.moveReaderIndex(forwardBy: line + 2)
            if line == 0 {
                ended(emit)
            } else {
                state = .trailers(read: read + line + 2)
            }
            return true
        case .head, .body, .other, .closed:
            return true
        }
    }

    /// The length of the line at the start of `input` (without its CRLF); nil while its CRLF has
    /// not come; -1 when it holds a bare LF or its CR is not followed by LF (refused).
    static func line(in input: ByteBuffer) -> Int? {
        input.withUnsafeReadableBytes { bytes -> Int? in
            guard let end = bytes.firstIndex(where: { $0 == 0x0D || $0 == 0x0A }) else { return nil }
            guard bytes[end] == 0x0D else { return -1 }
            guard end + 1 < bytes.count else { return nil }
            return bytes[end + 1] == 0x0A ? end : -1
        }
    }

    /// A trailer line as a header line is read (a token, a colon, visible ASCII, spaces, tabs).
    static func isTrailer(_ line: UnsafeRawBufferPointer) -> Bool {
        guard let colon = line.firstIndex(of: UInt8(ascii: ":")), colon > 0 else { return false }
        return line[..<colon].allSatisfy(HTTPSyntax.isTokenByte)
            && line[(colon + 1)...].allSatisfy { $0 == 0x09 || (0x20..<0x7F).contains($0) }
    }

    /// A chunk's size: hex digits only (no extensions, spaces or sign), at most 15 of them.
    static func hexSize(_ digits: UnsafeRawBufferPointer) -> Int? {
        guard !digits.isEmpty, digits.count <= 15 else { return nil }
        var size = 0
        for byte in digits {
            let value: Int
            switch byte {
            case 0x30...0x39: value = Int(byte - 0x30)
            case 0x41...0x46: value = Int(byte - 0x41 + 10)
            case 0x61...0x66: value = Int(byte - 0x61 + 10)
            default: return nil
            }
            size = size << 4 | value
        }
        return size
    }
}
