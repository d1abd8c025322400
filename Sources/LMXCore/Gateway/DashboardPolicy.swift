/// The read-only dashboard the gateway serves at its root (`http://127.0.0.1:1235/`): which paths
/// are its, who may load them, and the headers every answer carries. It shows what any local user
/// can already read from the status socket, nothing more, and it is never a way into the gateway's
/// forwarding (no credentials, no `/v1/*`).
public enum DashboardPolicy {
    /// What a dashboard path names.
    public enum Resource: Sendable, Hashable {
        case page, script, style, icon
        /// `/v1/status` as the status socket answers it.
        case status
        /// `/v1/events` (the numbered timeline).
        case events
        /// `/v1/pairings` (names, URLs, expiry; secrets by name only).
        case pairings
        /// `/v1/traffic` (the gateway's traffic per model).
        case traffic
        /// `/v1/history` (routes and models over time).
        case history
        /// `/v1/watch`: the change stream (`?since=SEQ` resumes).
        case watch
        /// Under `/dashboard/` but nothing there.
        case missing
    }

    /// The dashboard's resource for `path`, or nil when the path is not the dashboard's (then the
    /// gateway's own rules apply: `/v1/*` is forwarded).
    public static func resource(path: String) -> Resource? {
        switch path {
        case "/", "/index.html": return .page
        case "/dashboard/app.js": return .script
        case "/dashboard/app.css": return .style
        case "/dashboard/icon.svg", "/favicon.ico": return .icon
        case "/dashboard/api/status": return .status
        case "/dashboard/api/events": return .events
        case "/dashboard/api/pairings": return .pairings
        case "/dashboard/api/traffic": return .traffic
        case "/dashboard/api/history": return .history
        case "/dashboard/api/watch": return .watch
        default: return path == "/dashboard" || path.hasPrefix("/dashboard/") ? .missing : nil
        }
    }

    /// Why a dashboard request is not answered; nil when it is.
    /// - Parameters:
    ///   - authority: the request's `Host`.
    ///   - overTCP: it came over a TCP listener (browsers reach only those).
    ///   - localPort: the listener's port: the `Host` must name it (a page that rebinds its own
    ///     name to 127.0.0.1 still sends its own name, and usually its own port).
    ///   - localhostIsOurs: as for the gateway (`localhost` reaches only the agent's listeners).
    public static func refusal(
        method: String, authority: String?, headers: [(name: String, value: String)], overTCP: Bool, localPort: Int?,
        localhostIsOurs: Bool = true
    ) -> GatewayPolicy.Refusal? {
        func header(_ name: String) -> String? { headers.first { $0.name.lowercased() == name }?.value }
        guard method == "GET" else {
            return .init(status: 405, code: "method_not_allowed", message: "the dashboard is read-only: GET only")
        }
        let host = (authority ?? header("host"))?.lowercased()
        if overTCP {
            guard let host, GatewayPolicy.isLoopbackAuthority(host), let localPort, Self.port(of: host) == localPort
            else {
                return .init(
                    status: 403, code: "forbidden_host",
                    message:
                        "the dashboard answers only requests addressed to 127.0.0.1, [::1] or localhost with the gateway's port (DNS rebinding)"
                )
            }
            if !localhostIsOurs, host.hasPrefix("localhost:") {
                return .init(
                    status: 403, code: "localhost_not_ours",
                    message:
                        "another local user holds the gateway's port on ::1, which `localhost` reaches first: open http://127.0.0.1:\(localPort)/ instead"
                )
            }
        }
        // Only the dashboard's own pages may read it: an Origin, if any, must be its own.
        if let origin = header("origin")?.lowercased() {
            guard let host, origin == "http://" + host else {
                return .init(
                    status: 403, code: "forbidden_origin",
                    message: "the dashboard is not served to pages of other origins (Origin \(origin.prefix(80)))")
            }
        }
        // What the browser says of the request: typed in or from the dashboard itself only.
        if let site = header("sec-fetch-site")?.lowercased(), site != "same-origin", site != "none" {
            return .init(
                status: 403, code: "forbidden_site",
                message: "the dashboard is not served to requests other sites make (Sec-Fetch-Site: \(site.prefix(20)))"
            )
        }
        if let destination = header("sec-fetch-dest")?.lowercased(),
            ["iframe", "frame", "embed", "object", "fencedframe"].contains(destination)
        {
            return .init(status: 403, code: "forbidden_frame", message: "the dashboard is not shown inside other pages")
        }
        return nil
    }

    /// The port an authority names (`127.0.0.1:1235`, `[::1]:1235`), or nil when it names none.
    static func port(of authority: String) -> Int? {
        guard let colon = authority.lastIndex(of: ":"), !authority.hasSuffix("]") else { return nil }
        let digits = authority[authority.index(after: colon)...]
        guard !digits.isEmpty, digits.count <= 5, digits.allSatisfy(\.isASCIIDigit) else { return nil }
        return Int(digits)
    }

    /// On every dashboard answer: scripts and styles from the agent's own files only (no inline
    /// script), connections to the agent only, never framed, nothing sniffed, no referrer, no
    /// cookies (none is ever set), no CORS (no `Access-Control-*`), nothing kept in caches.
    public static let headers: [(name: String, value: String)] = [
        (
            "Content-Security-Policy",
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
                + "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        ),
        ("X-Frame-Options", "DENY"),
        ("X-Content-Type-Options", "nosniff"),
        ("Referrer-Policy", "no-referrer"),
        ("Cross-Origin-Resource-Policy", "same-origin"),
        ("Cross-Origin-Opener-Policy", "same-origin"),
        ("Permissions-Policy", "camera=(), microphone=(), geolocation=()"),
        ("Cache-Control", "no-store"),
    ]
}
