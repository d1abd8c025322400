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
            throw PairingError(
                .notText,
                "not a pairing: the data is not UTF-8 text (a QR image, a text file with a code or link, or an lmx-connections.json file was expected)"
            )
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
            throw PairingError(
                .controlCharacter, "contains a control character (a pairing code or link is a single line of text)")
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
            "not a pairing code or link: expected opta-lmx://pair?v=1&…, an https:// tunnel URL, a /connect or /pair link, or an lmx-connections.json address book"
        )
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
                "pairing format version \(PairingError.quote(version)) is not supported (this lmx-pair reads v=1): update lmx-agent or make a v1 code"
            )
        }
        guard let urlText = query["url"], !urlText.isEmpty else {
            throw PairingError(.missingField, field: "url", "missing: a v1 code must carry the tunnel URL")
        }
        var wan = try tunnel(urlText, field: "url")
        let cfID = query["cf_id"].nonBlank
        let cfSecret = query["cf_secret"].nonBlank
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
                throw PairingError(
                    .invalidField, field: "exp", "\(PairingError.quote(exp)) is not a time in Unix seconds")
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
        return Pairing(
            name: query["name", plusIsSpace: true].nonBlank, format: .token, wan: wan, lan: lan, instance: instance,
            expiresAt: expires)
    }

    // MARK: - Links

    func parseLink(_ text: String, unwrapped: Int = 0) throws(PairingError) -> Pairing {
        let url = try SplitURL(text, field: "url")
        let last = url.path.split(separator: "/").last.map { $0.lowercased() }
        let query = try Query(url.queryItems)
        if Self.isOptaWebApp(host: url.host) && last != "connect" && last != "pair" {
            // The desktop manager's and dashboard's pairing link: the /pair (or /connect) link
            // wrapped in a sign-in redirect. An Opta web-app page is never a tunnel.
            guard let target = query["redirect_to"].nonBlank ?? query["redirect"].nonBlank ?? query["next"].nonBlank
            else {
                throw PairingError(
                    .unknownFormat,
                    "\(url.scheme)://\(url.authority) is an Opta web-app page, not a server or tunnel: use the pairing link or QR code the desktop manager or dashboard shows"
                )
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
                guard
                    tunnelText.lowercased().hasPrefix("https://")
                        || (allowInsecure && tunnelText.lowercased().hasPrefix("http://"))
                else {
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
                    "a plain http:// tunnel would send its keys unencrypted: refused (pass --allow-insecure for a private test setup)"
                )
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
                "\(url.authority) is an Opta web-app address (optalocal.com), never a tunnel: use the server's trycloudflare.com or own tunnel URL"
            )
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
            throw PairingError(
                .malformed, "not a valid lmx-connections.json address book: \(AgentConfiguration.describe(error))")
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
            for (key, value) in [
                ("label", entry.label), ("host", entry.host), ("tunnelUrl", entry.tunnel), ("id", entry.id),
            ] {
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
