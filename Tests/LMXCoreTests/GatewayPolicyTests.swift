import Testing

@testable import LMXCore

@Suite("The gateway's forwarding rules")
struct GatewayPolicyTests {
    private func refusal(
        _ path: String, method: String = "GET", authority: String? = "127.0.0.1:1235", headers: [(String, String)] = [],
        admin: Bool = false, tcp: Bool = true
    ) -> String? {
        GatewayPolicy.refusal(
            method: method, path: path, authority: authority, headers: headers.map { (name: $0.0, value: $0.1) },
            adminEnabled: admin, overTCP: tcp)?.code
    }

    @Test("the rules read no header but those they name (refusalHeaders): the data path looks up only those")
    func headersRead() {
        let others = [
            "cookie": "a=1", "authorization": "Bearer k", "x-api-key": "k", "content-type": "application/json",
            "connection": "upgrade", "user-agent": "u/1", "host": "127.0.0.1:1235",
        ]
        var asked: Set<String> = []
        for origin in [nil, "http://127.0.0.1:1235", "https://evil.example"] {
            for site in [nil, "cross-site", "same-origin"] {
                for upgrade in [nil, "websocket"] {
                    var present = others
                    present["origin"] = origin
                    present["sec-fetch-site"] = site
                    present["upgrade"] = upgrade
                    for path in ["/v1/models", "/v1/chat/stream", "/admin/x", "/v1/../x", "/healthz", "/"] {
                        for (tcp, authority) in [(true, nil), (true, "localhost"), (true, "example.com"), (false, nil)]
                        {
                            _ = GatewayPolicy.refusal(
                                method: "POST", path: path, authority: authority,
                                header: { name in
                                    asked.insert(name)
                                    return present[name]
                                }, adminEnabled: true, overTCP: tcp, localhostIsOurs: false)
                        }
                    }
                }
            }
        }
        #expect(asked == GatewayPolicy.refusalHeaders)
    }

    @Test("/v1/* is forwarded; the WebSocket path never is, in any spelling")
    func paths() {
        #expect(refusal("/v1/models") == nil)
        #expect(refusal("/v1/chat/completions", method: "POST") == nil)
        for path in ["/v1/chat/stream", "/v1/chat/stream/", "/V1/Chat/Stream", "/v1/chat/stream//"] {
            #expect(refusal(path) != nil, "\(path)")
        }
        #expect(refusal("/v1/chat/stream") == "websocket_refused")
        for path in [
            "/v1//chat/stream", "/v1/./chat/stream", "/v1/x/../chat/stream", "/v1/chat%2Fstream",
            "/v1/chat/%73tream/..", "/v1\\chat",
        ] {
            #expect(refusal(path) == "bad_path", "\(path)")
        }
        #expect(refusal("/v1/models", headers: [("Upgrade", "websocket")]) == "upgrade_refused")
        #expect(refusal("/healthz") == "not_found")
        #expect(refusal("/") == "not_found")
        #expect(refusal("/admin/models") == "admin_disabled")
        #expect(refusal("/admin/models", admin: true) == nil)
    }

    @Test("over TCP only loopback Host names; a foreign Origin is refused everywhere")
    func browsers() {
        for host in ["127.0.0.1:1235", "localhost:1235", "[::1]:1235", "127.0.0.1", "LOCALHOST", "127.1.2.3:80"] {
            #expect(refusal("/v1/models", authority: host) == nil, "\(host)")
        }
        for host in [
            "evil.example", "evil.example:1235", "127.0.0.1.evil.example", "localhost.evil", "[::2]:1235",
            "127.0.0.1:12a", "10.0.0.1:1235",
        ] {
            #expect(refusal("/v1/models", authority: host) == "forbidden_host", "\(host)")
        }
        #expect(refusal("/v1/models", authority: nil) == "forbidden_host")
        // Over the Unix socket any Host is fine (curl --unix-socket sends localhost; others vary).
        #expect(refusal("/v1/models", authority: "whatever", tcp: false) == nil)
        #expect(refusal("/v1/models", headers: [("Origin", "https://evil.example")]) == "forbidden_origin")
        #expect(refusal("/v1/models", headers: [("Origin", "https://evil.example")], tcp: false) == "forbidden_origin")
        #expect(refusal("/v1/models", headers: [("Origin", "http://localhost:3000")]) == nil)
        #expect(refusal("/v1/models", headers: [("Origin", "null")]) == "forbidden_origin")
    }

