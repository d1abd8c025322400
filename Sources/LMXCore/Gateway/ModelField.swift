#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The top-level `"model"` of a JSON request body, read from as much of the body as the gateway
/// has (a prefix is enough when the field comes early): what routing by model needs, without
/// parsing or holding the whole body.
public enum ModelField {
    /// The model named at the top level of the JSON object in `bytes`; nil when it is not there
    /// (yet), is not a string, or the text is not a JSON object.
    public static func find(in bytes: some Collection<UInt8>) -> String? {
        find(in: Array(bytes))
    }

    /// The same over contiguous bytes: one pass, no copy, no generic collection in the loop.
    public static func find(in data: [UInt8]) -> String? { string(named: "model", in: data) }

    /// The same over bytes in place (a request body's first part, as it came).
    public static func find(in bytes: UnsafeRawBufferPointer) -> String? {
        let model: StaticString = "model"
        return model.withUTF8Buffer { string(named: UnsafeRawBufferPointer($0), in: bytes) }
    }

    /// The top-level string field `name` of the JSON object in `data` (a prefix is enough when
    /// the field comes early); nil when it is not there (yet) or is not a string.
    public static func string(named name: String, in data: [UInt8]) -> String? {
        var name = name
        return name.withUTF8 { wanted in data.withUnsafeBytes { string(named: UnsafeRawBufferPointer(wanted), in: $0) }
        }
    }

    /// As ``string(named:in:)``, over the bytes in place: the key is compared where it
    /// lies (no quoted copy of `name` is made per call), and no index is checked twice.
    static func string(named wanted: UnsafeRawBufferPointer, in data: UnsafeRawBufferPointer) -> String? {
        var scan = TopLevelKeys(data)
        while let key = scan.nextKey() {
            if scan.keyIs(key, wanted) {
                guard let value = scan.stringValue() else { return nil }
                // Printable ASCII without escapes (model names, ids) is its own text; anything
                // else is read by the JSON decoder (escapes, UTF-8, control characters refused).
                let inner = UnsafeRawBufferPointer(rebasing: data[(value.lowerBound + 1)..<(value.upperBound - 1)])
                if inner.allSatisfy({ $0 >= 0x20 && $0 < 0x7F && $0 != 0x5C }) {
                    return String(decoding: inner, as: UTF8.self)
                }
                return try? JSONDecoder().decode(String.self, from: Data(data[value]))
            }
            guard scan.skipValue() else { return nil }
        }
        return nil
    }
}

/// The keys the gateway reads from request bodies, each of which a body must name at most once
/// and spelled plainly (``JSONBodyKeys/ambiguous(in:)``).
public enum JSONBodyKeys {
    public static let read: [String] = ["model", "collection", "previous_response_id", "stream"]

    /// The first of ``read`` that the top-level object in `data` (as much of it as has come)
    /// names twice, or names with an escape in its key (`"\u006dodel"`): the gateway reads the
    /// first plain spelling, a server (Python's json) the last of any spelling, and the two
    /// would act on different values. Nil when every such key is named once, plainly.
    public static func ambiguous(in data: UnsafeRawBufferPointer) -> String? {
        var scan = TopLevelKeys(data)
        var seen: [Bool] = Array(repeating: false, count: read.count)
        while let key = scan.nextKey() {
            let inner = UnsafeRawBufferPointer(rebasing: data[(key.lowerBound + 1)..<(key.upperBound - 1)])
            let escaped = inner.contains(0x5C)
            let name: String? =
                escaped
                ? (inner.count <= 256 ? try? JSONDecoder().decode(String.self, from: Data(data[key])) : nil)
                : String(decoding: inner, as: UTF8.self)
            if let name, let index = read.firstIndex(of: name) {
                if escaped || seen[index] { return name }
                seen[index] = true
            }
            guard scan.skipValue() else { return nil }
        }
        return nil
    }

