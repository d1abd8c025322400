/// What vouches that a route leads to a server the user set up (CONTRACT §7). An `instance_id`,
/// a name or a TXT record sent over plain HTTP or mDNS is a claim anyone on the LAN can repeat;
/// only what the user wrote and what the server says through its tunnel are trusted.
public enum RouteTrust: String, Sendable, Hashable, Codable, CaseIterable {
    /// The user wrote this address: a pairing's `lan=`, a `/connect` or `/pair` link's host and
    /// port, an address-book entry, a configured endpoint, or the tunnel itself.
    case user = "vouched-by-user"
    /// The server listed this address in its discovery document, read through its tunnel
    /// (HTTPS, verified certificate, Access token where set).
    case tunnel = "vouched-by-tunnel"
    /// Announced over mDNS (or remembered from an announcement) and vouched for by nobody.
    case announced
    /// Announced from an address nobody vouches for, yet claiming the `instance_id` of a server
    /// the user set up: never sent a key or a request, never active.
    case impostor

    /// A route to a server the user set up.
    public var isVouched: Bool { self == .user || self == .tunnel }
}

/// The LAN addresses a server vouches for through its tunnel.
public enum TunnelVouch {
    /// Addresses taken from one document at most (a real server lists a handful).
    public static let maxAddresses = 16

    /// The base URLs a discovery document read through a tunnel vouches for: its
    /// `endpoints.base_urls` and `preferred_base_url`, kept only when the host is an IP address
    /// a LAN server can have. Loopback names the server's own machine, never this one; a host
    /// name is resolved by whoever answers on the LAN, so it vouches for nothing (an address
    /// the user wrote is vouched for already). Unspecified, multicast, broadcast, metadata and
    /// link-local addresses are dropped, as in announcements.
    /// - Returns: normalised `http://host:port` (or `https://`) URLs, in the document's order,
    ///   without duplicates, at most `maxAddresses`.
    public static func lanBaseURLs(_ advertised: [String]) -> [String] {
        var result: [String] = []
        for text in advertised {
            guard let url = lanBaseURL(text), !result.contains(url) else { continue }
            result.append(url)
            if result.count == maxAddresses { break }
        }
        return result
    }

    /// One advertised URL as a vouched LAN base URL, or nil.
    static func lanBaseURL(_ text: String) -> String? {
        guard text.utf8.count <= 512 else { return nil }
        let url = BaseURL(text)
        let scheme = url.scheme
        let authority = url.hostPort
        guard scheme == "http" || scheme == "https", !authority.contains("@"),
            let parsed = try? HostPort.parseAuthority(authority, field: "endpoints.base_urls"),
            parsed.isIPv6 || HostPort.isIPv4(parsed.host)
        else { return nil }
        guard AddressPolicy.refusal(parsed.host, onLoopbackInterface: false) == nil,
            !ServerAddress.isLinkLocalIPv6(parsed.host)
        else { return nil }
        let port = parsed.port ?? (scheme == "https" ? 443 : 80)
        return "\(scheme)://\(HostPort(host: parsed.host, port: port))"
    }
}
