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
    typealias Part = UpstreamAnswerPart

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

}
