/// An answer to a forwarded request that is not the Opta LMX server's: a page put in front of
/// it by a tunnel's edge or by the network. An LMX server answers its API with JSON (or an
/// event stream) and never redirects; the gateway recognises these on the request path, answers
/// the client with its own error naming the cause and the next step, marks the route, and tries
/// another route when the request may still be sent (``GatewayExchange/answerHead(busyFor:status:stream:foreign:)``).
public enum ForeignAnswer: Sendable, Hashable {
    /// A redirect to Cloudflare Access's login page: the route's Access token is missing or stale.
    case accessLogin
    /// An HTML error page from the tunnel's edge (Cloudflare's 52x pages, its 502/504 through
    /// the edge): the tunnel or the server behind it is down.
    case tunnelErrorPage(status: Int)
    /// A web page or a redirect from the network itself (a captive portal asking for a login).
    case captivePortal(status: Int)

    /// The answer's head as the data path reads it. `html`: its `Content-Type` is `text/html`;
    /// `location`: its `Location`, if any; `edge`: it came through Cloudflare's edge (`CF-RAY`,
    /// `Server: cloudflare`). Nil for an answer that may be the server's own: a 5xx page is the
    /// edge's only when it is one of Cloudflare's own codes (520–530) or came through the edge
    /// (a server's own framework may answer a 501 or 500 with an HTML page).
    /// `server`: the route's base URL; a redirect to a path of its own host (relative, or
    /// absolute to the same host on any scheme or port: a framework's trailing-slash 307, an
    /// https upgrade) is the server's own answer and passes.
    public static func recognise(
        status: Int, html: Bool, location: String?, edge: Bool = false, server: String? = nil
    ) -> ForeignAnswer? {
        recognise(status: status, label: html ? .page : .other, location: location, edge: edge, server: server)
    }

    /// The answer's head, with what its `Content-Type` says (``AnswerLabel``). `jsonPath`: the
    /// request's path is one the server answers only in JSON or as an event stream
    /// (``answersInJSON(path:)``); there a non-empty 2xx answer labelled `text/plain` or not
    /// labelled at all is a page put in front of the server (a portal's text), as is an HTML
    /// 401/403 that came through Cloudflare's edge (Access's block page; the server's own
    /// refusals are JSON). `empty`: the answer has no body (`Content-Length: 0`, HEAD, 204).
    public static func recognise(
        status: Int, label: AnswerLabel, location: String?, edge: Bool = false, server: String? = nil,
        jsonPath: Bool = false, empty: Bool = false
    ) -> ForeignAnswer? {
        let html = label == .page
        switch status {
        case 200..<300 where !html && jsonPath && !empty && status != 204 && (label == .plainText || label == .none):
            return .captivePortal(status: status)
        case 401, 403:
            return html && edge && jsonPath ? .accessLogin : nil
        case 300..<400 where status != 304:
            let target = (location ?? "").lowercased()
            if target.contains("cloudflareaccess.com") || target.contains("/cdn-cgi/access/") {
                return .accessLogin
            }
            // A redirect that names no place leads to no page (a portal's always does): the
            // answer is passed on as it came.
            guard let location, !location.trimmingASCIIWhitespace().isEmpty else { return nil }
            if let server, redirectStaysOn(server: server, location: location) { return nil }
            return .captivePortal(status: status)
        case 200..<300 where html, 511:
            // (511 Network Authentication Required, RFC 6585 §6: a captive portal's own status,
            // whatever its page's type; never an LMX server's.)
            return .captivePortal(status: status)
        case 520...530 where html, 500..<600 where html && edge:
            return .tunnelErrorPage(status: status)
        default:
            return nil
        }
    }

    /// Paths of the server's API whose every answer is JSON or an event stream (CONTRACT §2, §8):
    /// inference, models, runs, collections. Not `/v1/audio/…` and the like, which a server may
    /// answer as plain text or audio.
    public static func answersInJSON(path: String) -> Bool {
        // Over the path's bytes: it is read on every answer's head (with `Character`s and
        // `Substring`s it cost about a fifth of a forwarded request's instructions).
        var path = path
        return path.withUTF8 { bytes in
            let end = bytes.firstIndex { $0 == UInt8(ascii: "?") || $0 == UInt8(ascii: "#") } ?? bytes.count
            let path = UnsafeBufferPointer(rebasing: bytes[..<end])
            guard end > 4, path.starts(with: "/v1/".utf8) else { return false }
            let rest = UnsafeBufferPointer(rebasing: path[4...])
            return jsonResources.contains { name in
                name.withUTF8Buffer { name in
                    rest.starts(with: name) && (rest.count == name.count || rest[name.count] == UInt8(ascii: "/"))
                }
            }
        }
    }

