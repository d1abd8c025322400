/// A server's base URL, parsed once: scheme, host (an IPv4 address, an IPv6 address with its
/// zone, or a name) and port. Routes, pairings and configured endpoints hold one; everything that
/// needs a piece of it (a route's id, the IP to look a path up for, `host:port` for people) asks
/// it instead of splitting text at `://`.
///
/// Parsing is total: text that is not a URL still makes a value (its host a name, its text kept),
/// so that a route can always be shown; ``isWellFormed`` says whether it was one.
public struct BaseURL: Sendable, Hashable, CustomStringConvertible {
    public enum Host: Sendable, Hashable {
        case ipv4(String)
        /// Without brackets; `zone` is the interface of a link-local address (`%25lan0` in a URL).
        case ipv6(String, zone: String?)
        /// A DNS name (lower case), or whatever stood where the host belongs.
        case name(String)
    }

    /// `http`, `https` (lower case), or empty when the text has no `scheme://`.
    public let scheme: String
    public let host: Host
    /// The port written, if any.
    public let port: Int?
    /// Anything after the authority (routes have none; kept so that no text is lost).
    public let suffix: String
    /// The normalized text: lower-case scheme and host, no trailing slash.
    public let text: String

    public init(_ url: String) {
        var s = Substring(url)
        while s.hasSuffix("/") { s.removeLast() }
        guard let separator = s.firstRange(of: "://") else {
            scheme = ""
            host = .name(String(s))
            port = nil
            suffix = ""
            text = String(s)
            return
        }
        scheme = s[..<separator.lowerBound].lowercased()
        let rest = s[separator.upperBound...]
        let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? rest.endIndex
        let authority = Self.lowercased(rest[..<authorityEnd])
        suffix = String(rest[authorityEnd...])
        (host, port) = Self.split(authority)
        text = scheme + "://" + authority + suffix
    }

    /// The authority in lower case, but for an IPv6 zone: an interface's name is kept as it is
    /// written (`eth0` and `ETH0` can be two interfaces).
    private static func lowercased(_ authority: Substring) -> String {
        guard authority.hasPrefix("["), let percent = authority.firstIndex(of: "%"),
            let close = authority.firstIndex(of: "]"), percent < close
        else { return authority.lowercased() }
        return authority[..<percent].lowercased() + authority[percent..<close] + authority[close...].lowercased()
    }

    /// `host[:port]`, `[v6%25zone][:port]`; a host that is neither address is a name.
    private static func split(_ authority: String) -> (Host, Int?) {
        if authority.hasPrefix("["), let close = authority.firstIndex(of: "]") {
            let inner = authority[authority.index(after: authority.startIndex)..<close]
            let afterClose = authority[authority.index(after: close)...]
            let port = afterClose.hasPrefix(":") ? Self.port(afterClose.dropFirst()) : nil
            guard afterClose.isEmpty || port != nil else { return (.name(authority), nil) }  // a broken port
            let parts = inner.replacing("%25", with: "%").split(
                separator: "%", maxSplits: 1, omittingEmptySubsequences: false)
            let address = String(parts.first ?? "")
            guard IPAddress.v6(address) != nil else { return (.name(authority), port) }
            return (.ipv6(address, zone: parts.count == 2 ? String(parts[1]) : nil), port)
        }
        let parts = authority.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count <= 2 else { return (.name(authority), nil) }
        let port = parts.count == 2 ? Self.port(parts[1]) : nil
        guard parts.count == 1 || port != nil else { return (.name(authority), nil) }  // a broken port
        let hostText = String(parts[0])
        return (IPAddress.v4(hostText) != nil ? .ipv4(hostText) : .name(hostText), port)
    }

    private static func port(_ text: Substring) -> Int? {
        guard !text.isEmpty, text.count <= 5, text.allSatisfy(\.isASCIIDigit), let value = Int(text),
            (1...65535).contains(value)
        else { return nil }
        return value
    }

    public var description: String { text }

    /// Plain `http://`.
    public var isPlainHTTP: Bool { scheme == "http" }

    /// `scheme://host[:port]` with nothing after, the scheme http or https, the host not empty.
    public var isWellFormed: Bool {
        guard scheme == "http" || scheme == "https", suffix.isEmpty else { return false }
        if case .name(let name) = host {
            return !name.isEmpty && !name.contains { "@:[]%".contains($0) }
                && !name.unicodeScalars.contains { $0.value < 0x21 || $0.value == 0x7F }
        }
        return true
    }

    /// The authority as written (normalized): `10.0.0.5:1234`, `[fe80::1%25lan0]:1234`.
    public var hostPort: String {
        guard let separator = text.firstRange(of: "://") else { return text }
        let rest = text[separator.upperBound...]
        return String(rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" })
    }

    /// The IP literal to look a path up for (`fe80::1%lan0` with its zone); nil for a name.
    public var ipLiteral: String? {
        switch host {
        case .ipv4(let address): address
        case .ipv6(let address, let zone): zone.map { "\(address)%\($0)" } ?? address
        case .name: nil
        }
    }
}
