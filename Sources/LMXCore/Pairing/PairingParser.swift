#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Reads every pairing payload of CONTRACT §4 into `Pairing`s: the v1 token, a bare tunnel URL,
/// the dashboard `/connect` link, the account `/pair` link and the `lmx-connections.json`
/// address book. Strict about what it uses (each value is validated, the field named on error),
/// lenient about what it does not (unknown fields are ignored).
public struct PairingParser: Sendable {
    /// Accept `http://` tunnels (private deployments, tests).
    public var allowInsecure: Bool
    /// Unix seconds, for expiry.
    public var now: Int64

    public static let maxValueBytes = 2048
    public static let maxLinkBytes = 16 * 1024
    public static let maxAddressBookBytes = 1024 * 1024
    public static let maxAddressBookEntries = 1000

    public init(allowInsecure: Bool = false, now: Int64) {
        self.allowInsecure = allowInsecure
        self.now = now
    }

    /// Parses raw bytes (a decoded QR code, a file, standard input).
    public func parse(_ bytes: [UInt8]) throws(PairingError) -> [Pairing] {
        var bytes = bytes[...]
        if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { bytes = bytes.dropFirst(3) }  // UTF-8 BOM
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw PairingError(.notText, "not a pairing: the data is not UTF-8 text (a QR image, a text file with a code or link, or an lmx-connections.json file was expected)")
        }
        return try parse(text)
    }

    public func parse(_ text: String) throws(PairingError) -> [Pairing] {
        let trimmed = text.trimmingASCIIWhitespace()
        guard !trimmed.isEmpty else {
            throw PairingError(.empty, "empty: no pairing code or link in it")
        }
        if trimmed.first == "{" || trimmed.first == "[" {
            return try parseAddressBook(trimmed)
        }
        guard trimmed.utf8.count <= Self.maxLinkBytes else {
            throw PairingError(.tooLong, "longer than \(Self.maxLinkBytes) bytes: not a pairing code or link")
        }
        if trimmed.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) {
            throw PairingError(.controlCharacter, "contains a control character (a pairing code or link is a single line of text)")
        }
        let lower = trimmed.lowercased()
        if lower.hasPrefix("opta-lmx:") {
            return [try parseToken(trimmed)]
        }
        if lower.hasPrefix("https://") || lower.hasPrefix("http://") {
            return [try parseLink(trimmed)]
        }
        throw PairingError(
            .unknownFormat,
            "not a pairing code or link: expected opta-lmx://pair?v=1&…, an https:// tunnel URL, a /connect or /pair link, or an lmx-connections.json address book")
    }

    // MARK: - The v1 token

    func parseToken(_ text: String) throws(PairingError) -> Pairing {
        let url = try SplitURL(text)
        guard url.scheme == "opta-lmx", url.host.lowercased() == "pair", url.port == nil, !url.hasUserInfo,
            url.path.isEmpty || url.path == "/"
        else {
            throw PairingError(.malformed, "an opta-lmx:// code must start with opta-lmx://pair?")
        }
        let query = try Query(url.queryItems)
        guard let version = query["v"] else {
            throw PairingError(.missingField, field: "v", "missing: this code carries no format version (v=1)")
        }
        guard version == "1" else {
            throw PairingError(
                .unsupportedVersion, field: "v",
                "pairing format version \(PairingError.quote(version)) is not supported (this lmx-pair reads v=1): update lmx-agent or make a v1 code")
        }
        guard let urlText = query["url"], !urlText.isEmpty else {
            throw PairingError(.missingField, field: "url", "missing: a v1 code must carry the tunnel URL")
        }
        var wan = try tunnel(urlText, field: "url")
        let cfID = query["cf_id"].nonBlank, cfSecret = query["cf_secret"].nonBlank
        if (cfID == nil) != (cfSecret == nil) {
            throw PairingError(
                .invalidField, field: cfID == nil ? "cf_id" : "cf_secret",
                "missing: a Cloudflare Access service token needs both cf_id and cf_secret")
        }
        wan.credentials = Credentials(
            adminKey: query["key"], inferenceKey: query["api_key"], accessClientID: cfID, accessClientSecret: cfSecret)
        var expires: Int64?
        if let exp = query["exp"] {
            guard !exp.isEmpty, exp.count <= 12, exp.allSatisfy(\.isASCIIDigit), let value = Int64(exp) else {
                throw PairingError(.invalidField, field: "exp", "\(PairingError.quote(exp)) is not a time in Unix seconds")
            }
            guard value > now else {
                throw PairingError(
                    .expired, field: "exp",
                    "this pairing code expired at \(Timestamp.iso8601(Double(value))): ask for a new one")
            }
            expires = value
        }
        let lan = try query["lan"].nonBlank.map { text throws(PairingError) in try HostPort.parse(text, field: "lan") }
        let instance = query["instance"].nonBlank
        return Pairing(name: query["name", plusIsSpace: true].nonBlank, format: .token, wan: wan, lan: lan, instance: instance, expiresAt: expires)
    }

    // MARK: - Links

    func parseLink(_ text: String, unwrapped: Int = 0) throws(PairingError) -> Pairing {
        let url = try SplitURL(text, field: "url")
        let last = url.path.split(separator: "/").last.map { $0.lowercased() }
        let query = try Query(url.queryItems)
        if Self.isOptaWebApp(host: url.host) && last != "connect" && last != "pair" {
            // The desktop manager's and dashboard's pairing link: the /pair (or /connect) link
            // wrapped in a sign-in redirect. An Opta web-app page is never a tunnel.
            guard let target = query["redirect_to"].nonBlank ?? query["redirect"].nonBlank ?? query["next"].nonBlank else {
                throw PairingError(
                    .unknownFormat,
                    "\(url.scheme)://\(url.authority) is an Opta web-app page, not a server or tunnel: use the pairing link or QR code the desktop manager or dashboard shows")
            }
            guard unwrapped < 2 else {
                throw PairingError(.malformed, field: "redirect_to", "redirects more than twice: not a pairing link")
            }
            // A relative target is on the same site.
            let absolute = target.hasPrefix("/") ? "https://\(url.authority)\(target)" : target
            guard absolute.lowercased().hasPrefix("https://") else {
                throw PairingError(.invalidField, field: "redirect_to", "must be an https:// /pair or /connect link")
            }
            let inner: Pairing
            do {
                inner = try parseLink(absolute, unwrapped: unwrapped + 1)
            } catch {
                var error = error
                error.field = error.field.map { "redirect_to.\($0)" } ?? "redirect_to"
                throw error
            }
            guard inner.format == .pairLink || inner.format == .connectLink else {
                throw PairingError(.invalidField, field: "redirect_to", "does not lead to a /pair or /connect link")
            }
            return inner
        }
        switch last {
        case "connect":
            // Dashboard connect link: a LAN host, and maybe a tunnel; no secrets.
            let lan = try lanEndpoint(query)
            var wan: WANEndpoint?
            if let tunnelText = query["tunnel"].nonBlank {
                guard tunnelText.lowercased().hasPrefix("https://") || (allowInsecure && tunnelText.lowercased().hasPrefix("http://")) else {
                    throw PairingError(.insecure, field: "tunnel", "a connect link's tunnel must be an https:// URL")
                }
                wan = try tunnel(tunnelText, field: "tunnel")
            }
            return Pairing(name: query["name", plusIsSpace: true].nonBlank, format: .connectLink, wan: wan, lan: lan)
        case "pair":
            // Account pairing link: only host and port matter here.
            return Pairing(format: .pairLink, lan: try lanEndpoint(query))
        default:
            // A bare tunnel URL, `key` optional (the admin key); the path is dropped.
            var wan = try tunnel(text, field: "url")
            wan.credentials = Credentials(adminKey: query["key"])
            return Pairing(format: .tunnelURL, wan: wan)
        }
    }

    private func lanEndpoint(_ query: Query) throws(PairingError) -> HostPort {
        guard let host = query["host"].nonBlank else {
            throw PairingError(.missingField, field: "host", "missing: the link names no server host")
        }
        let port: Int
        if let portText = query["port"] {
            port = try HostPort.parsePort(portText, field: "port")
        } else {
            port = HostPort.defaultPort
        }
        return HostPort(host: try HostPort.parseHost(host, field: "host"), port: port)
    }

    /// A tunnel base URL: `https://host[:port]`, no user info; the path is dropped.
    func tunnel(_ text: String, field: String) throws(PairingError) -> WANEndpoint {
        let url = try SplitURL(text, field: field)
        switch url.scheme {
        case "https": break
        case "http":
            guard allowInsecure else {
                throw PairingError(
                    .insecure, field: field,
                    "a plain http:// tunnel would send its keys unencrypted: refused (pass --allow-insecure for a private test setup)")
            }
        default:
            throw PairingError(.invalidField, field: field, "must be an https:// URL")
        }
        if url.hasUserInfo {
            throw PairingError(.invalidField, field: field, "must not carry a user name or password (user@host)")
        }
        if Self.isOptaWebApp(host: url.host) {
            throw PairingError(
                .invalidField, field: field,
                "\(url.authority) is an Opta web-app address (optalocal.com), never a tunnel: use the server's trycloudflare.com or own tunnel URL")
        }
        guard !url.host.isEmpty else {
            throw PairingError(.invalidField, field: field, "names no host (https://host…)")
        }
        // A percent-encoded host means its decoded name (RFC 3986 reg-name).
        let host = try HostPort.parseHost(try Query.decode(url.host, field: field), field: field)
        var base = "\(url.scheme)://\(url.host.hasPrefix("[") ? "[\(host)]" : host)"
        if let port = url.port {
            guard (1...65535).contains(port) else {
                throw PairingError(.invalidField, field: field, "\(port) is not a port (1–65535)")
            }
            base += ":\(port)"
        }
        return WANEndpoint(url: base)
    }

    // MARK: - Address book

    func parseAddressBook(_ text: String) throws(PairingError) -> [Pairing] {
        guard text.utf8.count <= Self.maxAddressBookBytes else {
            throw PairingError(.tooLong, "address book larger than 1 MiB: not an lmx-connections.json file")
        }
        let book: AddressBook
        do {
            if text.first == "[" {
                book = AddressBook(entries: try JSONDecoder().decode([AddressBook.Entry].self, from: Data(text.utf8)))
            } else {
                book = try JSONDecoder().decode(AddressBook.self, from: Data(text.utf8))
            }
        } catch let error as PairingError {
            throw error
        } catch let error as DecodingError {
            throw PairingError(.malformed, "not a valid lmx-connections.json address book: \(AgentConfiguration.describe(error))")
        } catch {
            throw PairingError(.malformed, "not a valid lmx-connections.json address book")
        }
        guard !book.entries.isEmpty else {
            throw PairingError(.empty, field: "entries", "the address book has no entries")
        }
        guard book.entries.count <= Self.maxAddressBookEntries else {
            throw PairingError(.tooLong, field: "entries", "more than \(Self.maxAddressBookEntries) entries")
        }
        var pairings: [Pairing] = []
        for (index, entry) in book.entries.enumerated() {
            let at = "entries[\(index)]"
            for (key, value) in [("label", entry.label), ("host", entry.host), ("tunnelUrl", entry.tunnel), ("id", entry.id)] {
                if let value { try Self.checkValue(value, field: "\(at).\(key)") }
            }
            var lan: HostPort?
            if let host = entry.host.nonBlank {
                let port = entry.port ?? HostPort.defaultPort
                guard (1...65535).contains(port) else {
                    throw PairingError(.invalidField, field: "\(at).port", "\(port) is not a port (1–65535)")
                }
                lan = HostPort(host: try HostPort.parseHost(host, field: "\(at).host"), port: port)
            }
            var wan: WANEndpoint?
            if let tunnelText = entry.tunnel.nonBlank {
                wan = try tunnel(tunnelText, field: "\(at).tunnelUrl")
            }
            guard lan != nil || wan != nil else {
                throw PairingError(.missingField, field: at, "neither host nor tunnelUrl: nothing to connect to")
            }
            pairings.append(Pairing(name: entry.label.nonBlank, format: .addressBook, wan: wan, lan: lan))
        }
        return pairings
    }

    /// `optalocal.com` and its subdomains serve the Opta web apps (sign-in, dashboard, the
    /// /connect and /pair pages), not LMX servers.
    static func isOptaWebApp(host: String) -> Bool {
        var host = Substring(host.lowercased())
        while host.hasSuffix(".") { host = host.dropLast() }
        return host == "optalocal.com" || host.hasSuffix(".optalocal.com")
    }

    static func checkValue(_ value: String, field: String) throws(PairingError) {
        guard value.utf8.count <= maxValueBytes else {
            throw PairingError(.tooLong, field: field, "longer than \(maxValueBytes) bytes")
        }
        if value.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) {
            throw PairingError(.controlCharacter, field: field, "contains a control character")
        }
    }
}