    /// As ``ambiguous(in:)`` over an array.
    public static func ambiguous(in data: [UInt8]) -> String? {
        data.withUnsafeBytes { ambiguous(in: $0) }
    }
}

/// The top-level keys of the JSON object at the start of some bytes, one at a time, with their
/// values skipped unread: one pass, no index read twice, no allocation. Stops (nil) at the end of
/// the bytes (a prefix of a body is read as far as it goes), at the object's end, or at anything
/// that is not JSON.
struct TopLevelKeys {
    let data: UnsafeRawBufferPointer
    var i = 0
    private var started = false

    init(_ data: UnsafeRawBufferPointer) { self.data = data }

    @inline(__always) private static func isSpace(_ b: UInt8) -> Bool {
        b == 0x20 || b == 0x09 || b == 0x0A || b == 0x0D
    }

    private mutating func skipSpace() { while i < data.count, Self.isSpace(data[i]) { i += 1 } }

    /// Skips a string starting at `i` (a quote); returns its range including the quotes.
    /// Sixteen bytes at a time while none of them is a quote or a backslash (a message's text
    /// is most of a request's body: about 8 times faster than byte by byte).
    private mutating func skipString() -> Range<Int>? {
        let start = i
        i += 1
        let quotes = SIMD16<UInt8>(repeating: 0x22)
        let backslashes = SIMD16<UInt8>(repeating: 0x5C)
        while i < data.count {
            if data.count - i >= 16 {
                let block = data.loadUnaligned(fromByteOffset: i, as: SIMD16<UInt8>.self)
                if !any((block .== quotes) .| (block .== backslashes)) {
                    i += 16
                    continue
                }
            }
            if data[i] == 0x5C {
                i += 2
                continue
            }
            if data[i] == 0x22 {
                i += 1
                return start..<i
            }
            i += 1
        }
        return nil
    }

    /// The next key (its range, quotes included), positioned at its value; nil when there is none.
    mutating func nextKey() -> Range<Int>? {
        skipSpace()
        if !started {
            guard i < data.count, data[i] == 0x7B else { return nil }
            started = true
            i += 1
            skipSpace()
        } else {
            guard i < data.count, data[i] == 0x2C else { return nil }
            i += 1
            skipSpace()
        }
        guard i < data.count, data[i] == 0x22, let key = skipString() else { return nil }
        skipSpace()
        // (A key at the very end of what has come is a key all the same: its value follows.)
        if i == data.count { return key }
        guard data[i] == 0x3A else { return nil }
        i += 1
        skipSpace()
        return key
    }

    /// The key's text between its quotes is exactly `wanted` (escapes are not read).
    func keyIs(_ key: Range<Int>, _ wanted: UnsafeRawBufferPointer) -> Bool {
        guard key.count == wanted.count + 2 else { return false }
        for offset in 0..<wanted.count where data[key.lowerBound + 1 + offset] != wanted[offset] { return false }
        return true
    }

    /// The value here, when it is a string: its range, quotes included.
    mutating func stringValue() -> Range<Int>? {
        guard i < data.count, data[i] == 0x22 else { return nil }
        return skipString()
    }

    /// Skips any value: strings, objects and arrays (nested), numbers and literals.
    mutating func skipValue() -> Bool {
        skipSpace()
        guard i < data.count else { return false }
        switch data[i] {
        case 0x22:
            return skipString() != nil
        case 0x7B, 0x5B:
            var depth = 0
            while i < data.count {
                switch data[i] {
                case 0x22:
                    guard skipString() != nil else { return false }
                    continue
                case 0x7B, 0x5B: depth += 1
                case 0x7D, 0x5D:
                    depth -= 1
                    if depth == 0 {
                        i += 1
                        return true
                    }
                default: break
                }
                i += 1
            }
            return false
        default:
            while i < data.count, data[i] != 0x2C, data[i] != 0x7D, data[i] != 0x5D, !Self.isSpace(data[i]) { i += 1 }
            if i < data.count { skipSpace() }
            return i < data.count
        }
    }
}
