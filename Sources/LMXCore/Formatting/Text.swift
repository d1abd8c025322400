#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

extension Character {
    var isASCIIDigit: Bool { isASCII && isNumber }
}

extension Optional where Wrapped == String {
    var nonBlank: String? {
        guard let value = self, !value.isEmpty else { return nil }
        return value
    }
}

extension String {
    func trimmingASCIIWhitespace() -> String {
        let scalars = unicodeScalars
        guard let start = scalars.firstIndex(where: { !Self.isSpace($0) }) else { return "" }
        let end = scalars.lastIndex(where: { !Self.isSpace($0) })!
        return String(scalars[start...end])
    }

    private static func isSpace(_ s: Unicode.Scalar) -> Bool {
        s == " " || s == "\t" || s == "\n" || s == "\r" || s == "\u{0B}" || s == "\u{0C}"
    }
}

extension String {
    /// Whether the UTF-8 bytes contain `needle`'s, byte for byte: no Unicode segmentation (a
    /// server reads bytes, so a match inside a grapheme counts), no generic search machinery.
    /// For the request checks on the gateway's hot path.
    @_disfavoredOverload
    func containsBytes(_ needle: String) -> Bool {
        var needle = needle
        return needle.withUTF8 { containsBytes(UnsafeRawBufferPointer($0)) }
    }

    /// (A literal needle: read in place, not retained and released as a `String` would be.)
    func containsBytes(_ needle: StaticString) -> Bool {
        needle.withUTF8Buffer { containsBytes(UnsafeRawBufferPointer($0)) }
    }

    private func containsBytes(_ n: UnsafeRawBufferPointer) -> Bool {
        // A native string's bytes are read where they are; another (bridged, or a shared
        // substring's) is made contiguous first.
        if let found = utf8.withContiguousStorageIfAvailable({ Self.contains(UnsafeRawBufferPointer($0), n) }) {
            return found
        }
        var haystack = self
        return haystack.withUTF8 { Self.contains(UnsafeRawBufferPointer($0), n) }
    }

    private static func contains(_ h: UnsafeRawBufferPointer, _ n: UnsafeRawBufferPointer) -> Bool {
        guard let first = n.first else { return true }
        guard n.count <= h.count else { return false }
        var i = 0
        let last = h.count - n.count
        while i <= last {
            if h[i] == first {
                var j = 1
                while j < n.count, h[i + j] == n[j] { j += 1 }
                if j == n.count { return true }
            }
            i += 1
        }
        return false
    }

    /// Equal to `lowercase` (ASCII, lower case) ignoring ASCII case, without making a new string.
    func equalsASCIILowercased(_ lowercase: String) -> Bool {
        utf8.count == lowercase.utf8.count && hasASCIILowercasedPrefix(lowercase)
    }

    /// Starts with `lowercase` (ASCII, lower case) ignoring ASCII case, without making a new string.
    public func hasASCIILowercasedPrefix(_ lowercase: String) -> Bool {
        guard utf8.count >= lowercase.utf8.count else { return false }
        // Native strings (small ones too) are contiguous UTF-8: compared in place.
        let inPlace = utf8.withContiguousStorageIfAvailable { text in
            lowercase.utf8.withContiguousStorageIfAvailable { prefix in
                for i in 0..<prefix.count where Self.foldedASCII(text[i]) != prefix[i] { return false }
                return true
            }
        }
        if let inPlace, let result = inPlace { return result }
        for (a, b) in zip(utf8, lowercase.utf8) where Self.foldedASCII(a) != b { return false }
        return true
    }

    /// An ASCII capital as its lower case; any other byte as it is.
    static func foldedASCII(_ byte: UInt8) -> UInt8 {
        byte >= 0x41 && byte <= 0x5A ? byte | 0x20 : byte
    }
}