    @Test("credentials are added by path; the route's key replaces a client's placeholder; hop-by-hop headers go")
    func headers() {
        let credentials = Credentials(
            adminKey: "ADMIN", inferenceKey: "INFER", accessClientID: "ID", accessClientSecret: "SECRET")
        func upstream(_ path: String, _ client: [(String, String)]) -> [String: String] {
            var out: [String: String] = [:]
            for header in GatewayPolicy.upstreamHeaders(
                client: client.map { (name: $0.0, value: $0.1) }, credentials: credentials, path: path,
                userAgent: "lmx-agent/test")
            {
                #expect(out[header.name.lowercased()] == nil, "one \(header.name)")
                out[header.name.lowercased()] = header.value
            }
            return out
        }
        let v1 = upstream(
            "/v1/models",
            [
                ("Accept", "application/json"), ("Connection", "keep-alive, X-Private"), ("X-Private", "1"),
                ("Host", "127.0.0.1:1235"), ("Transfer-Encoding", "chunked"),
            ])
        #expect(v1["authorization"] == "Bearer INFER")
        #expect(v1["cf-access-client-id"] == "ID" && v1["cf-access-client-secret"] == "SECRET")
        #expect(v1["x-admin-key"] == nil)
        #expect(v1["accept"] == "application/json")
        #expect(
            v1["connection"] == nil && v1["x-private"] == nil && v1["host"] == nil && v1["transfer-encoding"] == nil)
        #expect(v1["user-agent"] == "lmx-agent/test")

