/// Numbers and text that arrive from outside the agent (servers, announcers, pairing codes,
/// address books, other local users), turned into values the agent can compute with: every
/// function here is total. Whatever the input (negative, non-finite, past `Int64`, exponents,
/// hex, whitespace, lists, invalid UTF-8, megabytes of it), the result is a clamped value or nil,
/// never a trap, and what is kept is bounded.
///
/// Rule for the rest of the code: a number from outside is read only through these functions,
/// and arithmetic on it uses the clamped result (or `&+` where a sum of clamped values could
/// still grow).
public enum OutsideInput {
    /// The largest count taken from a server's document (`in_flight_requests`,
    /// `loaded_model_count`, `models_loaded`): far above any real server, far below overflow.
    public static let maxCount = 1_000_000

    /// A header's delay in seconds (`Retry-After`, RFC 9110 §10.2.3: `1*DIGIT`), also with a
    /// decimal fraction as some servers send it; surrounding blanks allowed. Clamped to
    /// `0...cap`. Nil for anything else: an HTTP date, a sign, an exponent, hex, `inf`/`nan`, a
    /// list, an empty value.
    public static func delaySeconds(_ text: some StringProtocol, cap: Double) -> Double? {
        let bytes = Array(text.utf8.prefix(256))
        guard text.utf8.count <= 256 else { return nil }
        var start = 0
        var end = bytes.count
        while start < end, bytes[start] == 0x20 || bytes[start] == 0x09 { start += 1 }
        while end > start, bytes[end - 1] == 0x20 || bytes[end - 1] == 0x09 { end -= 1 }
        guard start < end else { return nil }
        var whole = 0.0
        var fraction = 0.0
        var scale = 1.0
        var seenDot = false
        var digits = 0
        for byte in bytes[start..<end] {
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"):
                digits += 1
                let digit = Double(byte - UInt8(ascii: "0"))
                if seenDot {
                    if scale > 1e-9 {
                        scale /= 10
                        fraction += digit * scale
                    }
                } else if whole <= cap {
                    whole = whole * 10 + digit  // stops growing once past the cap
                }
            case UInt8(ascii: ".") where !seenDot && digits > 0:
                seenDot = true
            default:
                return nil
            }
        }
        guard digits > 0, bytes[end - 1] != UInt8(ascii: ".") else { return nil }
        let seconds = whole + fraction
        guard seconds.isFinite, cap.isFinite else { return nil }
        return min(max(seconds, 0), max(cap, 0))
    }

    /// A `Content-Length` value: `1*DIGIT`, at most 18 digits (below `Int64.max`); nil for
    /// anything else, including lists (`5, 5`), signs and blanks inside. Inlinable: specialized
    /// where it is called (once per request and answer on the gateway's data path).
    @inlinable
    public static func contentLength(_ text: some StringProtocol) -> Int? {
        var value = 0
        var digits = 0
        for byte in text.utf8 {
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9"), digits < 18 else { return nil }
            value = value * 10 + Int(byte - UInt8(ascii: "0"))
            digits += 1
        }
        return digits > 0 ? value : nil
    }

    /// A count from a server's JSON document, clamped to `0...maxCount`.
    public static func count(_ value: Int?) -> Int? {
        value.map { min(max($0, 0), maxCount) }
    }

    /// Text kept from outside (a version, a security profile): nil when empty or when it holds
    /// control characters; otherwise cut to at most `maxBytes` of UTF-8 at a character boundary,
    /// with `…` marking the cut.
    public static func label(_ text: String?, maxBytes: Int) -> String? {
        guard let text, !text.isEmpty else { return nil }
        guard !text.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else { return nil }
        if text.utf8.count <= maxBytes { return text }
        var out = ""
        var used = 0
        for scalar in text.unicodeScalars {
            let size = String(scalar).utf8.count
            if used + size > maxBytes - 3 { break }
            out.unicodeScalars.append(scalar)
            used += size
        }
        return out + "…"
    }

    /// An identifier kept from outside (an `instance_id`): taken whole or not at all, so that two
    /// different identifiers never become equal by being shortened or cleaned.
    public static func identifier(_ text: String?, maxBytes: Int = 300) -> String? {
        guard let text, !text.isEmpty, text.utf8.count <= maxBytes,
            !text.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F })
        else { return nil }
        return text
    }
}
