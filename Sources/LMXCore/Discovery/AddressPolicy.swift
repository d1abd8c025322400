/// Which announced addresses the agent may connect to. An mDNS answer is written by whoever is on
/// the LAN: a host announcing `127.0.0.1`, `0.0.0.0` or a cloud metadata address would otherwise
/// make the agent (and every client that follows it) talk to a service on this machine or to
/// something that is not a LAN server at all.
public enum AddressPolicy {
    /// Why an announced address is refused, or `nil` when it may be probed.
    /// - Parameters:
    ///   - address: the resolved address, IPv6 possibly with `%zone`.
    ///   - onLoopbackInterface: the sighting came in on `lo`, i.e. from this machine's own
    ///     avahi-daemon (a server on this machine): only then is a loopback address accepted.
    public static func refusal(_ address: String, onLoopbackInterface: Bool) -> String? {
        if let v4 = IPv4(address) {
            return refusal(v4: v4, onLoopbackInterface: onLoopbackInterface)
        }
        let bare = address.split(separator: "%", maxSplits: 1).first.map(String.init) ?? address
        guard let v6 = parseIPv6(bare) else { return "not an IP address" }
        // IPv4-mapped (::ffff:a.b.c.d) and IPv4-compatible (::a.b.c.d) forms follow the IPv4 rules.
        let mapped = v6[0..<10].allSatisfy { $0 == 0 } && v6[10] == 0xFF && v6[11] == 0xFF
        let compatible = v6[0..<12].allSatisfy { $0 == 0 } && !v6[12..<15].allSatisfy { $0 == 0 }
        if mapped || compatible {
            return refusal(v4: IPv4(bytes: (v6[12], v6[13], v6[14], v6[15])), onLoopbackInterface: false)
        }
        if v6.allSatisfy({ $0 == 0 }) { return "the unspecified address" }
        if v6[0..<15].allSatisfy({ $0 == 0 }) && v6[15] == 1 {
            return onLoopbackInterface ? nil : "a loopback address announced from another host"
        }
        if v6[0] == 0xFF { return "a multicast address" }
        // fd00:ec2::254, the EC2 metadata service over IPv6.
        if v6 == [0xFD, 0, 0x0E, 0xC2] + [UInt8](repeating: 0, count: 10) + [0x02, 0x54] {
            return "a cloud metadata address"
        }
        return nil
    }

    private static func refusal(v4: IPv4, onLoopbackInterface: Bool) -> String? {
        let (a, b, c, d) = v4.bytes
        if a == 127 { return onLoopbackInterface ? nil : "a loopback address announced from another host" }
        if a == 0 { return "the unspecified address" }
        if a >= 224 && a <= 239 { return "a multicast address" }
        if a >= 240 { return a == 255 && b == 255 && c == 255 && d == 255 ? "the broadcast address" : "a reserved address" }
        if a == 169 && b == 254 && (c == 169 && d == 254 || c == 170 && d == 2) { return "a cloud metadata address" }
        return nil
    }

    struct IPv4 {
        let bytes: (UInt8, UInt8, UInt8, UInt8)
        init(bytes: (UInt8, UInt8, UInt8, UInt8)) { self.bytes = bytes }
        /// Dotted quad only, four decimal parts of 0–255 (no octal, hex or short forms).
        init?(_ text: String) {
            let parts = text.split(separator: ".", omittingEmptySubsequences: false)
            guard parts.count == 4 else { return nil }
            var out: [UInt8] = []
            for part in parts {
                guard (1...3).contains(part.count), part.allSatisfy(\.isASCII), let v = UInt8(part) else { return nil }
                out.append(v)
            }
            bytes = (out[0], out[1], out[2], out[3])
        }
    }

    /// RFC 4291 text form (with `::` and an embedded dotted quad) to 16 bytes.
    static func parseIPv6(_ text: String) -> [UInt8]? {
        guard text.contains(":"), text.count <= 45 else { return nil }
        var head: [UInt16] = [], tail: [UInt16] = []
        var sawGap = false
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
                if i == parts.count - 1, allowV4, part.contains("."), let v4 = IPv4(String(part)) {
                    out.append(UInt16(v4.bytes.0) << 8 | UInt16(v4.bytes.1))
                    out.append(UInt16(v4.bytes.2) << 8 | UInt16(v4.bytes.3))
                    continue
                }
                guard (1...4).contains(part.count), let v = UInt16(part, radix: 16) else { return nil }
                out.append(v)
            }
            return out
        }
        if pieces.count == 2 {
            sawGap = true
            guard let h = groups(pieces[0], allowV4: false), let t = groups(pieces[1], allowV4: true) else { return nil }
            head = h
            tail = t
        } else {
            guard let h = groups(pieces[0], allowV4: true) else { return nil }
            head = h
        }
        let total = head.count + tail.count
        guard sawGap ? total <= 7 : total == 8 else { return nil }
        let words = head + [UInt16](repeating: 0, count: 8 - total) + tail
        return words.flatMap { [UInt8($0 >> 8), UInt8($0 & 0xFF)] }
    }
}
