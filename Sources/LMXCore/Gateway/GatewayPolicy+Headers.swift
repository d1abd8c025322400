/// Which headers go on, each way, and which a `Connection` header names.
extension GatewayPolicy {
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
            // The route's key wins on every path, not only where it sends it: a client's key of a
            // kind the route has never travels (its admin key on `/v1/`, its bearer on `/admin/`).
            if credentials.inferenceKey != nil, !replaced.contains("authorization") { replaced.append("authorization") }
            if replaced.contains("authorization") { replaced.append("x-api-key") }
            if credentials.adminKey != nil, !replaced.contains("x-admin-key") { replaced.append("x-admin-key") }
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
    static let droppedUpstream: [String] = hopByHop + ["cookie", "expect"]
    static let droppedUpstreamBytes: [[UInt8]] = droppedUpstream.map { Array($0.utf8) }
    static let droppedUpstreamByLength: [[[UInt8]]] = (0..<64).map { length in
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
    static func keepsListed(_ name: UnsafeRawBufferPointer, _ connectionListed: [String]) -> Bool {
        for listed in connectionListed {
            var listed = listed
            if listed.withUTF8({ equalsFolded(name, UnsafeRawBufferPointer($0)) }) { return false }
        }
        return true
    }

    /// Bit `n`: a dropped name is `n` bytes long (names of 64 bytes and more: compared with all).
    static let droppedLengths: UInt64 = droppedDownstreamBytes.reduce(0) { lengths, name in
        name.count < 64 ? lengths | 1 << UInt64(name.count) : lengths
    }

    static let droppedDownstreamBytes: [[UInt8]] = droppedDownstream.map { Array($0.utf8) }
    /// The dropped names by their length, up to 63 bytes (longer names are compared with all).
    static let droppedByLength: [[[UInt8]]] = (0..<64).map { length in
        droppedDownstreamBytes.filter { $0.count == length }
    }

    /// `bytes` are `lower` (lower case) ignoring ASCII case.
    static func equalsFolded(_ bytes: UnsafeRawBufferPointer, _ lower: UnsafeRawBufferPointer) -> Bool {
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

    static let droppedDownstream: [String] =
        hopByHop + ["set-cookie", "set-cookie2"] + securityHeaders.map { $0.name.lowercased() }

    /// On every answer of the gateway: nothing an upstream returns is sniffed into a script,
    /// runs on the gateway's origin, or is embedded by a page of another origin.
    public static let securityHeaders: [(name: String, value: String)] = [
        ("X-Content-Type-Options", "nosniff"),
        ("Content-Security-Policy", "sandbox; default-src 'none'; frame-ancestors 'none'"),
        ("Cross-Origin-Resource-Policy", "same-origin"),
    ]
}
