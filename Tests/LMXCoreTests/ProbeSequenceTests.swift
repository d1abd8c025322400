import Testing

@testable import LMXCore

private func json(_ s: String) -> [UInt8] { Array(s.utf8) }

private let healthz = ProbeResponse(status: 200, body: json(#"{"status":"ok","version":"0.1.0"}"#))
private let document = ProbeResponse(
    status: 200,
    body: json(
        #"""
        {"schema_version":"2026-03-02","instance_id":"Mono512:1234","service":"opta-lmx","version":"0.1.0",
         "security_profile":"lan","ready":true,"loaded_models":["m"],"loaded_model_count":1,
         "auth":{"admin_key_required":true,"inference_key_required":false},"future_field":{"x":1}}
        """#))
private let readyz = ProbeResponse(status: 200, body: json(#"{"status":"ready","version":"0.1.0","models_loaded":1}"#))

/// Runs a sequence against answers keyed by path; returns the report and the paths asked.
private func run(
    _ answers: [String: Result<ProbeResponse, ProbeTransportFailure>], via: Via = .lan,
    path: String = "/.well-known/opta-lmx", pinned: String? = nil, key: Bool = false, checkAPI: Bool = false,
    quick: Bool = false
) -> (ProbeReport, [String]) {
    var sequence = ProbeSequence(
        servicePath: path, via: via, pinnedInstance: pinned, quick: quick, hasInferenceKey: key, checkAPI: checkAPI,
        baseURL: "https://t.example.com")
    var asked = [sequence.firstPath]
    var step = sequence.receive(answers[sequence.firstPath] ?? .success(ProbeResponse(status: 404)))
    while case .request(let p) = step {
        asked.append(p)
        step = sequence.receive(answers[p] ?? .success(ProbeResponse(status: 404)))
    }
    guard case .finished(let report) = step else { fatalError() }
    return (report, asked)
}

@Suite("Probe sequence (the LMX contract)")
struct ProbeSequenceTests {
    @Test("a pinned route whose server reports no instance_id (no discovery document) has not proved it")
    func pinNotProved() {
        let (report, _) = run(["/healthz": .success(healthz), "/readyz": .success(readyz)], pinned: "Mono512:1234")
        #expect(report.verdict == .wrongService)
        #expect(report.detail?.contains("did not report an instance_id") == true)
        let (unpinned, _) = run(["/healthz": .success(healthz), "/readyz": .success(readyz)])
        #expect(unpinned.verdict == .ready)  // older servers without the document still work
    }

    @Test("a ready server: healthz, discovery document, readyz, with the facts learned")
    func ready() {
        let (report, asked) = run([
            "/healthz": .success(healthz), "/.well-known/opta-lmx": .success(document), "/readyz": .success(readyz),
        ])
        #expect(asked == ["/healthz", "/.well-known/opta-lmx", "/readyz"])
        #expect(report.verdict == .ready)
        #expect(report.instanceID == "Mono512:1234")
        #expect(report.version == "0.1.0")
        #expect(report.modelCount == 1)
        #expect(report.adminKeyRequired == true)
        #expect(report.inferenceKeyRequired == false)
    }

    @Test("models: from the document, else /v1/models with the key (cloud profile); a failed list keeps the verdict")
    func models() {
        let (lan, asked) = run([
            "/healthz": .success(healthz), "/.well-known/opta-lmx": .success(document), "/readyz": .success(readyz),
        ])
        #expect(lan.models == ["m"])
        #expect(!asked.contains("/v1/models"))
        let cloud = ProbeResponse(
            status: 200,
            body: json(
                #"""
                {"instance_id":"c:1","service":"opta-lmx","security_profile":"cloud","ready":true,"loaded_models":[],
                 "loaded_model_count":2,"auth":{"inference_key_required":true}}
                """#))
        let list = ProbeResponse(
            status: 200, body: json(#"{"object":"list","data":[{"id":"a"},{"id":"b"},{"id":"a"},{"id":"bad\u0001"}]}"#))
        let answers: [String: Result<ProbeResponse, ProbeTransportFailure>] = [
            "/healthz": .success(healthz), "/.well-known/opta-lmx": .success(cloud), "/readyz": .success(readyz),
            "/v1/models": .success(list),
        ]
        let (withKey, askedWithKey) = run(answers, key: true)
        #expect(askedWithKey.last == "/v1/models")
        #expect(withKey.verdict == .ready)
        #expect(withKey.models == ["a", "b"])
        // No key and one is required: not asked, models unknown.
        let (noKey, askedNoKey) = run(answers)
        #expect(!askedNoKey.contains("/v1/models"))
        #expect(noKey.models == nil)
        // A 401 or a dropped connection on the list leaves a ready server ready.
        var failing = answers
        failing["/v1/models"] = .success(ProbeResponse(status: 401))
        #expect(run(failing, key: true).0.verdict == .ready)
        failing["/v1/models"] = .failure(.reset)
        let (reset, _) = run(failing, key: true)
        #expect(reset.verdict == .ready && reset.models == nil)
    }

    @Test("a WAN probe never takes the document's endpoints (LAN addresses) as the route's URL")
    func wanKeepsItsURL() {
        let lanEndpoints = ProbeResponse(
            status: 200,
            body: json(
                #"""
                {"instance_id":"Mono512:1234","service":"opta-lmx","ready":true,"loaded_models":["m"],"loaded_model_count":1,
                 "endpoints":{"preferred_base_url":"http://192.168.188.11:1234","base_urls":["http://192.168.188.11:1234","http://localhost:1234"],
                 "openai_base_url":"http://192.168.188.11:1234/v1"}}
                """#))
        let (report, asked) = run(
            [
                "/healthz": .success(healthz), "/.well-known/opta-lmx": .success(lanEndpoints),
                "/readyz": .success(readyz),
            ], via: .wan)
        #expect(report.verdict == .ready)
        #expect(asked == ["/healthz", "/.well-known/opta-lmx", "/readyz"])
        // The route the probe belongs to is unchanged whatever the document says.
        var planner = ConnectionPlanner(policy: HealthPolicy())
        let tunnel = Route(
            baseURL: "https://quiet-river-1234.trycloudflare.com", via: .wan, source: .pairing, name: "t")
        _ = planner.upsert(tunnel, now: 0)
        _ = planner.takeDueProbes(now: 0)
        _ = planner.record(report, for: tunnel.id, now: 0)
        _ = planner.takeDueProbes(now: 1)
        _ = planner.record(report, for: tunnel.id, now: 1)
        #expect(
            planner.routes["wan/https://quiet-river-1234.trycloudflare.com"]?.route.baseURL
                == "https://quiet-river-1234.trycloudflare.com")
        #expect(planner.active?.route.baseURL == "https://quiet-river-1234.trycloudflare.com")
        // The document's LAN address is another route of the same server (vouched for by the
        // tunnel), never a replacement of the tunnel's URL; localhost names the server's machine.
        #expect(
            planner.routes.keys.sorted() == [
                "lan/192.168.188.11:1234", "wan/https://quiet-river-1234.trycloudflare.com",
            ])
        #expect(planner.routes["lan/192.168.188.11:1234"]?.route.vouchedBy == tunnel.id)
    }

    @Test("readyz 503 is alive, not ready")
    func notReady() {
        let (report, _) = run([
            "/healthz": .success(healthz), "/.well-known/opta-lmx": .success(document),
            "/readyz": .success(
                ProbeResponse(status: 503, body: json(#"{"status":"unavailable","reason":"no models loaded"}"#))),
        ])
        #expect(report.verdict == .aliveNotReady)
        #expect(report.detail == "no models loaded")
    }

    @Test(
        "a server's words reach terminals and logs escaped: C1 controls, bidirectional overrides and line separators in a 503 reason or a service name"
    )
    func hostileWords() {
        let hostile = #"ok\u202Egnp.exe\u009B31m\u2028fake line\u0085x"#
        let (notReady, _) = run([
            "/healthz": .success(healthz), "/.well-known/opta-lmx": .success(document),
            "/readyz": .success(ProbeResponse(status: 503, body: json(#"{"reason":"\#(hostile)"}"#))),
        ])
        let (foreign, _) = run([
            "/healthz": .success(healthz),
            "/.well-known/opta-lmx": .success(ProbeResponse(status: 200, body: json(#"{"service":"\#(hostile)"}"#))),
        ])
        let raw: Set<UInt32> = [0x202E, 0x9B, 0x2028, 0x85]
        for detail in [notReady.detail, foreign.detail] {
            #expect(detail != nil)
            #expect(!(detail ?? "").unicodeScalars.contains { raw.contains($0.value) }, "\(detail ?? "")")
            #expect((detail ?? "").contains(#"\u{202e}"#), "shown, not obeyed: \(detail ?? "")")
        }
    }

    @Test("an older server without a discovery document falls back to /v1/discovery, then is still probed")
    func olderServer() {
        let (report, asked) = run(["/healthz": .success(healthz), "/readyz": .success(readyz)])
        #expect(asked == ["/healthz", "/.well-known/opta-lmx", "/v1/discovery", "/readyz"])
        #expect(report.verdict == .ready)
        #expect(report.instanceID == nil)
    }

    @Test("the TXT path is used for the discovery document")
    func customPath() {
        let (report, asked) = run(
            ["/healthz": .success(healthz), "/custom/doc": .success(document), "/readyz": .success(readyz)],
            path: "/custom/doc")
        #expect(asked == ["/healthz", "/custom/doc", "/readyz"])
        #expect(report.instanceID == "Mono512:1234")
    }

    @Test("load shedding 503 with code overloaded is overloaded, with Retry-After")
    func overloaded() {
        let shed = ProbeResponse(
            status: 503, headers: ["Retry-After": "30"],
            body: json(#"{"error":{"message":"busy","type":"server_error","code":"overloaded"}}"#))
        let (report, _) = run(["/healthz": .success(healthz), "/.well-known/opta-lmx": .success(shed)])
        #expect(report.verdict == .overloaded)
        #expect(report.retryAfter == 30)
    }

    @Test("401 and 403 are auth-rejected; a redirect to a login page on a WAN route too")
    func authRejected() {
        for status in [401, 403] {
            let (report, _) = run(["/healthz": .success(ProbeResponse(status: status))], via: .wan)
            #expect(report.verdict == .authRejected)
        }
        let redirect = ProbeResponse(
            status: 302, headers: ["Location": "https://team.cloudflareaccess.com/cdn-cgi/access/login"])
        let (report, _) = run(["/healthz": .success(redirect)], via: .wan)
        #expect(report.verdict == .authRejected)
    }

    @Test(
        "while a page stands on the route, /v1/models is asked and judged: only the server's own JSON clears it; a login page, a portal's text or a timeout does not"
    )
    func apiJudged() {
        let health: [String: Result<ProbeResponse, ProbeTransportFailure>] = [
            "/healthz": .success(healthz), "/.well-known/opta-lmx": .success(document), "/readyz": .success(readyz),
        ]
        func judged(_ models: Result<ProbeResponse, ProbeTransportFailure>, quick: Bool = false) -> (
            ProbeReport, [String]
        ) {
            var answers = health
            answers["/v1/models"] = models
            return run(answers, via: .wan, checkAPI: true, quick: quick)
        }
        let list = ProbeResponse(
            status: 200, headers: ["Content-Type": "application/json"], body: json(#"{"data":[{"id":"m2"}]}"#))
        let (served, asked) = judged(.success(list))
        #expect(asked.last == "/v1/models" && served.verdict == .ready && served.apiAnswered == true)
        #expect(served.models == ["m2"])
        // The server's own refusal is its answer too (a route without the key it needs).
        let refusal = ProbeResponse(
            status: 401, headers: ["Content-Type": "application/json"], body: json(#"{"detail":"Invalid"}"#))
        #expect(judged(.success(refusal)).0.apiAnswered == true)
        // A quick check asks it too.
        let (quick, quickAsked) = judged(.success(list), quick: true)
        #expect(quickAsked == ["/readyz", "/v1/models"] && quick.apiAnswered == true)
        let login = ProbeResponse(
            status: 302,
            headers: [
                "Location": "https://team.cloudflareaccess.com/cdn-cgi/access/login/x", "Content-Type": "text/html",
            ],
            body: json("<html>Sign in</html>"))
        let (stale, _) = judged(.success(login))
        #expect(stale.verdict == .authRejected && stale.cause == .loginPage && stale.apiAnswered == false)
        for page in [
            ProbeResponse(status: 200, headers: ["Content-Type": "text/plain"], body: json("Please sign in")),
            ProbeResponse(status: 200, body: json("Please sign in")),
            ProbeResponse(status: 200, headers: ["Content-Type": "application/xhtml+xml"], body: json("<html/>")),
        ] {
            let (portal, _) = judged(.success(page))
            #expect(portal.verdict == .down && portal.cause == .captivePortal && portal.apiAnswered == false)
        }
        let block = ProbeResponse(
            status: 403, headers: ["Content-Type": "text/html", "CF-RAY": "8a1-LHR"], body: json("<html>Forbidden"))
        #expect(judged(.success(block)).0.cause == .loginPage)
        // Nothing certain: the health verdict stays, the page is not cleared.
        let (slow, _) = judged(.failure(.timeout))
        #expect(slow.verdict == .ready && slow.apiAnswered == false)
        let (unlabelled, _) = judged(.success(ProbeResponse(status: 500, body: json("oops"))))
        #expect(unlabelled.apiAnswered == false)
        // Not asked: nothing said.
        #expect(run(health, via: .wan).0.apiAnswered == nil)
    }

    @Test("502, 524 and 530 through a tunnel are tunnel-down; on the LAN just down")
    func tunnelDown() {
        for status in [502, 524, 530] {
            let (wanReport, _) = run(["/healthz": .success(ProbeResponse(status: status))], via: .wan)
            #expect(wanReport.verdict == .tunnelDown)
            let (lanReport, _) = run(["/healthz": .success(ProbeResponse(status: status))], via: .lan)
            #expect(lanReport.verdict == .down)
        }
    }

    @Test("another service, or another instance than the pinned one, is the wrong service")
    func wrongService() {
        let other = ProbeResponse(status: 200, body: json(#"{"service":"ollama","instance_id":"x"}"#))
        let (r1, _) = run(["/healthz": .success(healthz), "/.well-known/opta-lmx": .success(other)])
        #expect(r1.verdict == .wrongService)
        let (r2, _) = run(
            ["/healthz": .success(healthz), "/.well-known/opta-lmx": .success(document), "/readyz": .success(readyz)],
            pinned: "Other:1234")
        #expect(r2.verdict == .wrongService)
        #expect(r2.detail?.contains("Other:1234") == true)
        // A plain web server has no /healthz.
        let (r3, _) = run([:])
        #expect(r3.verdict == .wrongService)
    }

    @Test("transport failures are down, with their kind kept")
    func transportFailures() {
        let (r1, _) = run(["/healthz": .failure(.refused)])
        #expect(r1.verdict == .down)
        #expect(r1.detail == "connection refused")
        let (r2, _) = run(["/healthz": .success(healthz), "/.well-known/opta-lmx": .failure(.timeout)])
        #expect(r2.detail == "timed out")
    }

    @Test("credentials go only where the contract says")
    func credentialHeaders() {
        let creds = Credentials(adminKey: "A", inferenceKey: "I", accessClientID: "id", accessClientSecret: "s")
        #expect(creds.headers(forPath: "/healthz").map(\.name) == ["CF-Access-Client-Id", "CF-Access-Client-Secret"])
        #expect(creds.headers(forPath: "/admin/status").map(\.name).contains("X-Admin-Key"))
        #expect(!creds.headers(forPath: "/admin/status").map(\.name).contains("Authorization"))
        #expect(creds.headers(forPath: "/v1/models").map(\.name).contains("Authorization"))
        #expect(!creds.headers(forPath: "/v1/models").map(\.name).contains("X-Admin-Key"))
        #expect(!creds.headers(forPath: "/administrator").map(\.name).contains("X-Admin-Key"))
        let secret = Credentials(adminKey: "ADMIN-SECRET-1", accessClientSecret: "CF-SECRET-2")
        #expect(!"\(secret)".contains("SECRET") && !String(reflecting: secret).contains("SECRET"))
    }

    @Test("timestamps are ISO 8601 UTC")
    func timestamps() {
        #expect(Timestamp.iso8601(0) == "1970-01-01T00:00:00.000Z")
        #expect(Timestamp.iso8601(1_767_225_600.5) == "2026-01-01T00:00:00.500Z")
        #expect(Timestamp.iso8601(951_782_400) == "2000-02-29T00:00:00.000Z")
    }
}
