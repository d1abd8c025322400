/// A DNS-SD TXT record: a sequence of byte strings, kept exactly as received (wire order).
///
/// Parsing follows RFC 6763 §6 leniently: the key is everything before the first `=`, keys
/// compare case-insensitively, the first occurrence of a key wins, an entry without `=` is a
/// boolean attribute, an entry starting with `=` is ignored, and values are arbitrary bytes.
public struct TXTRecord: Sendable, Hashable {
    /// The default discovery document path of Opta LMX servers (CONTRACT §1).
    public static let defaultServicePath = "/.well-known/opta-lmx"

    /// Raw entries in wire order.
    public var entries: [[UInt8]]

    public init(entries: [[UInt8]] = []) {
        self.entries = entries
    }

    /// Convenience for tests and fixtures: `["path=/x", "flag"]`.
    public init(strings: [String]) {
        self.entries = strings.map { Array($0.utf8) }
    }

    public struct Attribute: Sendable, Hashable {
        public var key: String
        /// `nil` for a boolean attribute (an entry with no `=`); empty for `key=`.
        public var value: [UInt8]?

        /// The value as text; invalid UTF-8 is repaired with U+FFFD.
        public var text: String? { value.map { String(decoding: $0, as: UTF8.self) } }
    }

    /// Attributes in wire order, duplicates removed (first wins).
    public var attributes: [Attribute] {
        var seen = Set<String>()
        var result: [Attribute] = []
        for entry in entries where !entry.isEmpty && entry.first != UInt8(ascii: "=") {
            let split = entry.firstIndex(of: UInt8(ascii: "="))
            let keyBytes = split.map { entry[..<$0] } ?? entry[...]
            let key = String(decoding: keyBytes, as: UTF8.self)
            guard seen.insert(key.lowercased()).inserted else { continue }
            let value = split.map { Array(entry[entry.index(after: $0)...]) }
            result.append(Attribute(key: key, value: value))
        }
        return result
    }

    /// The attribute for `key` (case-insensitive), or `nil` when absent.
    public func attribute(_ key: String) -> Attribute? {
        let wanted = key.lowercased()
        return attributes.first { $0.key.lowercased() == wanted }
    }

    /// The value of `key` as text; `nil` when absent or boolean.
    public subscript(key: String) -> String? {
        attribute(key)?.text
    }

    /// The discovery document path from `path=`, normalised: absent, empty, non-UTF-8 or
    /// control-character values fall back to ``defaultServicePath``; a missing leading `/` is
    /// added so the value can only name a path on the advertising server.
    public var servicePath: String {
        guard let raw = attribute("path")?.value, !raw.isEmpty,
            let text = String(validating: raw, as: UTF8.self),
            !text.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F || $0 == " " }),
            Self.isPathUnderServer(text)
        else { return Self.defaultServicePath }
        return text.hasPrefix("/") ? text : "/" + text
    }

    /// A path below the server's root and nothing else: no scheme or authority (`http://x/`,
    /// `//host/`), no `..` segment (also percent-encoded), no query, fragment, backslash or
    /// user info. Anything else falls back to the default path.
    static func isPathUnderServer(_ path: String) -> Bool {
        guard path.utf8.count <= 256, !path.hasPrefix("//"), !path.contains("://") else { return false }
        if path.contains(where: { "?#\\@".contains($0) }) { return false }
        let lower = path.lowercased()
        // An encoded dot or slash has no business in a discovery path: refused rather than decoded.
        if lower.contains("%2e") || lower.contains("%2f") || lower.contains("%5c") { return false }
        return !lower.split(separator: "/", omittingEmptySubsequences: false).contains { $0 == ".." || $0 == "." }
    }
}
