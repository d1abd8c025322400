#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// A validated `host:port`: IPv4, bracketed IPv6 or a DNS name, port 1–65535.
public struct HostPort: Sendable, Hashable, CustomStringConvertible {
    /// IPv4 dotted quad, IPv6 without brackets, or a lower-case DNS name.
    public var host: String
    public var port: Int

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    public var isIPv6: Bool { host.contains(":") }

    public var description: String { isIPv6 ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

extension HostPort {
    /// The port Opta LMX listens on by default.
    public static let defaultPort = 1234

    /// `host:port`, `[v6]:port`.
    public static func parse(_ text: String, field: String) throws(PairingError) -> HostPort {
        let authority = try parseAuthority(text, field: field)
        guard let port = authority.port else {
            throw PairingError(.invalidField, field: field, "\(PairingError.quote(text)) has no port: write host:port")
        }
        return HostPort(host: authority.host, port: port)
    }

    /// `host[:port]` or `[v6][:port]`, the port defaulting to Opta LMX's (1234).
    public static func parse(_ text: String, field: String, defaultPort: Int) throws(PairingError) -> HostPort {
        let authority = try parseAuthority(text, field: field)
        return HostPort(host: authority.host, port: authority.port ?? defaultPort)
    }

    /// `host[:port]` or `[v6][:port]`.
    static func parseAuthority(_ text: String, field: String) throws(PairingError) -> (
        host: String, port: Int?, isIPv6: Bool
    ) {
        if let scheme = text.firstRange(of: "://") {
            // A URL pasted where an address goes (`lmx-status --url` prints one). Only its
            // authority is shown: user info, path and query may carry keys.
            var authority = text[scheme.upperBound...].prefix { !"/?#".contains($0) }
            if let at = authority.lastIndex(of: "@") { authority = authority[authority.index(after: at)...] }
            let example =
                authority.isEmpty ? "host:port" : "\(field) \(PairingError.quote(authority).dropFirst().dropLast())"
            throw PairingError(
                .invalidField, field: field, "is a URL: give the server's address and port alone (\(example))")
        }
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else {
                throw PairingError(
                    .invalidField, field: field,
                    "\(PairingError.quote(text)): an IPv6 address in brackets needs its closing ]")
            }
            let host = try parseHost(String(text[...close]), field: field)
            let rest = text[text.index(after: close)...]
            if rest.isEmpty { return (host, nil, true) }
            guard rest.first == ":" else {
                throw PairingError(.invalidField, field: field, "\(PairingError.quote(text)) is not host:port")
            }
            return (host, try parsePort(String(rest.dropFirst()), field: field), true)
        }
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count <= 2 else {
            throw PairingError(
                .invalidField, field: field,
                "\(PairingError.quote(text)): an IPv6 address must be written in brackets, [addr]:port")
        }
        let host = try parseHost(String(parts[0]), field: field)
        return (host, parts.count == 2 ? try parsePort(String(parts[1]), field: field) : nil, false)
    }

    static func parsePort(_ text: String, field: String) throws(PairingError) -> Int {
        guard !text.isEmpty, text.count <= 5, text.allSatisfy(\.isASCIIDigit), let port = Int(text),
            (1...65535).contains(port)
        else {
            throw PairingError(.invalidField, field: field, "\(PairingError.quote(text)) is not a port (1–65535)")
        }
        return port
    }

    /// An IPv4 address, a bracketed IPv6 address (returned without brackets), or a DNS name of at
    /// most 253 characters (returned in lower case, without a trailing dot).
    public static func parseHost(_ text: String, field: String) throws(PairingError) -> String {
        if text.hasPrefix("[") {
            guard text.hasSuffix("]"), text.count > 2 else {
                throw PairingError(
                    .invalidField, field: field, "\(PairingError.quote(text)) is not an IPv6 address in brackets")
            }
            let inner = String(text.dropFirst().dropLast()).lowercased()
            if inner.contains("%") {
                throw PairingError(
                    .invalidField, field: field,
                    "\(PairingError.quote(text)): an address with a zone (%ifname) is not accepted here; a server reachable only by a link-local address is found, with its interface, by lmx-discover (mDNS)"
                )
            }
            guard isIPv6(inner) else {
                throw PairingError(.invalidField, field: field, "\(PairingError.quote(text)) is not an IPv6 address")
            }
            if ServerAddress.isLinkLocalIPv6(inner) {
                // Without its interface, connect() refuses it: nothing could be reached there.
                throw PairingError(
                    .invalidField, field: field,
                    "\(PairingError.quote(text)) is a link-local address, which reaches nothing without its interface; such a server is found, with its interface, by lmx-discover (mDNS)"
                )
            }
            return inner
        }
        if text.contains(":") {
            throw PairingError(
                .invalidField, field: field, "\(PairingError.quote(text)): an IPv6 address must be written in brackets")
        }
        var name = text.lowercased()
        if name.hasSuffix(".") { name.removeLast() }
        guard !name.isEmpty else {
            throw PairingError(.invalidField, field: field, "empty host")
        }
        if name.allSatisfy({ $0.isASCIIDigit || $0 == "." }) {
            guard isIPv4(name) else {
                throw PairingError(.invalidField, field: field, "\(PairingError.quote(text)) is not an IPv4 address")
            }
            return name
        }
        guard name.utf8.count <= 253 else {
            throw PairingError(.invalidField, field: field, "host name longer than 253 characters")
        }
        for label in name.split(separator: ".", omittingEmptySubsequences: false) {
            guard !label.isEmpty, label.utf8.count <= 63, label.first != "-", label.last != "-",
                label.allSatisfy({ $0.isASCIIDigit || ("a"..."z").contains($0) || $0 == "-" })
            else {
                throw PairingError(.invalidField, field: field, "\(PairingError.quote(text)) is not a valid host name")
            }
        }
        return name
    }

    static func isIPv4(_ text: String) -> Bool { IPAddress.v4(text) != nil }

    static func isIPv6(_ text: String) -> Bool { IPAddress.v6(text) != nil }
}