        // The OpenAI SDKs always send a key (a placeholder when the user has none): on a keyed
        // route the route's key is sent and the client's is not forwarded.
        let own = upstream("/v1/models", [("Authorization", "Bearer sk-placeholder"), ("User-Agent", "openai-python")])
        #expect(own["authorization"] == "Bearer INFER")
        #expect(own["user-agent"] == "openai-python")
        let apiKey = upstream("/v1/models", [("X-Api-Key", "MINE")])
        #expect(apiKey["authorization"] == "Bearer INFER" && apiKey["x-api-key"] == nil)
        let ownAdmin = upstream("/admin/models", [("X-Admin-Key", "MINE")])
        #expect(ownAdmin["x-admin-key"] == "ADMIN")
        let access = upstream("/v1/models", [("CF-Access-Client-Secret", "forged")])
        #expect(access["cf-access-client-secret"] == "SECRET")
        // A route without a key of that kind: the client's own key travels.
        func bare(_ path: String, _ client: [(String, String)], _ credentials: Credentials) -> [String: String] {
            Dictionary(
                GatewayPolicy.upstreamHeaders(
                    client: client.map { (name: $0.0, value: $0.1) }, credentials: credentials, path: path,
                    userAgent: "x"
                ).map { ($0.name.lowercased(), $0.value) }, uniquingKeysWith: { a, _ in a })
        }
        #expect(bare("/v1/models", [("Authorization", "Bearer MINE")], Credentials())["authorization"] == "Bearer MINE")
        #expect(bare("/v1/models", [("X-Api-Key", "MINE")], Credentials(adminKey: "ADMIN"))["x-api-key"] == "MINE")
        #expect(
            bare(
                "/v1/models", [("Authorization", "Bearer MINE")],
                Credentials(accessClientID: "I", accessClientSecret: "S"))["authorization"] == "Bearer MINE")

        let admin = upstream("/admin/models", [])
        #expect(admin["x-admin-key"] == "ADMIN")
        #expect(admin["authorization"] == nil)
        #expect(admin["cf-access-client-id"] == "ID")
    }

    @Test(
        "the retry rule: only with the whole body; idempotent methods after the request may have arrived; a kept connection's close once on a new one"
    )
    func retryRule() {
        for method in ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"] { #expect(RetryRule.isIdempotent(method)) }
        for method in ["POST", "PATCH", "TRACE", "get"] { #expect(!RetryRule.isIdempotent(method)) }
        func decide(
            _ failure: RetryRule.Failure, _ method: String, whole: Bool = true, attempt: Int = 0, routes: Int = 2,
            resent: Bool = false, repeatable: Bool = false
        ) -> RetryRule.Decision {
            RetryRule.decide(
                failure, method: method, bodyWhole: whole, attempt: attempt, routes: routes,
                resentOnNewConnection: resent, repeatable: repeatable)
        }
        // Never sent: anything goes to the next route, while there is one.
        #expect(decide(.notSent, "POST") == .nextRoute)
        #expect(decide(.notSent, "POST", attempt: 1) == .answer)
        #expect(decide(.busy, "POST") == .nextRoute)
        #expect(decide(.busy, "POST", routes: 1) == .answer)
        // May have arrived: only what is safe twice.
        #expect(decide(.failedBeforeAnswer, "PUT") == .nextRoute)
        #expect(decide(.failedBeforeAnswer, "POST") == .answer)
        // A kept connection closed unanswered: the same route on a new connection once, then on.
        #expect(decide(.keptConnectionClosed, "GET", routes: 1) == .sameRouteNewConnection)
        #expect(decide(.keptConnectionClosed, "GET", resent: true) == .nextRoute)
        #expect(decide(.keptConnectionClosed, "GET", routes: 1, resent: true) == .answer)
        #expect(decide(.keptConnectionClosed, "POST") == .answer)
        // A POST the server makes safe to repeat (a run's creation with its Idempotency-Key): after
        // any failure, once on a new connection to the same route, then by the next route.
        #expect(decide(.failedBeforeAnswer, "POST", routes: 1, repeatable: true) == .sameRouteNewConnection)
        #expect(decide(.failedBeforeAnswer, "POST", resent: true, repeatable: true) == .nextRoute)
        #expect(decide(.failedBeforeAnswer, "POST", routes: 1, resent: true, repeatable: true) == .answer)
        #expect(decide(.keptConnectionClosed, "POST", repeatable: true) == .sameRouteNewConnection)
        #expect(decide(.failedBeforeAnswer, "POST", whole: false, repeatable: true) == .answer)
        // A body passed on as it came is never sent again, whatever the failure and method (a PUT
        // sent again with its length and no body desynchronized the server's connection).
        for failure in [RetryRule.Failure.notSent, .keptConnectionClosed, .failedBeforeAnswer, .busy] {
            for method in ["GET", "PUT", "POST"] {
                #expect(decide(failure, method, whole: false) == .answer, "\(failure) \(method)")
            }
        }
    }

    @Test(
        "an idle upstream connection waits a second less than the server's Keep-Alive, 300 s behind Cloudflare, else 4 s"
    )
    func upstreamKeepAlive() {
        func seconds(_ headers: [(String, String)]) -> Int {
            var keep = UpstreamKeepAlive()
            for (name, value) in headers { keep.read(name: name, value: value) }
            return keep.seconds
        }
        #expect(seconds([]) == 4)
        #expect(seconds([("Content-Type", "application/json"), ("Server", "uvicorn")]) == 4)
        #expect(seconds([("Keep-Alive", "timeout=5")]) == 4)
        #expect(seconds([("keep-alive", "timeout=5, max=100")]) == 4)
        #expect(seconds([("KEEP-ALIVE", "max=100,  Timeout = 30 ")]) == 29)
        #expect(seconds([("Keep-Alive", "timeout=\"60\"")]) == 59)
        // Two headers: the shorter holds. Past the cap: the cap. A second or less: not kept.
        #expect(seconds([("Keep-Alive", "timeout=60"), ("Keep-Alive", "timeout=10")]) == 9)
        #expect(seconds([("Keep-Alive", "timeout=86400")]) == UpstreamKeepAlive.maxSeconds)
        #expect(seconds([("Keep-Alive", "timeout=1")]) == 0)
        #expect(seconds([("Keep-Alive", "timeout=0")]) == 0)
        // What does not parse is ignored.
        for odd in [
            "timeout=", "timeout=-5", "timeout=5.5", "timeout=abc", "timeout=1234567890", "max=5", "", "=",
            "timeout", "timeout=5s", "timeout=\u{FF15}", String(repeating: "a=1,", count: 40) + "timeout=9",
        ] {
            #expect(seconds([("Keep-Alive", odd)]) == 4, "\(odd)")
        }
        // Cloudflare's edge: its ray ID and its name, both; a hint still wins.
        #expect(seconds([("Server", "cloudflare"), ("CF-RAY", "8f1e2d3c4b5a6978-AMS")]) == 300)
        #expect(seconds([("cf-ray", "8f1e2d3c4b5a6978-AMS"), ("server", "Cloudflare")]) == 300)
        #expect(seconds([("CF-RAY", "8f1e2d3c4b5a6978-AMS")]) == 4)
        #expect(seconds([("Server", "cloudflare")]) == 4)
        #expect(seconds([("Server", "cloudflare-nginx-imitation"), ("CF-RAY", "x")]) == 4)
        #expect(seconds([("Server", "cloudflare"), ("CF-RAY", "x"), ("Keep-Alive", "timeout=20")]) == 19)
    }

    @Test("gateway.listen: loopback only")
    func listen() throws {
        #expect(try GatewayConfiguration.parseListen("127.0.0.1:1235") == HostPort(host: "127.0.0.1", port: 1235))
        #expect(try GatewayConfiguration.parseListen("[::1]:8080") == HostPort(host: "::1", port: 8080))
        #expect(try GatewayConfiguration.parseListen("localhost:9") == HostPort(host: "127.0.0.1", port: 9))
        #expect(try GatewayConfiguration.parseListen("off") == nil)
        for bad in ["0.0.0.0:1235", "10.0.0.1:1235", "[::]:1235", "127.0.0.1", "example.com:80", "127.0.0.1:0"] {
            #expect(throws: ConfigurationError.self, "\(bad)") { try GatewayConfiguration.parseListen(bad) }
        }
        let configuration = try AgentConfiguration.parse(
            Array(#"{"gateway": {"listen": "127.0.0.1:4000", "admin": true, "attempts": 2}}"#.utf8), file: "t.json")
        #expect(configuration.gateway.listen == HostPort(host: "127.0.0.1", port: 4000))
        #expect(configuration.gateway.admin && configuration.gateway.attempts == 2)
        #expect(throws: ConfigurationError.self) {
            try AgentConfiguration.parse(Array(#"{"gateway": {"listen": "0.0.0.0:80"}}"#.utf8), file: "t.json")
        }
        #expect(AgentConfiguration().gateway.listen == GatewayConfiguration.defaultListen)
    }

    @Test("a browser's cross-site request is refused unless a page of this machine's own made it")
    func crossSite() {
        #expect(refusal("/v1/models", headers: [("Sec-Fetch-Site", "cross-site")]) == "forbidden_site")
        #expect(
            refusal("/v1/models", headers: [("sec-fetch-site", "Cross-Site"), ("Sec-Fetch-Dest", "image")])
                == "forbidden_site")
        #expect(
            refusal("/v1/models", headers: [("Sec-Fetch-Site", "cross-site"), ("Origin", "http://localhost:3000")])
                == nil)
        #expect(
            refusal("/v1/models", headers: [("Sec-Fetch-Site", "cross-site"), ("Origin", "https://evil.example")])
                == "forbidden_origin")
        #expect(refusal("/v1/models", headers: [("Sec-Fetch-Site", "same-origin")]) == nil)
        #expect(refusal("/v1/models", headers: [("Sec-Fetch-Site", "none")]) == nil)
    }

    @Test("cookies never cross the gateway, either way; the gateway's own security headers replace the upstream's")
    func cookiesAndHeaders() {
        let up = GatewayPolicy.upstreamHeaders(
            client: [("Cookie", "a=1"), ("Accept", "*/*")], credentials: Credentials(), path: "/v1/models",
            userAgent: "x")
        #expect(!up.contains { $0.name.lowercased() == "cookie" })
        #expect(up.contains { $0.name == "Accept" })
        let down = GatewayPolicy.downstreamHeaders([
            ("Set-Cookie", "s=1"), ("set-cookie2", "t=2"), ("X-Content-Type-Options", "upstream"),
            ("Content-Type", "text/html"),
        ])
        #expect(down?.map(\.name) == ["Content-Type"])
        let hop = GatewayPolicy.downstreamHeaders([
            ("Connection", "X-Hop, keep-alive"), ("X-Hop", "1"), ("X-Request-ID", "r"),
        ])
        #expect(hop?.map(\.name) == ["X-Request-ID"])
        #expect(
            GatewayPolicy.securityHeaders.map(\.name) == [
                "X-Content-Type-Options", "Content-Security-Policy", "Cross-Origin-Resource-Policy",
            ])
    }

    @Test("the model field is found in a prefix of the body, wherever it stands at the top level")
    func modelField() {
        func find(_ text: String) -> String? { ModelField.find(in: Array(text.utf8)) }
        #expect(find(#"{"model":"alpha","messages":[]}"#) == "alpha")
        #expect(
            find(#"  {"messages":[{"role":"user","content":"say \"model\": x {"}],"stream":true,"model":"b\u00e9ta"}"#)
                == "béta")
        #expect(find(#"{"messages":[{"model":"inner"}],"model":"outer"}"#) == "outer")
        #expect(find(#"{"messages":[{"role":"user","content":"long…"#) == nil, "cut before the field")
        #expect(find(#"{"model":"alpha"#) == nil, "cut inside the value")
        #expect(find(#"{"model":42}"#) == nil)
        #expect(find(#"["model","x"]"#) == nil)
        #expect(find("") == nil)
    }

    // The rules below are byte-level (they run for every forwarded request); these references
    // are the string-level rules they replaced, and the two must agree on every input tried.

    private static func referencePlainPath(_ path: String) -> Bool {
        let lower = path.lowercased()
        // (The first byte, not the first character: "/" and a combining mark is one character but
        // a path that starts with "/", as a server reads it.)
        return path.utf8.first == UInt8(ascii: "/") && !lower.contains("//") && !lower.contains("/./")
            && !lower.contains("/../")
            && !lower.hasSuffix("/..") && !lower.hasSuffix("/.") && !lower.contains("%2f") && !lower.contains("%2e")
            && !lower.contains("%5c") && !lower.contains("\\")
    }

    private static func referenceLoopback(_ authority: String) -> Bool {
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

    /// Every string of up to `length` characters from `alphabet` (small alphabets: exhaustive).
    private static func strings(_ alphabet: [String], upTo length: Int) -> [String] {
        var all = [""]
        var level = [""]
        for _ in 0..<length {
            level = level.flatMap { prefix in alphabet.map { prefix + $0 } }
            all += level
        }
        return all
    }

    /// The rule and its reference give the same answer on each of more than 100,000 inputs.
    private static func expectAgreement(
        on inputs: [String], _ rule: (String) -> Bool, _ reference: (String) -> Bool,
        sourceLocation: SourceLocation = #_sourceLocation
    ) {
        #expect(inputs.count > 100_000, sourceLocation: sourceLocation)
        for input in inputs {
            #expect(rule(input) == reference(input), "\(input)", sourceLocation: sourceLocation)
        }
    }

    @Test("paths: the one-pass check agrees with the string rules on every short path of slashes, dots, escapes")
    func plainPathsAgree() {
        let paths =
            Self.strings(["/", ".", "a", "%", "2", "F", "e", "5", "c", "\\"], upTo: 5)
            + [
                "/v1/chat/completions", "/v1/models/", "/v1/./x", "/v1/../admin", "/v1/x/..", "/v1/x/.", "/v1/%2E%2e/x",
                "/v1/a%5Cb", "/v1/%2", "/v1/%", "/v1/.hidden", "/v1/a..b", "/v1/...", "/é/./", "/\u{0301}.",
            ]
        // Long runs of plain bytes around them (read eight at a time), at every offset.
        let (nine, seventeen) = (String(repeating: "a", count: 9), String(repeating: "c", count: 17))
        var long: [String] = []
        for short in Self.strings(["/", ".", "a", "%", "2", "F", "e", "\\"], upTo: 4) {
            long.append("/" + nine + short)
            long.append(short + nine + short)
            long.append("/v1/" + short + seventeen + "/" + short)
            long.append("/ab" + short + nine)
            long.append("/abcde" + short + nine)
        }
        Self.expectAgreement(on: paths + long, GatewayPolicy.isPlainPath, Self.referencePlainPath)
    }

    @Test("Host values: the byte-level loopback check agrees with the string rules")
    func loopbackAgrees() {
        let hosts =
            Self.strings(["1", "2", "7", "0", ".", ":", "5"], upTo: 6).map { "127" + $0 }
            + Self.strings(["[", "]", ":", "1", "x"], upTo: 6)
            + [
                "localhost", "LOCALHOST:8080", "localhost:", "localhost:x", "localhost.", "127.0.0.1", "127.0.0.01",
                "127.000.0.1", "127.0.0.256", "127.255.255.255:1", "128.0.0.1", "[::1]", "[::1]:1235", "[::1]x",
                "[::2]",
                "[::1", "", ":", "127.0.0.1:", "127.0.0.1:12a", "１２７.0.0.1", "127.0.0.1\u{0301}", "locａlhost",
            ]
        Self.expectAgreement(on: hosts, GatewayPolicy.isLoopbackAuthority, Self.referenceLoopback)
    }

    @Test("the model's name: plain text read as it is, escapes and non-ASCII through the JSON decoder")
    func modelNames() {
        func find(_ text: String) -> String? { ModelField.find(in: Array(text.utf8)) }
        #expect(find(#"{"model": "qwen/qwen3-8b:q4"}"#) == "qwen/qwen3-8b:q4")
        #expect(find(#"{"model": "a\"b"}"#) == "a\"b")
        #expect(find(#"{"model": "\u00e9t\u00e9"}"#) == "été")
        #expect(find(#"{"model": "été"}"#) == "été")
        #expect(find("{\"model\": \"a\u{01}b\"}") == nil)  // a control character: not JSON
        #expect(
            ModelField.find(in: [0x7B, 0x22, 0x6D, 0x6F, 0x64, 0x65, 0x6C, 0x22, 0x3A, 0x22, 0xFF, 0x22, 0x7D]) == nil)
        #expect(find(#"{"model": ""}"#) == "")
    }

    @Test("Connection lists: the usual keep-alive and close name nothing; other tokens are hop-by-hop")
    func connectionTokens() {
        #expect(GatewayPolicy.connectionListed([("Connection", "keep-alive")]) == [])
        #expect(GatewayPolicy.connectionListed([("connection", "Close")]) == [])
        #expect(GatewayPolicy.connectionListed([("Connection", "keep-alive, X-Secret")]) == ["keep-alive", "x-secret"])
        let kept = GatewayPolicy.downstreamHeaders([
            ("Connection", "X-Private"), ("X-Private", "1"), ("Content-Type", "application/json"),
            ("Keep-Alive", "t=5"),
        ])
        #expect(kept?.map(\.name) == ["Content-Type"])
        #expect(GatewayPolicy.keepsDownstream("X-Request-Id", connectionListed: []))
        #expect(!GatewayPolicy.keepsDownstream("SET-COOKIE", connectionListed: []))
        #expect(!GatewayPolicy.keepsDownstream("x-private", connectionListed: ["x-private"]))
    }

    @Test(
        "Connection may list at most maxConnectionListed names, across all its headers: past it a request is refused (400), an answer is not passed on"
    )
    func connectionListBound() {
        let limit = GatewayPolicy.maxConnectionListed
        let names = (0..<limit).map { "x-\($0)" }
        #expect(GatewayPolicy.connectionListed([("Connection", names.joined(separator: ", "))]) == names)
        #expect(GatewayPolicy.connectionListed([("Connection", (names + ["one-more"]).joined(separator: ","))]) == nil)
        // Split over many headers, the names add up.
        let split = names.map { ("Connection", $0) } + [("connection", "x-last")]
        #expect(GatewayPolicy.connectionListed(split) == nil)
        // Empty items (", ,") are no names.
        #expect(GatewayPolicy.connectionListed([("Connection", String(repeating: ", ", count: 5_000) + "x")]) == ["x"])
        #expect(GatewayPolicy.downstreamHeaders(split + [("Content-Type", "text/plain")]) == nil)
        #expect(GatewayPolicy.connectionRefusal(split)?.status == 400)
        #expect(GatewayPolicy.connectionRefusal([("Connection", "keep-alive, te")]) == nil)
        #expect(refusal("/v1/models", headers: split) == "too_many_connection_options")
    }

    @Test("thousands of Connection names cost no more than the bound: the work is linear in the head")
    func connectionListLinear() {
        // 60 KiB of names in one header and in 2,000 headers: refused after at most the bound.
        let many = (0..<8_000).map { "n\($0)" }.joined(separator: ",")
        let headers = (0..<2_000).map { ("Connection", "a\($0), b\($0), c\($0)") } + [("Connection", many)]
        #expect(GatewayPolicy.connectionListed(headers) == nil)
        #expect(GatewayPolicy.connectionRefusal(headers)?.code == "too_many_connection_options")
    }

    @Test("a body naming a key the gateway reads twice, or with escapes, is ambiguous; other keys may repeat")
    func ambiguousBodies() {
        func ambiguous(_ text: String) -> String? { JSONBodyKeys.ambiguous(in: Array(text.utf8)) }
        #expect(ambiguous(#"{"model": "a", "messages": [{"model": "x"}], "stream": true}"#) == nil)
        #expect(ambiguous(#"{"model": "a", "model": "b"}"#) == "model")
        #expect(ambiguous(#"{"collection":"mine","documents":["d"],"collection":"theirs"}"#) == "collection")
        #expect(
            ambiguous(#"{"previous_response_id": "r1", "input": "x", "previous_response_id": "r2"}"#)
                == "previous_response_id")
        #expect(ambiguous(#"{"stream": false, "model": "m", "stream": true}"#) == "stream")
        // Spelled with an escape: the server's JSON reads it as the key, the gateway's scan does not.
        #expect(ambiguous(#"{"model": "a", "\u006dodel": "b"}"#) == "model")
        #expect(ambiguous(#"{"\u006dodel": "b"}"#) == "model")
        // Other keys may repeat, and nested objects are not top-level keys.
        #expect(ambiguous(#"{"temperature": 1, "temperature": 2, "model": "m"}"#) == nil)
        #expect(ambiguous(#"{"metadata": {"model": "a", "model": "b"}, "model": "m"}"#) == nil)
        // A prefix is read as far as it goes; not JSON, nothing.
        #expect(ambiguous(#"{"model": "a", "messages": [{"role": "user", "content": "hel"#) == nil)
        #expect(ambiguous(#"{"model": "a", "messages": [], "model""#) == "model")
        #expect(ambiguous(#"{"model": "a", "messages": [], "mod"#) == nil)
        #expect(ambiguous("not json") == nil)
        #expect(ambiguous("") == nil)
        // The model the gateway routes by is unchanged by the shared scanner.
        #expect(ModelField.find(in: Array(#"{ "stream" : true , "model" : "m1" }"#.utf8)) == "m1")
        #expect(ModelField.find(in: Array(#"{"a": 1, "b": [1, {"model": "x"}], "model": "m2"}"#.utf8)) == "m2")
    }

    @Test("strings are skipped sixteen bytes at a time: escapes and quotes at every offset around a block read alike")
    func stringsSkippedInBlocks() {
        for length in 0..<80 {
            for escape in [#"\""#, #"\\"#, #"\u0022"#, "é"] {
                for at in [0, length / 2, length] {
                    var content = String(repeating: "a", count: length)
                    content.insert(contentsOf: escape, at: content.index(content.startIndex, offsetBy: at))
                    let body = #"{"messages": [{"content": "\#(content)"}], "model": "m\#(length)", "stream": true}"#
                    #expect(ModelField.find(in: Array(body.utf8)) == "m\(length)", "\(body)")
                    #expect(JSONBodyKeys.ambiguous(in: Array(body.utf8)) == nil, "\(body)")
                    let twice = body.replacingOccurrences(of: #""stream": true}"#, with: #""model": "x"}"#)
                    #expect(JSONBodyKeys.ambiguous(in: Array(twice.utf8)) == "model", "\(twice)")
                }
            }
        }
    }

    @Test("TRACE, TRACK and CONNECT are refused with 405 in any case, before anything else is looked at")
    func refusedMethods() {
        for method in ["TRACE", "trace", "TRACK", "CONNECT"] {
            #expect(refusal("/v1/models", method: method) == "method_not_allowed", "\(method)")
            #expect(refusal("/v1/models", method: method, tcp: false) == "method_not_allowed", "\(method)")
            let refused = GatewayPolicy.refusal(
                method: method, path: "/v1/models", authority: "127.0.0.1", headers: [], adminEnabled: true,
                overTCP: true)
            #expect(refused?.status == 405)
        }
        for method in ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"] {
            #expect(refusal("/v1/models", method: method) == nil, "\(method)")
        }
    }

    @Test("the data path's reading of header names as bytes keeps exactly the headers the rules keep")
    func keepsDownstreamBytes() {
        var names = [
            "Connection", "keep-alive", "Proxy-Connection", "TE", "Trailer", "Transfer-Encoding", "Upgrade", "Host",
            "Content-Length", "Set-Cookie", "SET-COOKIE2", "X-Content-Type-Options", "content-security-policy",
            "Cross-Origin-Resource-Policy", "Content-Type", "X-Request-ID", "Date", "Server", "x_private", "X_PRIVATE",
            "t", "tee", "set-cookie3", "x-privatE", "~^_", "CONNECTIO", "connectionx",
            String(repeating: "x", count: 63), String(repeating: "y", count: 64), String(repeating: "z", count: 200),
        ]
        // Every name above with each letter's case flipped, one at a time.
        for name in names.prefix(10) {
            for index in name.utf8.indices where name.utf8[index] >= 0x41 {
                var bytes = Array(name.utf8)
                bytes[name.utf8.distance(from: name.utf8.startIndex, to: index)] ^= 0x20
                names.append(String(decoding: bytes, as: UTF8.self))
            }
        }
        for listed in [[], ["x-private"], ["x_private", "date"]] {
            for name in names {
                let bytes = Array(name.utf8)
                let fromBytes = bytes.withUnsafeBytes {
                    GatewayPolicy.keepsDownstream(nameBytes: $0, connectionListed: listed)
                }
                #expect(fromBytes == GatewayPolicy.keepsDownstream(name, connectionListed: listed), "\(name) \(listed)")
            }
        }
    }

    @Test("which client headers go upstream: the rule on a name's bytes equals the rule on its String")
    func keepsUpstreamBytes() {
        var names = [
            "Connection", "keep-alive", "Proxy-Connection", "Proxy-Authorization", "TE", "Trailer", "Transfer-Encoding",
            "Upgrade", "Host", "Content-Length", "Cookie", "Authorization", "X-Api-Key", "X-Admin-Key",
            "CF-Access-Client-Id", "cf-access-client-secret", "User-Agent", "Content-Type", "Accept", "x_private",
            "X_PRIVATE", "t", "tee", "cookies", "x-privatE", "~^_", "CONNECTIO", "connectionx", "authorizatio",
        ]
        // Every name above with each letter's case flipped, one at a time.
        for name in names.prefix(14) {
            for index in name.utf8.indices where name.utf8[index] >= 0x41 {
                var bytes = Array(name.utf8)
                bytes[name.utf8.distance(from: name.utf8.startIndex, to: index)] ^= 0x20
                names.append(String(decoding: bytes, as: UTF8.self))
            }
        }
        let routes = [
            Credentials(), Credentials(inferenceKey: "sk-route"), Credentials(adminKey: "admin"),
            Credentials(accessClientID: "id", accessClientSecret: "secret"),
            Credentials(adminKey: "a", inferenceKey: "k", accessClientID: "i", accessClientSecret: "s"),
        ]
        for credentials in routes {
            for path in ["/v1/chat/completions", "/admin/models"] {
                for listed in [[], ["x-private"], ["x_private", "accept"]] {
                    let rule = GatewayPolicy.UpstreamHeaderRule(
                        connectionListed: listed, credentials: credentials, path: path)
                    for name in names {
                        let fromBytes = Array(name.utf8).withUnsafeBytes { rule.keeps(nameBytes: $0) }
                        #expect(fromBytes == rule.keeps(name), "\(name) \(listed) \(path)")
                    }
                }
            }
        }
        // A route's rule for `/v1/` paths, made once, is the rule made for each such path (that
        // is not open) when the client's Connection lists nothing.
        for credentials in routes {
            let target = GatewayTarget(routeID: "r", baseURL: "http://127.0.0.1:1", via: .lan, credentials: credentials)
            for path in ["/v1/chat/completions", "/v1/models", "/v1/agents/runs/7/events", "/v1/x"] {
                let fresh = GatewayPolicy.UpstreamHeaderRule(connectionListed: [], credentials: credentials, path: path)
                #expect(target.inferenceRule.routeHeaders.map(\.name) == fresh.routeHeaders.map(\.name))
                #expect(target.inferenceRule.routeHeaders.map(\.value) == fresh.routeHeaders.map(\.value))
                for name in names { #expect(target.inferenceRule.keeps(name) == fresh.keeps(name), "\(name) \(path)") }
            }
        }
        // The open paths, told by length first, and nothing else: not a prefix, another case, a
        // trailing slash or another path of the same length.
        for path in Credentials.openPaths { #expect(Credentials.isOpen(path: path)) }
        for path in ["/healthz/", "/Healthz", "/readyz2", "/v1/discoverx", "/v1/discover", "", "/", "/v1/models"] {
            #expect(!Credentials.isOpen(path: path), "\(path)")
        }
        // The data path looks the client's key headers up as these literals.
        #expect(GatewayPolicy.clientKeyHeaders == ["authorization", "x-api-key"])
        // The rule is the one upstreamHeaders applies: a route's key replaces the client's.
        let rule = GatewayPolicy.UpstreamHeaderRule(
            connectionListed: [], credentials: Credentials(inferenceKey: "k"), path: "/v1/models")
        #expect(!rule.keeps("x-api-key") && !rule.keeps("Authorization") && !rule.keeps("cookie"))
        #expect(rule.keeps("Content-Type") && rule.keeps("X-Admin-Key"))
        // On every path, not only where the route sends its key: a client's admin key never
        // reaches `/v1/` of a route with one, nor its bearer `/admin/`; a route with none of
        // either kind passes the client's own.
        let both = Credentials(adminKey: "a", inferenceKey: "k")
        for path in ["/v1/models", "/admin/models", "/healthz"] {
            let rule = GatewayPolicy.UpstreamHeaderRule(connectionListed: [], credentials: both, path: path)
            for name in ["X-Admin-Key", "authorization", "X-Api-Key"] { #expect(!rule.keeps(name), "\(name) \(path)") }
            let open = GatewayPolicy.UpstreamHeaderRule(connectionListed: [], credentials: Credentials(), path: path)
            for name in ["X-Admin-Key", "authorization", "X-Api-Key"] { #expect(open.keeps(name), "\(name) \(path)") }
        }
        let adminOnly = GatewayPolicy.UpstreamHeaderRule(
            connectionListed: [], credentials: Credentials(adminKey: "a"), path: "/v1/models")
        #expect(!adminOnly.keeps("x-admin-key") && adminOnly.keeps("Authorization") && adminOnly.routeHeaders.isEmpty)
        #expect(rule.routeHeaders.map(\.name) == ["Authorization"])
    }

    @Test("keys that could not be sent as header values are told apart (line breaks, NUL, DEL; tab and UTF-8 are fine)")
    func headerSafeCredentials() {
        #expect(
            Credentials(adminKey: "a", inferenceKey: "sk-é\tx", accessClientID: "id", accessClientSecret: "s")
                .isHeaderSafe)
        #expect(Credentials().isHeaderSafe)
        for bad in ["k\r\nX-Evil: 1", "k\n", "k\u{0}", "k\u{7F}", "k\u{1B}[0m"] {
            #expect(!Credentials(inferenceKey: bad).isHeaderSafe, "\(bad.debugDescription)")
            #expect(!Credentials(accessClientID: "id", accessClientSecret: bad).isHeaderSafe)
        }
    }
}