    static let jsonResources: [StaticString] = [
        "chat/completions", "completions", "messages", "embeddings", "models", "responses", "rerank", "agents", "rag",
        "discovery",
    ]

    /// What an answer to a question of the server's API says of who answered it: the server (a
    /// JSON answer that no rule takes for a page: a model list, or the server's own refusal),
    /// a page in front of it, or nothing certain (a timeout, an unlabelled error). Only the
    /// server's own word clears a route's standing finding (``RouteState/foreign``).
    public enum APIJudgement: Sendable, Hashable {
        case server
        case foreign(ForeignAnswer)
        case unclear
    }

    /// Judges an answer to `GET /v1/models` (a JSON path) asked by a probe.
    public static func judgeAPI(
        status: Int, contentType: String?, location: String?, edge: Bool, server: String?, empty: Bool
    ) -> APIJudgement {
        let label = AnswerLabel(contentType: contentType)
        if let foreign = recognise(
            status: status, label: label, location: location, edge: edge, server: server, jsonPath: true,
            empty: empty)
        {
            return .foreign(foreign)
        }
        // (A redirect in JSON is no model list and no refusal of the server's: it clears nothing.)
        return label == .json && !(300..<400).contains(status) ? .server : .unclear
    }

    /// `location` points at `server`'s own host: a relative reference, or an absolute URL (or a
    /// scheme-relative one) whose host is the server's.
    static func redirectStaysOn(server: String, location: String) -> Bool {
        let location = location.trimmingASCIIWhitespace().lowercased()
        guard let serverHost = host(of: server.lowercased()) else { return false }
        if location.hasPrefix("//") { return host(of: location) == serverHost }
        // A relative reference has no scheme: no ':' before its first '/', '?' or '#'.
        let head = location.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        if !head.contains(":") { return true }
        return host(of: location) == serverHost
    }

    /// The host of an absolute or scheme-relative URL (no user, no port), nil when it has none.
    static func host(of url: String) -> Substring? {
        let characters = Array(url)
        guard
            let slashes = characters.indices.dropLast().first(where: {
                characters[$0] == "/" && characters[$0 + 1] == "/"
            })
        else { return nil }
        var authority = url.dropFirst(slashes + 2).prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        if let at = authority.lastIndex(of: "@") { authority = authority[authority.index(after: at)...] }
        if authority.hasPrefix("[") {
            guard let close = authority.firstIndex(of: "]") else { return nil }
            return authority[...close]
        }
        let host = authority.prefix { $0 != ":" }
        return host.isEmpty ? nil : host
    }

    /// The server may have seen the request: the tunnel's edge reached it (a 524 is its
    /// timeout) or may have. A login page or a captive portal answered instead of any server.
    public var mayHaveReachedServer: Bool {
        if case .tunnelErrorPage = self { return true }
        return false
    }

    /// The answer says something of the route, which is recorded with ``verdict``. Not
    /// Cloudflare's 524: the edge reached the server and waited its 100 s for an answer (a long
    /// generation that is not streamed): the server is busy, not gone, and one slow request
    /// must not take the route from every client.
    public var marksRoute: Bool {
        if case .tunnelErrorPage(524) = self { return false }
        return true
    }

    /// The route's verdict for the agent (status, dashboard, notifications).
    public var verdict: HealthVerdict {
        switch self {
        case .accessLogin: .authRejected
        case .tunnelErrorPage: .tunnelDown
        case .captivePortal: .down
        }
    }

    /// The cause as a code, beside ``detail``.
    public var cause: Cause {
        switch self {
        case .accessLogin: .loginPage
        case .tunnelErrorPage: .edgeError
        case .captivePortal: .captivePortal
        }
    }

    /// The cause, for the log and the route's detail.
    public var detail: String {
        switch self {
        case .accessLogin: "Cloudflare Access answered with its login page instead of the server"
        case .tunnelErrorPage(let status): "HTTP \(status): the tunnel's edge answered with an error page"
        case .captivePortal(let status): "HTTP \(status): the network answered with a page that is not the server's"
        }
    }

