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

    @Test("only idempotent methods are retried after the request may have been sent")
    func idempotence() {
        for method in ["GET", "HEAD", "OPTIONS", "PUT", "DELETE", "get"] { #expect(GatewayPolicy.isIdempotent(method)) }
        for method in ["POST", "PATCH"] { #expect(!GatewayPolicy.isIdempotent(method)) }
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
        #expect(down.map(\.name) == ["Content-Type"])
        let hop = GatewayPolicy.downstreamHeaders([
            ("Connection", "X-Hop, keep-alive"), ("X-Hop", "1"), ("X-Request-ID", "r"),
        ])
        #expect(hop.map(\.name) == ["X-Request-ID"])
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
}
