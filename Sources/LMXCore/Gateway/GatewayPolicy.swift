/// What the local gateway forwards, to where, with which headers: the rules, apart from the
/// HTTP machinery, so they can be tested on their own.
public enum GatewayPolicy {
    /// Why a request is not forwarded at all.
    public struct Refusal: Sendable, Hashable {
        public var status: Int
        public var code: String
        public var message: String
    }

    /// Headers that belong to one hop (RFC 9110 §7.6.1) plus those the gateway sets itself.
    /// A list, not a set: names are compared in place, ignoring ASCII case, without hashing or
    /// lower-casing a copy (these rules run for every request the gateway forwards).
    static let hopByHop: [String] = [
        "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te", "trailer",
        "transfer-encoding", "upgrade", "host", "content-length",
    ]

    /// Whether `name` is one of `names` (lower case), ignoring ASCII case.
    static func listed(_ name: String, in names: [String]) -> Bool {
        for candidate in names where name.equalsASCIILowercased(candidate) { return true }
        return false
    }

    /// The headers ``refusal(method:path:authority:header:adminEnabled:overTCP:localhostIsOurs:)``
    /// reads (lower case): a request with none of them present needs none looked up.
    public static let refusalHeaders: Set<String> = ["host", "origin", "sec-fetch-site", "upgrade"]

    /// Checks the method, path and browser headers before anything is forwarded.
    /// - Parameters:
    ///   - path: the request target's path, without the query.
    ///   - overTCP: the request came over the TCP listener (where browsers can reach).
    ///   - authority: the request's `Host` (HTTP/1.1) or `:authority`.
    ///   - localhostIsOurs: the agent holds the gateway's port on both loopback families (or
    ///     this machine has no IPv6 loopback), so `localhost` cannot reach someone else first.
    public static func refusal(
        method: String, path: String, authority: String?, headers: [(name: String, value: String)], adminEnabled: Bool,
        overTCP: Bool, localhostIsOurs: Bool = true
    ) -> Refusal? {
        if let refusal = connectionRefusal(headers) { return refusal }
        return refusal(
            method: method, path: path, authority: authority,
            header: { name in headers.first { $0.name.equalsASCIILowercased(name) }?.value },
            adminEnabled: adminEnabled, overTCP: overTCP, localhostIsOurs: localhostIsOurs)
    }

    /// A request whose `Connection` headers list more than ``maxConnectionListed`` names is
    /// refused: each name listed is compared with every header the request carries, and no
    /// client needs more than a few (`keep-alive`, `close`, `te`).
    public static func connectionRefusal(_ headers: [(name: String, value: String)]) -> Refusal? {
        guard connectionListed(headers) == nil else { return nil }
        return Refusal(
            status: 400, code: "too_many_connection_options",
            message:
                "the request's Connection header lists more than \(maxConnectionListed) names; send at most \(maxConnectionListed) (clients normally send only keep-alive or close)"
        )
    }

    /// Methods the gateway never forwards: `TRACE` (and `TRACK`) would echo the request as the
    /// server received it, the route's keys included; `CONNECT` asks for a tunnel.
    public static let refusedMethods: Set<String> = ["TRACE", "TRACK", "CONNECT"]

