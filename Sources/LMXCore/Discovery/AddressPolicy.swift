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
        if a >= 240 {
            return a == 255 && b == 255 && c == 255 && d == 255 ? "the broadcast address" : "a reserved address"
        }
        if a == 169 && b == 254 && (c == 169 && d == 254 || c == 170 && d == 2) { return "a cloud metadata address" }
        return nil
    }

    struct IPv4 {
        let bytes: (UInt8, UInt8, UInt8, UInt8)
        init(bytes: (UInt8, UInt8, UInt8, UInt8)) { self.bytes = bytes }
        init?(_ text: String) {
            guard let bytes = IPAddress.v4(text) else { return nil }
            self.bytes = bytes
        }
    }

    static func parseIPv6(_ text: String) -> [UInt8]? { IPAddress.v6(text) }
}
