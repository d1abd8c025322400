#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// A URL split by Foundation's `URLComponents`. Spaces and UTF-8 that some generators leave
/// unencoded (in a label, say) are accepted as if percent-encoded; broken `%` escapes, a
/// non-numeric port and a malformed authority are refused, the field named.
struct SplitURL {
    var scheme: String
    /// The host as written (IPv6 in brackets); empty when the URL has none.
    var host: String
    var port: Int?
    var hasUserInfo: Bool
    var path: String
    var queryItems: [URLQueryItem]

    init(_ text: String, field: String? = nil) throws(PairingError) {
        guard text.contains("://") else {
            throw PairingError(.malformed, field: field, "not a URL (scheme://host…)")
        }
        if let broken = Self.brokenEscape(in: text) {
            // Named by its query field when it is in one (a key, say), never quoted: it may be secret.
            throw PairingError(
                .malformed, field: broken.field ?? field,
                "broken percent-encoding (% must be followed by two hex digits)")
        }
        guard
            let components = URLComponents(string: text, encodingInvalidCharacters: false)
                ?? URLComponents(string: Self.encodingStrays(text), encodingInvalidCharacters: false),
            let scheme = components.scheme, let host = components.percentEncodedHost
        else {
            // Only what comes before the query is shown: the query may carry keys.
            let shown = text.prefix { $0 != "?" && $0 != "#" }
            throw PairingError(
                .malformed, field: field,
                "\(PairingError.quote(shown)) is not a valid URL (is the port a number, and the host well formed?)")
        }
        self.scheme = scheme.lowercased()
        self.host = host
        self.port = components.port
        self.hasUserInfo = components.percentEncodedUser != nil || components.percentEncodedPassword != nil
        self.path = components.percentEncodedPath
        self.queryItems = components.percentEncodedQueryItems ?? []
    }

    /// `host[:port]`, for messages.
    var authority: String { port.map { "\(host):\($0)" } ?? host }

    private struct BrokenEscape { var field: String? }

    /// A `%` not followed by two hex digits (which `URLComponents` would refuse, or with
    /// `encodingInvalidCharacters` quietly turn into `%25`), and the query field it is in.
    private static func brokenEscape(in text: String) -> BrokenEscape? {
        let bytes = Array(text.utf8)
        var index = 0
        while index < bytes.count {
            defer { index += 1 }
            guard bytes[index] == UInt8(ascii: "%") else { continue }
            if index + 2 < bytes.count, bytes[index + 1].isHexDigit, bytes[index + 2].isHexDigit { continue }
            // In the query? Then the field is the name before `=` in the `&`-separated part.
            guard let query = bytes.firstIndex(of: UInt8(ascii: "?")), query < index,
                bytes[query..<index].firstIndex(of: UInt8(ascii: "#")) == nil
            else { return BrokenEscape(field: nil) }
            let start =
                bytes[..<index].lastIndex { $0 == UInt8(ascii: "&") || $0 == UInt8(ascii: "?") }.map { $0 + 1 } ?? query
                + 1
            guard let equals = bytes[start..<index].firstIndex(of: UInt8(ascii: "=")) else {
                return BrokenEscape(field: "query")
            }
            return BrokenEscape(field: String(String(decoding: bytes[start..<equals], as: UTF8.self).prefix(64)))
        }
        return nil
    }

    /// Percent-encodes what RFC 3986 allows nowhere in a URL (a space, UTF-8, `"<>\^`{|}`),
    /// keeping every delimiter and the `%XX` escapes already there.
    private static func encodingStrays(_ text: String) -> String {
        let hex = Array("0123456789ABCDEF".unicodeScalars)
        let neverInAURL = Set(#""<>\^`{|}"#.utf8)
        var out = String.UnicodeScalarView()
        for byte in text.utf8 {
            if byte > 0x20, byte < 0x7F, !neverInAURL.contains(byte) {
                out.append(Unicode.Scalar(byte))
            } else {
                out.append("%")
                out.append(hex[Int(byte >> 4)])
                out.append(hex[Int(byte & 0x0F)])
            }
        }
        return String(out)
    }
}

extension UInt8 {
    fileprivate var isHexDigit: Bool {
        (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(self) || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains(self)
            || (UInt8(ascii: "A")...UInt8(ascii: "F")).contains(self)
    }
}

/// A URL's query: percent-decoded (by `URLComponents`), every name at most once.
struct Query {
    private var values: [String: String] = [:]
    private var raw: [String: String] = [:]

    /// - Parameter items: the query as `URLComponents` splits it, still percent-encoded.
    init(_ items: [URLQueryItem]) throws(PairingError) {
        for item in items where !(item.name.isEmpty && item.value == nil) {
            let name = try Query.decode(item.name, field: "query")
            let rawValue = item.value ?? ""
            let value = try Query.decode(rawValue, field: name)
            guard values[name] == nil else {
                throw PairingError(
                    .duplicateField, field: name, "appears more than once: refused (which one would be meant?)")
            }
            try PairingParser.checkValue(value, field: name)
            values[name] = value
            raw[name] = rawValue
        }
    }

    subscript(_ name: String) -> String? { values[name] }

    /// `+` means a space only where a space can be meant (a label); in keys, URLs and hosts
    /// a `+` is kept as it is.
    subscript(_ name: String, plusIsSpace plusIsSpace: Bool) -> String? {
        guard plusIsSpace, let raw = raw[name] else { return values[name] }
        return try? Query.decode(
            String(raw.split(separator: "+", omittingEmptySubsequences: false).joined(separator: "%20")), field: name)
    }

    /// Percent-decodes one name or value that `URLComponents` has split off a query (so its `%XX`
    /// forms are well formed).
    static func decode(_ encoded: String, field: String) throws(PairingError) -> String {
        guard encoded.contains("%") else { return encoded }
        // Parsed, not assigned: URLComponents' setters trap on what they refuse, its parser returns nil.
        guard
            let decoded = URLComponents(string: "lmx:?v=" + encoded, encodingInvalidCharacters: false)?.queryItems?
                .first?.value
        else {
            throw PairingError(.malformed, field: field, "percent-encoding does not decode to UTF-8 text")
        }
        return decoded
    }
}