    /// The gateway's error for the client: its status, code and message (cause and next step).
    public var answer: (status: Int, code: String, message: String) {
        switch self {
        case .accessLogin:
            (
                502, "access_login_required",
                "the tunnel answered with Cloudflare Access's login page instead of the Opta LMX server: the route's Access token is missing or stale; pair the server again (lmx-pair with a new code) or set a new Access service token"
            )
        case .tunnelErrorPage(524):
            (
                502, "tunnel_error_page",
                "the tunnel's edge answered HTTP 524: the Opta LMX server took longer than the edge waits (100 s) to start its answer; ask for a streamed answer (\"stream\": true), or use the server on the LAN"
            )
        case .tunnelErrorPage(let status):
            (
                502, "tunnel_error_page",
                "the tunnel's edge answered HTTP \(status) with an error page instead of the Opta LMX server: the tunnel or the server behind it is down; the agent is probing it again"
            )
        case .captivePortal(let status):
            (
                502, "captive_portal",
                "the network answered HTTP \(status) with a web page instead of the Opta LMX server: a captive portal may be asking for a sign-in; open a browser to sign in to this network, then try again"
            )
        }
    }
}

/// What an answer's `Content-Type` says of it, as far as telling the server's answers from pages
/// put in front of it goes.
public enum AnswerLabel: Sendable, Hashable {
    /// `text/html` or `application/xhtml+xml`: a web page.
    case page
    /// `text/plain`.
    case plainText
    /// `application/json` (or a `+json` type).
    case json
    /// No `Content-Type` at all.
    case none
    /// Anything else (an event stream, audio, octet streams).
    case other

    /// The label of a `Content-Type` value (its parameters ignored; any case).
    public init(contentType: String?) {
        guard var contentType else {
            self = .none
            return
        }
        self = contentType.withUTF8(Self.init(mediaType:))
    }

    /// The label of a `Content-Type` value's bytes, as ``init(contentType:)`` reads it (the
    /// gateway reads an answer's head this way: one reading for the request path and the probes).
    public init(mediaType bytes: UnsafeRawBufferPointer) {
        self.init(mediaType: bytes.assumingMemoryBound(to: UInt8.self))
    }

    /// What an answer with a second `Content-Type` of label `next` is read as (a field that may
    /// come once, RFC 9110 §8.3): a web page in either is the page — a JSON label before it hides
    /// no portal's HTML; otherwise the first. The request path and the probes read it so.
    /// Text that is no JSON beside JSON (`text/plain`, an event stream) is read as that text:
    /// only a server's consistent JSON is its JSON.
    public func then(_ next: AnswerLabel) -> AnswerLabel {
        if self == .page || next == .page { return .page }
        if self == .json, next != .json, next != .none { return next }
        return self
    }

    /// Over the value's bytes, without a lowercased copy or a `String`. A list in one value
    /// (`text/html, application/json`) is read as that many values (``then(_:)``).
    private init(mediaType bytes: UnsafeBufferPointer<UInt8>) {
        guard var comma = bytes.firstIndex(of: UInt8(ascii: ",")) else {
            self.init(single: bytes)
            return
        }
        var label = AnswerLabel(single: UnsafeBufferPointer(rebasing: bytes[..<comma]))
        while comma < bytes.count {
            let start = comma + 1
            let end = bytes[start...].firstIndex(of: UInt8(ascii: ",")) ?? bytes.count
            label = label.then(AnswerLabel(single: UnsafeBufferPointer(rebasing: bytes[start..<end])))
            comma = end
        }
        self = label
    }

    /// One media type's label (its parameters ignored).
    private init(single bytes: UnsafeBufferPointer<UInt8>) {
        func isSpace(_ byte: UInt8) -> Bool { byte == 0x20 || (0x09...0x0D).contains(byte) }
        var end = bytes.firstIndex(of: UInt8(ascii: ";")) ?? bytes.count
        var start = 0
        while start < end, isSpace(bytes[start]) { start += 1 }
        while end > start, isSpace(bytes[end - 1]) { end -= 1 }
        let type = UnsafeBufferPointer(rebasing: bytes[start..<end])
        /// `type` from `offset` on, compared with `text` (lowercase ASCII) in any case.
        func matches(_ text: StaticString, at offset: Int = 0, whole: Bool = true) -> Bool {
            text.withUTF8Buffer { text in
                guard whole ? type.count - offset == text.count : type.count - offset >= text.count else {
                    return false
                }
                for index in 0..<text.count {
                    let byte = type[offset + index]
                    let lower = (0x41...0x5A).contains(byte) ? byte | 0x20 : byte
                    if lower != text[index] { return false }
                }
                return true
            }
        }
        if type.isEmpty {
            self = .none
        } else if matches("text/html") || matches("application/xhtml+xml") {
            self = .page
        } else if matches("text/plain") {
            self = .plainText
        } else if matches("application/json") {
            self = .json
        } else if type.count >= 17, matches("application/", whole: false), matches("+json", at: type.count - 5) {
            self = .json
        } else {
            self = .other
        }
    }
}