    /// ``refusal(method:path:authority:headers:adminEnabled:overTCP:localhostIsOurs:)`` with the
    /// headers read through `header` (the first value of a lower-case name, ignoring case).
    public static func refusal(
        method: String, path: String, authority: String?, header: (String) -> String?, adminEnabled: Bool,
        overTCP: Bool, localhostIsOurs: Bool = true
    ) -> Refusal? {
        if refusedMethods.contains(method.uppercased()) {
            return Refusal(
                status: 405, code: "method_not_allowed",
                message:
                    "the gateway does not forward \(method.uppercased()) requests (they would echo the route's keys or open a tunnel); use GET, POST, PUT, PATCH, DELETE, HEAD or OPTIONS"
            )
        }
        // A web page must not use the gateway (and the keys it adds) through DNS rebinding or a
        // cross-site form: the Host must name loopback, and an Origin, if any, must be local.
        if overTCP {
            guard let host = authority ?? header("host"), isLoopbackAuthority(host) else {
                return Refusal(
                    status: 403, code: "forbidden_host",
                    message: "the gateway answers only requests addressed to 127.0.0.1, [::1] or localhost")
            }
            // Clients try ::1 first for `localhost`: while another user holds the port there,
            // a client configured with `localhost` would send its prompts and keys to them.
            if !localhostIsOurs, host.lowercased() == "localhost" || host.lowercased().hasPrefix("localhost:") {
                return Refusal(
                    status: 403, code: "localhost_not_ours",
                    message:
                        "another local user holds the gateway's port on ::1, which `localhost` reaches first: use http://127.0.0.1 instead of localhost"
                )
            }
        }
        let origin = header("origin")
        if let origin, !isLocalOrigin(origin) {
            return Refusal(
                status: 403, code: "forbidden_origin",
                message: "the gateway does not serve web pages from other sites (Origin \(origin.prefix(80)))")
        }
        // What a browser says of any request a page makes, including navigations and <img>
        // loads that carry no Origin: from another site, it is refused like a foreign Origin (a
        // page of this machine's own, with its local Origin, keeps working).
        if header("sec-fetch-site")?.lowercased() == "cross-site", origin == nil {
            return Refusal(
                status: 403, code: "forbidden_site",
                message:
                    "the gateway does not serve requests a browser makes for another site (Sec-Fetch-Site: cross-site)")
        }
        if header("upgrade") != nil {
            return Refusal(
                status: 403, code: "upgrade_refused",
                message:
                    "the gateway does not forward WebSocket or other protocol upgrades; use the HTTP streaming API (\"stream\": true)"
            )
        }
        // Only plain paths: no dot segments, doubled slashes or encoded separators that a server
        // might read differently from this check.
        guard isPlainPath(path) else {
            return Refusal(
                status: 400, code: "bad_path",
                message: "the path has dot segments, doubled slashes or encoded separators")
        }
        // The path without trailing slashes (a lone "/" stays), compared ignoring ASCII case.
        let trimmed = path.utf8.count - trailingSlashes(path)
        func named(_ lower: String) -> Bool { trimmed == lower.utf8.count && path.hasASCIILowercasedPrefix(lower) }
        func under(_ lower: String) -> Bool { trimmed >= lower.utf8.count && path.hasASCIILowercasedPrefix(lower) }
        if named("/v1/chat/stream") {
            return Refusal(
                status: 403, code: "websocket_refused",
                message:
                    "/v1/chat/stream is the server's WebSocket path, which checks no credentials: the gateway never forwards it; use /v1/chat/completions with \"stream\": true"
            )
        }
        if named("/v1") || under("/v1/") { return nil }
        if named("/admin") || under("/admin/") {
            if adminEnabled { return nil }
            return Refusal(
                status: 403, code: "admin_disabled",
                message: "the gateway forwards /admin/* only when gateway.admin is true in the agent's config")
        }
        return Refusal(
            status: 404, code: "not_found",
            message:
                "the gateway forwards /v1/* (the OpenAI-compatible API) only; \(method) \(path.prefix(100)) is not one of them"
        )
    }

    /// Starts with `/`, and has no empty segment before another (`//`), no `.` or `..` segment,
    /// no `\\` and no percent-encoded `/`, `.` or `\\` (`%2f`, `%2e`, `%5c`, either case). One
    /// pass over the bytes.
    static func isPlainPath(_ path: String) -> Bool {
        var path = path
        // Over the contiguous bytes (walking `String.UTF8View` cost about 50 instructions a byte).
        return path.withUTF8 { isPlainPath(bytes: $0) }
    }

    private static func isPlainPath(bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        guard bytes.first == UInt8(ascii: "/") else { return false }
        // The current segment's length and whether it is all dots, so far.
        var length = 0
        var dots = 0
        var percent = 0  // bytes of a `%xx` seen so far (0: none)
        var encoded: UInt8 = 0
        var index = 1
        while index < bytes.count {
            // Past three or more bytes of a word that are none of `\\`, `%` and `/` (most of a
            // segment's: the segment is then longer than `..`, whatever dots it has), to the first
            // that is.
            if percent == 0, bytes.count - index >= 8 {
                let word = ByteWord.word(UnsafeRawBufferPointer(bytes), at: index)
                let plain = ByteWord.firstMarked(
                    ByteWord.bytes(equalTo: 0x5C, in: word) | ByteWord.bytes(equalTo: 0x25, in: word)
                        | ByteWord.bytes(equalTo: 0x2F, in: word))
                if plain >= 3 {
                    length += plain
                    index += plain
                    if plain == 8 { continue }
                }
            }
            let byte = bytes[index]
            index += 1
            if byte == UInt8(ascii: "\\") { return false }
            switch percent {
            case 1:
                encoded = byte
                percent = 2
            case 2:
                let folded = byte >= 0x41 && byte <= 0x5A ? byte | 0x20 : byte
                if encoded == UInt8(ascii: "2"), folded == UInt8(ascii: "f") || folded == UInt8(ascii: "e") {
                    return false
                }
                if encoded == UInt8(ascii: "5"), folded == UInt8(ascii: "c") { return false }
                percent = 0
            default:
                break
            }
            if byte == UInt8(ascii: "%") { percent = 1 }
            if byte == UInt8(ascii: "/") {
                // A segment ends: empty (`//`) or `.` / `..` is not plain.
                if length == 0 || (dots == length && length <= 2) { return false }
                length = 0
                dots = 0
            } else {
                length += 1
                if byte == UInt8(ascii: ".") { dots += 1 }
            }
        }
        // The last segment: empty (a trailing slash) is fine, `.` or `..` is not.
        return !(length > 0 && dots == length && length <= 2)
    }

