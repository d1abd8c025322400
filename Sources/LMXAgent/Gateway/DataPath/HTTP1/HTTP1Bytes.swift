import LMXCore
import NIOCore
import NIOHTTP1

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
    /// `bytes` as one chunk of a chunked body (its size line, the bytes, CRLF).
    static func chunkFramed(_ bytes: ByteBuffer) -> ByteBuffer {
        guard bytes.readableBytes > 0 else { return ByteBuffer() }  // (a chunk of 0 would end the body)
        var out = ByteBuffer()
        out.reserveCapacity(bytes.readableBytes + 20)
        out.writeString(String(bytes.readableBytes, radix: 16))
        out.writeStaticString("\r\n")
        out.writeImmutableBuffer(bytes)
        out.writeStaticString("\r\n")
        return out
    }

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
    /// The storage it holds (``GatewayConnectionHandler/bytesHeld``).
    var capacity: Int { bytes.capacity }

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
