/// Eight bytes read as one word (the first byte the lowest), and which of its bytes pass a test,
/// each marked by its high bit: how the readers of heads, paths and event streams pass over the
/// bytes that need no look of their own eight at a time, and find the first that does at once.
///
/// The marks of ``bytes(below:in:)`` and ``bytes(equalTo:in:)`` come from a subtraction whose
/// borrow may mark a byte above a marked one: the lowest mark is always right, so a word has such
/// a byte exactly when some byte is marked, and the first is ``firstMarked(_:)``. The marks of
/// ``nameBytes(in:)`` are right for every byte.
public enum ByteWord {
    @usableFromInline static var ones: UInt64 { 0x0101_0101_0101_0101 }
    @usableFromInline static var highBits: UInt64 { 0x8080_8080_8080_8080 }

    /// The eight bytes at `offset` of `bytes` (at least eight from there), the first the lowest.
    @inlinable @inline(__always)
    public static func word(_ bytes: UnsafeRawBufferPointer, at offset: Int) -> UInt64 {
        UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
    }

    /// The bytes of `word` below `bound` (at most 0x80).
    @inlinable @inline(__always)
    public static func bytes(below bound: UInt8, in word: UInt64) -> UInt64 {
        (word &- ones &* UInt64(bound)) & ~word & highBits
    }

    /// The bytes of `word` that are `byte`.
    @inlinable @inline(__always)
    public static func bytes(equalTo byte: UInt8, in word: UInt64) -> UInt64 {
        bytes(below: 1, in: word ^ (ones &* UInt64(byte)))
    }

    /// The bytes of `word` that are not visible ASCII (0x21–0x7E).
    @inlinable @inline(__always)
    public static func invisibleBytes(in word: UInt64) -> UInt64 {
        word & highBits | bytes(below: 0x21, in: word) | bytes(equalTo: 0x7F, in: word)
    }

    /// The bytes of `word` that are ASCII letters, digits or `-` (the bytes of nearly every
    /// header name), each marked exactly.
    @inlinable @inline(__always)
    public static func nameBytes(in word: UInt64) -> UInt64 {
        let low = word & ~highBits  // each byte's low seven bits: no sum below carries past its byte
        let folded = low | ones &* 0x20
        let letters = atLeast(0x61, folded) & atMost(0x7A, folded)
        let digits = atLeast(0x30, low) & atMost(0x39, low)
        let dashes = ~((low ^ ones &* 0x2D) &+ ones &* 0x7F | low ^ ones &* 0x2D) & highBits
        return (letters | digits | dashes) & ~word & highBits
    }

    /// Bytes (each below 0x80) at least `bound`, marked exactly.
    @inlinable @inline(__always)
    static func atLeast(_ bound: UInt8, _ low: UInt64) -> UInt64 {
        (low &+ ones &* UInt64(0x80 - bound)) & highBits
    }

    /// Bytes (each below 0x80) at most `bound`, marked exactly.
    @inlinable @inline(__always)
    static func atMost(_ bound: UInt8, _ low: UInt64) -> UInt64 {
        ~(low &+ ones &* UInt64(0x7F - bound)) & highBits
    }

    /// Where in its word the first marked byte is (0–7; 8 when none is).
    @inlinable @inline(__always)
    public static func firstMarked(_ marks: UInt64) -> Int { marks.trailingZeroBitCount >> 3 }

    /// Where in its word the first byte that is not marked is (0–7; 8 when all are).
    @inlinable @inline(__always)
    public static func firstUnmarked(_ marks: UInt64) -> Int { firstMarked(~marks & highBits) }
}