/// `lmx-connections.json`, as the Opta desktop manager writes it (camelCase or snake_case).
struct AddressBook: Decodable {
    struct Entry: Decodable {
        var id: String?
        var label: String?
        var host: String?
        var port: Int?
        var tunnel: String?

        enum Keys: String, CodingKey {
            case id, label, host, port, tunnelUrl, tunnel_url
        }

        init(from decoder: any Decoder) throws {
            let c = try decoder.container(keyedBy: Keys.self)
            id = try? c.decodeIfPresent(String.self, forKey: .id)
            label = try c.decodeIfPresent(String.self, forKey: .label)
            host = try c.decodeIfPresent(String.self, forKey: .host)
            if let number = try? c.decodeIfPresent(Int.self, forKey: .port) {
                port = number
            } else if let text = try? c.decodeIfPresent(String.self, forKey: .port) {
                guard let number = Int(text) else {
                    throw DecodingError.dataCorruptedError(forKey: .port, in: c, debugDescription: "not a port number")
                }
                port = number
            } else if c.contains(.port), try !c.decodeNil(forKey: .port) {
                throw DecodingError.dataCorruptedError(forKey: .port, in: c, debugDescription: "not a port number")
            }
            tunnel = try c.decodeIfPresent(String.self, forKey: .tunnelUrl) ?? c.decodeIfPresent(String.self, forKey: .tunnel_url)
        }
    }

