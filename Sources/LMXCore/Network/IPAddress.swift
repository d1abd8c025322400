/// The one parser of IP address literals in the agent (announced addresses, pairing links,
/// configured endpoints, the addresses a tunnel vouches for).
public enum IPAddress {
    /// A dotted quad: four decimal parts of 0–255, without leading zeros (`010` is octal to
    /// `inet_aton` and decimal elsewhere: refused rather than guessed), no short or hex forms.
    public static func v4(_ text: some StringProtocol) -> (UInt8, UInt8, UInt8, UInt8)? {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4 else { return nil }
        var out: [UInt8] = []
        for part in parts {
            guard (1...3).contains(part.count), part.allSatisfy({ $0.isASCII && $0.isNumber }),
                part.count == 1 || part.first != "0", let value = UInt8(part)
            else { return nil }
            out.append(value)
        }
        return (out[0], out[1], out[2], out[3])
    }

    /// RFC 4291 text form (with `::` and an embedded dotted quad at the end), no zone, to 16 bytes.
    public static func v6(_ text: some StringProtocol) -> [UInt8]? {
        let text = String(text)
        guard text.contains(":"), text.count >= 2, text.count <= 45 else { return nil }
        var pieces = [text]
        if let gap = text.firstRange(of: "::") {
            pieces = [String(text[..<gap.lowerBound]), String(text[gap.upperBound...])]
            guard !pieces[1].contains("::") else { return nil }
        }
        func groups(_ s: String, allowV4: Bool) -> [UInt16]? {
            if s.isEmpty { return [] }
            var out: [UInt16] = []
            let parts = s.split(separator: ":", omittingEmptySubsequences: false)
            for (i, part) in parts.enumerated() {
                if i == parts.count - 1, allowV4, part.contains("."), let v4 = v4(part) {
                    out += [UInt16(v4.0) << 8 | UInt16(v4.1), UInt16(v4.2) << 8 | UInt16(v4.3)]
                    continue
                }
                guard (1...4).contains(part.count), part.allSatisfy(\.isHexDigit), let value = UInt16(part, radix: 16)
                else { return nil }
                out.append(value)
            }
            return out
        }
        let head: [UInt16]
        let tail: [UInt16]
        if pieces.count == 2 {
            guard let h = groups(pieces[0], allowV4: false), let t = groups(pieces[1], allowV4: true) else {
                return nil
            }
            (head, tail) = (h, t)
        } else {
            guard let h = groups(pieces[0], allowV4: true) else { return nil }
            (head, tail) = (h, [])
        }
        let total = head.count + tail.count
        guard pieces.count == 2 ? total <= 7 : total == 8 else { return nil }
        let words = head + [UInt16](repeating: 0, count: 8 - total) + tail
        return words.flatMap { [UInt8($0 >> 8), UInt8($0 & 0xFF)] }
    }

    /// The bytes of an address literal: 4 for IPv4, 16 for IPv6 (a `%zone` dropped).
    public static func bytes(_ text: String) -> [UInt8]? {
        if let v4 = v4(text) { return [v4.0, v4.1, v4.2, v4.3] }
        return v6(text.split(separator: "%", maxSplits: 1).first ?? "")
    }
}
