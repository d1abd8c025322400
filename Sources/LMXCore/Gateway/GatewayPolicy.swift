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
    static let hopByHop: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te", "trailer",
        "transfer-encoding", "upgrade", "host", "content-length",
    ]

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
        func header(_ name: String) -> String? { headers.first { $0.name.equalsASCIILowercased(name) }?.value }
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
        let lower = path.lowercased()
        guard path.hasPrefix("/"), !lower.containsBytes("//"), !lower.containsBytes("/./"),
            !lower.containsBytes("/../"), !lower.hasSuffix("/.."), !lower.hasSuffix("/."),
            !lower.containsBytes("%2f"), !lower.containsBytes("%2e"), !lower.containsBytes("%5c"),
            !lower.containsBytes("\\")
        else {
            return Refusal(
                status: 400, code: "bad_path",
                message: "the path has dot segments, doubled slashes or encoded separators")
        }
        var trimmed = lower
        while trimmed.count > 1 && trimmed.hasSuffix("/") { trimmed.removeLast() }
        if trimmed == "/v1/chat/stream" {
            return Refusal(
                status: 403, code: "websocket_refused",
                message:
                    "/v1/chat/stream is the server's WebSocket path, which checks no credentials: the gateway never forwards it; use /v1/chat/completions with \"stream\": true"
            )
        }
        if trimmed == "/v1" || trimmed.hasPrefix("/v1/") { return nil }
        if trimmed == "/admin" || trimmed.hasPrefix("/admin/") {
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

    /// The headers sent upstream: the client's, minus hop-by-hop ones, plus the route's
    /// credentials. Where the route carries a key for the path, that key is sent and the client's
    /// own key header of that kind is not forwarded: the official OpenAI SDKs always send an
    /// `Authorization` (a placeholder when the user has no key), and it must not replace the
    /// route's. A client's own `Authorization` / `X-Api-Key` (or `X-Admin-Key`) travels only to a
    /// route that has no key of that kind. The Cloudflare Access token is always the route's.
    public static func upstreamHeaders(
        client: [(name: String, value: String)], credentials: Credentials, path: String, userAgent: String
    ) -> [(name: String, value: String)] {
        let connectionListed = connectionListed(client)
        let routeHeaders = credentials.headers(forPath: path)
        let routeNames = Set(routeHeaders.map { $0.name.lowercased() })
        var replaced: Set<String> = routeNames
        if routeNames.contains("authorization") { replaced.insert("x-api-key") }
        var out: [(name: String, value: String)] = []
        var present: Set<String> = []
        for header in client {
            let name = header.name.lowercased()
            // Cookies are not scoped by port: another local app's cookies never travel on.
            if hopByHop.contains(name) || connectionListed.contains(name) || name == "cookie" { continue }
            if replaced.contains(name) { continue }
            out.append(header)
            present.insert(name)
        }
        out.append(contentsOf: routeHeaders)
        if !present.contains("user-agent") { out.append(("User-Agent", userAgent)) }
        return out
    }

    /// The request carries a key of its own that would travel upstream: an `Authorization` or
    /// `X-Api-Key`. Only meaningful for routes without an inference key (the route's wins).
    public static func clientHasKey(_ headers: [(name: String, value: String)]) -> Bool {
        headers.contains { ["authorization", "x-api-key"].contains($0.name.lowercased()) }
    }

    /// The headers sent back to the client: the server's, minus hop-by-hop ones and cookies
    /// (cookies are not scoped by port: they would reach every local app), and minus whatever
    /// the gateway sets itself (`securityHeaders`).
    public static func downstreamHeaders(_ upstream: [(name: String, value: String)]) -> [(name: String, value: String)]
    {
        let connectionListed = connectionListed(upstream)
        return upstream.filter {
            !droppedDownstream.contains($0.name.lowercased()) && !connectionListed.contains($0.name.lowercased())
        }
    }

    /// The header names a message's `Connection` lists: they belong to its hop (RFC 9110 §7.6.1).
    static func connectionListed(_ headers: [(name: String, value: String)]) -> Set<String> {
        var listed: Set<String> = []
        for header in headers where header.name.lowercased() == "connection" {
            for token in header.value.split(separator: ",").prefix(64) {
                listed.insert(String(token).trimmingASCIIWhitespace().lowercased())
            }
        }
        return listed
    }

    private static let droppedDownstream: Set<String> =
        hopByHop.union(["set-cookie", "set-cookie2"]).union(securityHeaders.map { $0.name.lowercased() })

    /// On every answer of the gateway: nothing an upstream returns is sniffed into a script,
    /// runs on the gateway's origin, or is embedded by a page of another origin.
    public static let securityHeaders: [(name: String, value: String)] = [
        ("X-Content-Type-Options", "nosniff"),
        ("Content-Security-Policy", "sandbox; default-src 'none'; frame-ancestors 'none'"),
        ("Cross-Origin-Resource-Policy", "same-origin"),
    ]

    /// Safe to send twice (RFC 9110 §9.2.2): may be retried on another route even when the
    /// first may have received it.
    public static func isIdempotent(_ method: String) -> Bool {
        ["GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"].contains(method.uppercased())
    }

    /// `127.0.0.1[:port]`, `localhost[:port]`, `[::1][:port]` (any 127/8 address).
    public static func isLoopbackAuthority(_ authority: String) -> Bool {
        var host = Substring(authority.lowercased())
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return false }
            let inner = host[host.index(after: host.startIndex)..<close]
            let rest = host[host.index(after: close)...]
            guard rest.isEmpty || (rest.first == ":" && rest.dropFirst().allSatisfy(\.isASCIIDigit)) else {
                return false
            }
            return inner == "::1"
        }
        if let colon = host.firstIndex(of: ":") {
            guard host[host.index(after: colon)...].allSatisfy(\.isASCIIDigit) else { return false }
            host = host[..<colon]
        }
        if host == "localhost" { return true }
        let parts = host.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 4 && parts[0] == "127"
            && parts.allSatisfy { !$0.isEmpty && $0.count <= 3 && $0.allSatisfy(\.isASCIIDigit) && Int($0)! <= 255 }
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
