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
        var i = 0
        @inline(__always) func isSpace(_ b: UInt8) -> Bool { b == 0x20 || b == 0x09 || b == 0x0A || b == 0x0D }
        func skipSpace() { while i < data.count, isSpace(data[i]) { i += 1 } }
        /// Skips a string starting at `i` (a quote); returns its range including the quotes.
        func skipString() -> Range<Int>? {
            let start = i
            i += 1
            while i < data.count {
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
        /// Skips any value: strings, objects and arrays (nested), numbers and literals.
        func skipValue() -> Bool {
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
                while i < data.count, data[i] != 0x2C, data[i] != 0x7D, data[i] != 0x5D, !isSpace(data[i]) { i += 1 }
                return i < data.count
            }
        }
        /// The key's text between its quotes is exactly `wanted` (escapes are not read: a key
        /// written with one is not the field, as before).
        func isWanted(_ key: Range<Int>) -> Bool {
            guard key.count == wanted.count + 2 else { return false }
            for offset in 0..<wanted.count where data[key.lowerBound + 1 + offset] != wanted[offset] { return false }
            return true
        }
        skipSpace()
        guard i < data.count, data[i] == 0x7B else { return nil }
        i += 1
        while true {
            skipSpace()
            guard i < data.count, data[i] == 0x22, let key = skipString() else { return nil }
            skipSpace()
            guard i < data.count, data[i] == 0x3A else { return nil }
            i += 1
            skipSpace()
            if isWanted(key) {
                guard i < data.count, data[i] == 0x22, let value = skipString() else { return nil }
                // Printable ASCII without escapes (model names, ids) is its own text; anything
                // else is read by the JSON decoder (escapes, UTF-8, control characters refused).
                let inner = UnsafeRawBufferPointer(rebasing: data[(value.lowerBound + 1)..<(value.upperBound - 1)])
                if inner.allSatisfy({ $0 >= 0x20 && $0 < 0x7F && $0 != 0x5C }) {
                    return String(decoding: inner, as: UTF8.self)
                }
                return try? JSONDecoder().decode(String.self, from: Data(data[value]))
            }
            guard skipValue() else { return nil }
            skipSpace()
            guard i < data.count, data[i] == 0x2C else { return nil }
            i += 1
        }
    }
}