    /// How many `/` end the path, leaving at least one byte.
    static func trailingSlashes(_ path: String) -> Int {
        var count = 0
        for byte in path.utf8.reversed() {
            guard byte == UInt8(ascii: "/"), count + 1 < path.utf8.count else { break }
            count += 1
        }
        return count
    }

    /// `127.0.0.1[:port]`, `localhost[:port]`, `[::1][:port]` (any 127/8 address).
    /// Byte by byte, ASCII case ignored, without copying the text.
    /// A request over TCP without a `Host` (RFC 9112 §3.2: 400 for HTTP/1.1; an HTTP/1.0 one is
    /// told the same, rather than that it is addressed elsewhere).
    public static let noHost = Refusal(
        status: 400, code: "bad_request",
        message:
            "the request has no Host header (RFC 9112 section 3.2): send Host: 127.0.0.1 with the gateway's port")

    public static func isLoopbackAuthority(_ authority: String) -> Bool {
        var authority = authority
        return authority.withUTF8(isLoopbackAuthority(bytes:))
    }

    private static func isLoopbackAuthority(bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        let count = bytes.count
        // An optional `:port` (digits, possibly none) after the host, which ends at `index`.
        func port(from index: Int) -> Bool {
            if index == count { return true }
            guard bytes[index] == UInt8(ascii: ":") else { return false }
            var digit = index + 1
            while digit < count {
                guard bytes[digit] >= 0x30, bytes[digit] <= 0x39 else { return false }
                digit += 1
            }
            return true
        }
        guard count > 0 else { return false }
        if bytes[0] == UInt8(ascii: "[") {
            // `[::1]` only (the one IPv6 loopback address, as clients write it).
            return count >= 5 && bytes[1] == UInt8(ascii: ":") && bytes[2] == UInt8(ascii: ":")
                && bytes[3] == UInt8(ascii: "1") && bytes[4] == UInt8(ascii: "]") && port(from: 5)
        }
        var hostEnd = 0
        while hostEnd < count, bytes[hostEnd] != UInt8(ascii: ":") { hostEnd += 1 }
        guard port(from: hostEnd) else { return false }
        if hostEnd == 9 {
            var matches = true
            for (offset, expected) in "localhost".utf8.enumerated() {
                let byte = bytes[offset]
                if (byte >= 0x41 && byte <= 0x5A ? byte | 0x20 : byte) != expected {
                    matches = false
                    break
                }
            }
            if matches { return true }
        }
        // A dotted 127/8 address: four parts of 1…3 digits, each at most 255, the first `127`.
        var parts = 0
        var value = 0
        var length = 0
        for index in 0..<hostEnd {
            let byte = bytes[index]
            if byte == UInt8(ascii: ".") {
                guard length > 0, parts < 3, parts > 0 || value == 127 else { return false }
                parts += 1
                value = 0
                length = 0
                continue
            }
            guard byte >= 0x30, byte <= 0x39, length < 3 else { return false }
            value = value * 10 + Int(byte - 0x30)
            length += 1
            guard value <= 255 else { return false }
        }
        return parts == 3 && length > 0
    }

    /// An `Origin` of a page served from this machine (`http://localhost:3000`).
    public static func isLocalOrigin(_ origin: String) -> Bool {
        let lower = origin.lowercased()
        for scheme in ["http://", "https://"] where lower.hasPrefix(scheme) {
            let authority = lower.dropFirst(scheme.count)
            guard !authority.contains("/") else { return false }
            return isLoopbackAuthority(String(authority))
        }
        return false
    }
}