    var entries: [Entry]

    init(entries: [Entry]) { self.entries = entries }
}

// MARK: - URL pieces

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
            throw PairingError(.malformed, field: broken.field ?? field, "broken percent-encoding (% must be followed by two hex digits)")
        }
        guard let components = URLComponents(string: text, encodingInvalidCharacters: false)
                ?? URLComponents(string: Self.encodingStrays(text), encodingInvalidCharacters: false),
            let scheme = components.scheme, let host = components.percentEncodedHost
        else {
            // Only what comes before the query is shown: the query may carry keys.
            let shown = text.prefix { $0 != "?" && $0 != "#" }
            throw PairingError(.malformed, field: field, "\(PairingError.quote(shown)) is not a valid URL (is the port a number, and the host well formed?)")
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
            let start = bytes[..<index].lastIndex { $0 == UInt8(ascii: "&") || $0 == UInt8(ascii: "?") }.map { $0 + 1 } ?? query + 1
            guard let equals = bytes[start..<index].firstIndex(of: UInt8(ascii: "=")) else { return BrokenEscape(field: "query") }
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
                throw PairingError(.duplicateField, field: name, "appears more than once: refused (which one would be meant?)")
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
        return try? Query.decode(String(raw.split(separator: "+", omittingEmptySubsequences: false).joined(separator: "%20")), field: name)
    }

    /// Percent-decodes one name or value that `URLComponents` has split off a query (so its `%XX`
    /// forms are well formed).
    static func decode(_ encoded: String, field: String) throws(PairingError) -> String {
        guard encoded.contains("%") else { return encoded }
        // Parsed, not assigned: URLComponents' setters trap on what they refuse, its parser returns nil.
        guard let decoded = URLComponents(string: "lmx:?v=" + encoded, encodingInvalidCharacters: false)?.queryItems?.first?.value
        else {
            throw PairingError(.malformed, field: field, "percent-encoding does not decode to UTF-8 text")
        }
        return decoded
    }
}

