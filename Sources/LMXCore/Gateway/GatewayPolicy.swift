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

    /// The headers sent upstream: the client's, minus hop-by-hop ones, plus the route's
    /// credentials. Where the route carries a key for the path, that key is sent and the client's
    /// own key header of that kind is not forwarded: the official OpenAI SDKs always send an
    /// `Authorization` (a placeholder when the user has no key), and it must not replace the
    /// route's. A client's own `Authorization` / `X-Api-Key` (or `X-Admin-Key`) travels only to a
    /// route that has no key of that kind. The Cloudflare Access token is always the route's.
    public static func upstreamHeaders(
        client: [(name: String, value: String)], credentials: Credentials, path: String, userAgent: String
    ) -> [(name: String, value: String)] {
        // (A request listing too many is refused before it comes here: connectionRefusal(_:).)
        let rule = UpstreamHeaderRule(
            connectionListed: connectionListed(client) ?? [], credentials: credentials, path: path)
        var out: [(name: String, value: String)] = []
        out.reserveCapacity(client.count + rule.routeHeaders.count + 1)
        var hasUserAgent = false
        for header in client where rule.keeps(header.name) {
            out.append(header)
            if header.name.equalsASCIILowercased("user-agent") { hasUserAgent = true }
        }
        out.append(contentsOf: rule.routeHeaders)
        if !hasUserAgent { out.append(("User-Agent", userAgent)) }
        return out
    }

    /// Which of a client's headers travel upstream (``upstreamHeaders(client:credentials:path:userAgent:)``),
    /// one name at a time: as a `String`, or as the client's bytes (the data path makes no
    /// `String` of the headers it passes on).
    public struct UpstreamHeaderRule: Sendable {
        /// The route's headers for the path (its credentials), sent after the client's.
        public let routeHeaders: [(name: String, value: String)]
        /// What the client's `Connection` lists, and the client headers the route's replace (lower case).
        private let connectionListed: [String]
        private let replaced: [String]
        private let listedBytes: [[UInt8]]

        public init(connectionListed: [String], credentials: Credentials, path: String) {
            routeHeaders = credentials.headers(forPath: path)
            var replaced = routeHeaders.map { $0.name.lowercased() }
            if replaced.contains("authorization") { replaced.append("x-api-key") }
            self.replaced = replaced
            self.connectionListed = connectionListed
            listedBytes = (connectionListed + replaced).map { Array($0.utf8) }
        }

        public func keeps(_ name: String) -> Bool {
            // Cookies are not scoped by port: another local app's cookies never travel on.
            !GatewayPolicy.listed(name, in: GatewayPolicy.droppedUpstream)
                && (connectionListed.isEmpty || !GatewayPolicy.listed(name, in: connectionListed))
                && (replaced.isEmpty || !GatewayPolicy.listed(name, in: replaced))
        }

        /// ``keeps(_:)`` for a name as the client's bytes (a token).
        public func keeps(nameBytes name: UnsafeRawBufferPointer) -> Bool {
            let count = name.count
            for dropped in count < GatewayPolicy.droppedUpstreamByLength.count
                ? GatewayPolicy.droppedUpstreamByLength[count] : GatewayPolicy.droppedUpstreamBytes
            where dropped.withUnsafeBytes({ GatewayPolicy.equalsFolded(name, $0) }) {
                return false
            }
            for listed in listedBytes where listed.withUnsafeBytes({ GatewayPolicy.equalsFolded(name, $0) }) {
                return false
            }
            return true
        }
    }

    /// Cookies, and `Expect`: the gateway itself answers a client's `100-continue` and reads the
    /// body before or as it forwards it; the server is never asked to wait.
    private static let droppedUpstream: [String] = hopByHop + ["cookie", "expect"]
    private static let droppedUpstreamBytes: [[UInt8]] = droppedUpstream.map { Array($0.utf8) }
    private static let droppedUpstreamByLength: [[[UInt8]]] = (0..<64).map { length in
        droppedUpstreamBytes.filter { $0.count == length }
    }

    /// The request carries a key of its own that would travel upstream: an `Authorization` or
    /// `X-Api-Key`. Only meaningful for routes without an inference key (the route's wins).
    public static func clientHasKey(_ headers: [(name: String, value: String)]) -> Bool {
        headers.contains { listed($0.name, in: clientKeyHeaders) }
    }

    /// The headers that carry a client's own key (``clientHasKey(_:)``).
    public static let clientKeyHeaders = ["authorization", "x-api-key"]

    /// The headers sent back to the client: the server's, minus hop-by-hop ones and cookies
    /// (cookies are not scoped by port: they would reach every local app), and minus whatever
    /// the gateway sets itself (`securityHeaders`).
    /// Nil when the answer's `Connection` lists more than ``maxConnectionListed`` names (the
    /// gateway answers 502: no server needs that many).
    public static func downstreamHeaders(_ upstream: [(name: String, value: String)]) -> [(
        name: String, value: String
    )]? {
        guard let connectionListed = connectionListed(upstream) else { return nil }
        return upstream.filter { keepsDownstream($0.name, connectionListed: connectionListed) }
    }

    /// Whether an answer's header `name` reaches the client (``downstreamHeaders(_:)``, one
    /// header at a time), given what the answer's `Connection` lists (``connectionListed(_:)``).
    public static func keepsDownstream(_ name: String, connectionListed: [String]) -> Bool {
        !listed(name, in: droppedDownstream) && (connectionListed.isEmpty || !listed(name, in: connectionListed))
    }

    /// ``keepsDownstream(_:connectionListed:)`` for a name as the server's bytes (a token), so
    /// that the data path need not make a `String` of every header it passes on.
    public static func keepsDownstream(nameBytes name: UnsafeRawBufferPointer, connectionListed: [String]) -> Bool {
        // Compared only with the dropped names of its length (most have none: told by one bit).
        let count = name.count
        if count < 64, droppedLengths & (1 << UInt64(count)) == 0 {
            return connectionListed.isEmpty || keepsListed(name, connectionListed)
        }
        for dropped in count < droppedByLength.count ? droppedByLength[count] : droppedDownstreamBytes
        where dropped.withUnsafeBytes({ equalsFolded(name, $0) }) {
            return false
        }
        return keepsListed(name, connectionListed)
    }

    /// `name` is none of the names `Connection` listed.
    private static func keepsListed(_ name: UnsafeRawBufferPointer, _ connectionListed: [String]) -> Bool {
        for listed in connectionListed {
            var listed = listed
            if listed.withUTF8({ equalsFolded(name, UnsafeRawBufferPointer($0)) }) { return false }
        }
        return true
    }

    /// Bit `n`: a dropped name is `n` bytes long (names of 64 bytes and more: compared with all).
    private static let droppedLengths: UInt64 = droppedDownstreamBytes.reduce(0) { lengths, name in
        name.count < 64 ? lengths | 1 << UInt64(name.count) : lengths
    }

    private static let droppedDownstreamBytes: [[UInt8]] = droppedDownstream.map { Array($0.utf8) }
    /// The dropped names by their length, up to 63 bytes (longer names are compared with all).
    private static let droppedByLength: [[[UInt8]]] = (0..<64).map { length in
        droppedDownstreamBytes.filter { $0.count == length }
    }

    /// `bytes` are `lower` (lower case) ignoring ASCII case.
    private static func equalsFolded(_ bytes: UnsafeRawBufferPointer, _ lower: UnsafeRawBufferPointer) -> Bool {
        guard bytes.count == lower.count else { return false }
        for index in 0..<bytes.count where String.foldedASCII(bytes[index]) != lower[index] { return false }
        return true
    }

    /// The most names a message's `Connection` headers may list, all together. Each name listed
    /// is compared with every header of the message: bounded, the work stays linear in the
    /// head's size (unbounded, a 60 KiB head of thousands of names cost seconds of CPU).
    public static let maxConnectionListed = 32

    /// The header names a message's `Connection` lists, lower case: they belong to its hop
    /// (RFC 9110 §7.6.1). Nil when they are more than ``maxConnectionListed`` (a client's request
    /// is refused with 400, a server's answer with 502).
    public static func connectionListed(_ headers: [(name: String, value: String)]) -> [String]? {
        var listed: [String] = []
        for header in headers {
            guard addConnectionListed(name: header.name, value: header.value, to: &listed) else { return nil }
        }
        return listed
    }

    /// What one header adds to ``connectionListed(_:)``: its tokens if it is a `Connection`.
    /// False (and nothing past the bound added) when `listed` would hold more than
    /// ``maxConnectionListed`` names; the value is read only up to that point.
    public static func addConnectionListed(name: String, value: String, to listed: inout [String]) -> Bool {
        guard name.equalsASCIILowercased("connection"),
            // The usual values name no other header (and are hop-by-hop themselves).
            !value.equalsASCIILowercased("keep-alive"), !value.equalsASCIILowercased("close")
        else { return true }
        for token in value.utf8.split(separator: UInt8(ascii: ","), omittingEmptySubsequences: true) {
            let name = String(decoding: token, as: UTF8.self).trimmingASCIIWhitespace().lowercased()
            if name.isEmpty { continue }
            guard listed.count < maxConnectionListed else { return false }
            listed.append(name)
        }
        return true
    }

    private static let droppedDownstream: [String] =
        hopByHop + ["set-cookie", "set-cookie2"] + securityHeaders.map { $0.name.lowercased() }

    /// On every answer of the gateway: nothing an upstream returns is sniffed into a script,
    /// runs on the gateway's origin, or is embedded by a page of another origin.
    public static let securityHeaders: [(name: String, value: String)] = [
        ("X-Content-Type-Options", "nosniff"),
        ("Content-Security-Policy", "sandbox; default-src 'none'; frame-ancestors 'none'"),
        ("Cross-Origin-Resource-Policy", "same-origin"),
    ]

    /// `127.0.0.1[:port]`, `localhost[:port]`, `[::1][:port]` (any 127/8 address).
    /// Byte by byte, ASCII case ignored, without copying the text.
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