// MARK: - Hosts and ports

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

    /// `host[:port]` or `[v6][:port]`.
    static func parseAuthority(_ text: String, field: String) throws(PairingError) -> (host: String, port: Int?, isIPv6: Bool) {
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else {
                throw PairingError(.invalidField, field: field, "\(PairingError.quote(text)): an IPv6 address in brackets needs its closing ]")
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
            throw PairingError(.invalidField, field: field, "\(PairingError.quote(text)): an IPv6 address must be written in brackets, [addr]:port")
        }
        let host = try parseHost(String(parts[0]), field: field)
        return (host, parts.count == 2 ? try parsePort(String(parts[1]), field: field) : nil, false)
    }

    static func parsePort(_ text: String, field: String) throws(PairingError) -> Int {
        guard !text.isEmpty, text.count <= 5, text.allSatisfy(\.isASCIIDigit), let port = Int(text), (1...65535).contains(port) else {
            throw PairingError(.invalidField, field: field, "\(PairingError.quote(text)) is not a port (1–65535)")
        }
        return port
    }

    /// An IPv4 address, a bracketed IPv6 address (returned without brackets), or a DNS name of at
    /// most 253 characters (returned in lower case, without a trailing dot).
    public static func parseHost(_ text: String, field: String) throws(PairingError) -> String {
        if text.hasPrefix("[") {
            guard text.hasSuffix("]"), text.count > 2 else {
                throw PairingError(.invalidField, field: field, "\(PairingError.quote(text)) is not an IPv6 address in brackets")
            }
            let inner = String(text.dropFirst().dropLast()).lowercased()
            guard isIPv6(inner) else {
                throw PairingError(.invalidField, field: field, "\(PairingError.quote(text)) is not an IPv6 address")
            }
            return inner
        }
        if text.contains(":") {
            throw PairingError(.invalidField, field: field, "\(PairingError.quote(text)): an IPv6 address must be written in brackets")
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

    static func isIPv4(_ text: String) -> Bool {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 4
            && parts.allSatisfy { part in
                !part.isEmpty && part.count <= 3 && part.allSatisfy(\.isASCIIDigit) && (part.count == 1 || part.first != "0")
                    && Int(part)! <= 255
            }
    }

    static func isIPv6(_ text: String) -> Bool {
        guard text.count >= 2, text.count <= 45, text.contains(":") else { return false }
        var groupsText = text
        if let lastColon = text.lastIndex(of: ":"), text[lastColon...].contains(".") {
            guard isIPv4(String(text[text.index(after: lastColon)...])) else { return false }
            groupsText = String(text[...lastColon]) + "0:0"
        }
        var halves: [String] = []
        if let range = groupsText.firstRange(of: "::") {
            halves = [String(groupsText[..<range.lowerBound]), String(groupsText[range.upperBound...])]
            if halves[1].contains("::") { return false }
        } else {
            halves = [groupsText]
        }
        guard halves.count <= 2 else { return false }
        func groups(_ s: String) -> [Substring]? {
            if s.isEmpty { return [] }
            let g = s.split(separator: ":", omittingEmptySubsequences: false)
            guard g.allSatisfy({ !$0.isEmpty && $0.count <= 4 && $0.allSatisfy(\.isHexDigit) }) else { return nil }
            return g
        }
        guard let first = groups(halves[0]) else { return false }
        if halves.count == 2 {
            guard let second = groups(halves[1]) else { return false }
            return first.count + second.count <= 7
        }
        return first.count == 8
    }
}

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
