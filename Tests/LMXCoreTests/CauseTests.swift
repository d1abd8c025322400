import Foundation
import Testing

@testable import LMXCore

private func json(_ s: String) -> [UInt8] { Array(s.utf8) }

/// Runs a probe sequence against answers keyed by path (unlisted paths answer 404).
private func probe(
    _ answers: [String: Result<ProbeResponse, ProbeTransportFailure>], via: Via = .lan, pinned: String? = nil
) -> ProbeReport {
    var sequence = ProbeSequence(servicePath: "/v1/discovery", via: via, pinnedInstance: pinned)
    var step = sequence.receive(answers[sequence.firstPath] ?? .success(ProbeResponse(status: 404)))
    while case .request(let path) = step {
        step = sequence.receive(answers[path] ?? .success(ProbeResponse(status: 404)))
    }
    guard case .finished(let report) = step else { fatalError() }
    return report
}

@Suite("Cause codes: beside every sentence, decoded totally")
struct CauseTests {
    static let healthz = ProbeResponse(status: 200, body: json(#"{"status":"ok","version":"0.1.0"}"#))
    static func document(service: String = "opta-lmx", instance: String = "Mono512") -> ProbeResponse {
        ProbeResponse(
            status: 200,
            body: json(#"{"instance_id":"\#(instance)","service":"\#(service)","ready":true,"loaded_models":["m"]}"#))
    }

    @Test("a code from a newer agent decodes as unknown, never as an error; a missing one as nil")
    func totalDecoding() throws {
        for cause in Cause.allCases {
            let encoded = try JSONEncoder().encode(cause)
            #expect(try JSONDecoder().decode(Cause.self, from: encoded) == cause)
            #expect(Cause(code: cause.rawValue) == cause)
        }
        #expect(try JSONDecoder().decode(Cause.self, from: Data(#""solar_flare""#.utf8)) == .unknown)
        #expect(Cause(code: "") == .unknown)
        let line = try JSONDecoder().decode(
            StatusAPI.WatchLine.self, from: Data(#"{"type":"active","seq":3,"at":"","cause":"solar_flare"}"#.utf8))
        #expect(line.cause == .unknown)
        let old = try JSONDecoder().decode(
            StatusAPI.Event.self,
            from: Data(#"{"id":1,"at":"","kind":"health","reason":"not answering"}"#.utf8))
        #expect(old.cause == nil)
        // A report stored without a code (an older version's) decodes; its verdict still tells.
        let report = try JSONDecoder().decode(
            ProbeReport.self, from: Data(#"{"verdict":"tunnel-down","latency":0.5,"detail":"HTTP 530"}"#.utf8))
        #expect(report.cause == nil && report.effectiveCause == .tunnelDown)
        let newer = try JSONDecoder().decode(
            ProbeReport.self, from: Data(#"{"verdict":"down","latency":0.5,"cause":"solar_flare"}"#.utf8))
        #expect(newer.cause == .unknown)
        #expect(Cause(verdict: .ready) == nil)
    }

    @Test("every code is documented: the socket API's table, the OpenAPI enum, and the notifier's words")
    func documented() throws {
        let docs = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../docs")
        func read(_ name: String) throws -> String {
            try String(contentsOf: docs.appendingPathComponent(name), encoding: .utf8)
        }
        let api = try read("socket-api.md")
        let openAPI = try read("openapi.yaml")
        let dashboard = try read("dashboard.md")
        let enumLine = openAPI.split(separator: "\n").first { $0.contains("enum: [refused,") }.map(String.init) ?? ""
        let listed = enumLine.drop { $0 != "[" }.dropFirst().prefix { $0 != "]" }
            .split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
        #expect(listed == Cause.allCases.map(\.rawValue), "docs/openapi.yaml's Cause enum")
        for cause in Cause.allCases {
            #expect(api.contains("| `\(cause.rawValue)` |"), "docs/socket-api.md lists \(cause.rawValue)")
            if let words = NotificationPlanner.ownWords(cause) {
                #expect(
                    dashboard.contains("`\(cause.rawValue)`") && dashboard.contains("| \(words) |"),
                    "docs/dashboard.md tells \(cause.rawValue) as \(words)")
            }
        }
    }

    @Test("the probe sets a code beside its detail for every way it fails, none when the server is ready")
    func probeCodes() {
        let h = Self.healthz
        let doc = Self.document()
        let ready = ProbeResponse(status: 200, body: json(#"{"status":"ready"}"#))
        let table: [(String, [String: Result<ProbeResponse, ProbeTransportFailure>], Via, String?, Cause?)] = [
            (
                "ready", ["/healthz": .success(h), "/v1/discovery": .success(doc), "/readyz": .success(ready)], .lan,
                nil, nil
            ),
            ("refused", ["/healthz": .failure(.refused)], .lan, nil, .refused),
            ("reset", ["/healthz": .failure(.reset)], .lan, nil, .reset),
            ("timeout", ["/healthz": .failure(.timeout)], .lan, nil, .timedOut),
            ("unreachable", ["/healthz": .failure(.unreachable)], .lan, nil, .unreachable),
            ("no address", ["/healthz": .failure(.noAddress)], .lan, nil, .addressLost),
            ("firewall", ["/healthz": .failure(.blocked)], .lan, nil, .blocked),
            ("name", ["/healthz": .failure(.nameResolution)], .wan, nil, .nameUnresolved),
            ("tls", ["/healthz": .failure(.tls("handshake failed"))], .wan, nil, .tls),
            ("other", ["/healthz": .failure(.other("odd"))], .lan, nil, .connectionFailed),
            ("401", ["/healthz": .success(ProbeResponse(status: 401))], .lan, nil, .keysRefused),
            (
                "access login",
                [
                    "/healthz": .success(
                        ProbeResponse(
                            status: 302, headers: ["Location": "https://t.cloudflareaccess.com/cdn-cgi/access/login"]))
                ],
                .wan, nil, .loginPage
            ),
            (
                "lan redirect", ["/healthz": .success(ProbeResponse(status: 302, headers: ["Location": "/x"]))], .lan,
                nil, .httpStatus
            ),
            ("429", ["/healthz": .success(ProbeResponse(status: 429))], .lan, nil, .overloaded),
            (
                "503 overloaded",
                ["/healthz": .success(ProbeResponse(status: 503, body: json(#"{"error":{"code":"overloaded"}}"#)))],
                .lan, nil, .overloaded
            ),
            ("530", ["/healthz": .success(ProbeResponse(status: 530))], .wan, nil, .tunnelDown),
            ("502 on the LAN", ["/healthz": .success(ProbeResponse(status: 502))], .lan, nil, .httpStatus),
            ("no /healthz", [:], .lan, nil, .wrongService),
            ("/healthz 500", ["/healthz": .success(ProbeResponse(status: 500))], .lan, nil, .httpStatus),
            (
                "not the document", ["/healthz": .success(ProbeResponse(status: 200, body: json("{}")))], .lan, nil,
                .wrongService
            ),
            (
                "other service",
                ["/healthz": .success(h), "/v1/discovery": .success(Self.document(service: "ollama"))], .lan, nil,
                .wrongService
            ),
            (
                "other instance", ["/healthz": .success(h), "/v1/discovery": .success(doc)], .lan, "Studio",
                .wrongInstance
            ),
            ("no instance", ["/healthz": .success(h), "/readyz": .success(ready)], .lan, "Studio", .wrongInstance),
            (
                "not ready",
                [
                    "/healthz": .success(h), "/v1/discovery": .success(doc),
                    "/readyz": .success(ProbeResponse(status: 503)),
                ],
                .lan, nil, .notReady
            ),
            (
                "/readyz 500",
                [
                    "/healthz": .success(h), "/v1/discovery": .success(doc),
                    "/readyz": .success(ProbeResponse(status: 500)),
                ],
                .lan, nil, .httpStatus
            ),
        ]
        for (name, answers, via, pinned, cause) in table {
            let report = probe(answers, via: via, pinned: pinned)
            #expect(report.cause == cause, "\(name): \(report.verdict) \(report.detail ?? "")")
            #expect((report.cause == nil) == (report.verdict == .ready), "\(name)")
        }
    }

    @Test("a page that is not the server's has its own code: a login page, the edge's error page, a captive portal")
    func foreignAnswerCodes() {
        let login = ForeignAnswer.recognise(
            status: 302, html: true, location: "https://team.cloudflareaccess.com/cdn-cgi/access/login/x")
        #expect(login?.cause == .loginPage)
        #expect(ForeignAnswer.recognise(status: 521, html: true, location: nil)?.cause == .edgeError)
        #expect(ForeignAnswer.recognise(status: 511, html: false, location: nil)?.cause == .captivePortal)
    }

    @Test("a failover carries the failed probe's code to the event, its history row, its watch line and the status")
    func failoverCarriesTheCode() {
        var h = PlannerHarness { id, t in id.hasPrefix("lan") && t >= 10 ? .down : .ready }
        h.add(wan("https://t.example.com"))
        h.add(lan("10.0.0.1", name: "Studio"))
        h.run(until: 40)
        #expect(h.planner.activeID == "wan/https://t.example.com")
        #expect(h.switchCauses.last == .refused, "\(h.switches)")
        let healthEvents = h.events.compactMap { event -> Cause?? in
            if case .healthChanged(let state, _, _, let cause) = event, state.id.hasPrefix("lan") { cause } else { nil }
        }
        #expect(healthEvents.last == .some(.refused))
        let snapshot = AgentSnapshot(planner: h.planner, discovery: .running, originWall: 0)
        let events = AgentEvent.from(h.events, of: h.planner)
        let switched = events.last { if case .activeChanged = $0 { true } else { false } }
        #expect(switched?.record?.cause == .refused)
        #expect(switched?.watchLine(in: snapshot, now: h.now)?.cause == .refused)
        let status = snapshot.status(seq: 1, now: h.now)
        let route = status.candidates.flatMap(\.routes).first { $0.id == "lan/10.0.0.1:1234" }
        #expect(route?.cause == .refused && route?.lastProbe?.cause == .refused)
        #expect(status.candidates.flatMap(\.routes).first { $0.active }?.cause == nil)
        #expect(status.noActiveCause == nil, "a route is active")
        var tracker = HistoryTracker()
        _ = tracker.receive([], snapshot: snapshot, at: 0)
        var later = h
        later.script = { _, _ in .tunnelDown }
        later.run(until: 120)
        let none = AgentSnapshot(planner: later.planner, discovery: .running, originWall: 0)
        #expect(later.planner.activeID == nil)
        #expect(none.status(seq: 2, now: later.now).noActiveCause != nil)
        let rows = tracker.receive(AgentEvent.from(later.events, of: later.planner), snapshot: none, at: 1)
        #expect(rows.contains { $0.causeCode == .tunnelDown }, "\(rows.map(\.causeCode))")
    }

    @Test("this machine's network: leaving the subnet and losing the link each have their code")
    func networkCodes() {
        for (path, cause) in [
            (RoutePath.reachable("routed via lan0 from 192.168.77.14", onLink: false), Cause.leftNetwork),
            (.unreachable("lan0 has no carrier", cause: .linkLost), .linkLost),
        ] {
            var h = PlannerHarness { _, _ in .ready }
            h.add(wan("https://t.example.com"))
            h.add(lan("10.0.0.1"))
            h.absorb(
                h.planner.applyPaths(
                    ["lan/10.0.0.1:1234": .reachable("on-link on lan0 from 10.0.0.14", onLink: true)], now: h.now))
            h.run(until: 20)
            h.absorb(h.planner.applyPaths(["lan/10.0.0.1:1234": path], now: h.now))
            #expect(h.planner.activeID == "wan/https://t.example.com")
            #expect(h.switchCauses.last == cause)
            #expect(h.planner.explainCause(h.planner.routes["lan/10.0.0.1:1234"]!) == cause)
        }
    }

    @Test("a route removed carries why: the removal and the switch it makes")
    func removalCodes() {
        var h = PlannerHarness { _, _ in .ready }
        h.add(wan("https://t.example.com"))
        h.add(lan("10.0.0.1"))
        h.run(until: 20)
        let removed = h.planner.remove(
            "lan/10.0.0.1:1234", reason: "its pairing expired", cause: .pairingExpired, now: 20)
        h.absorb(removed)
        #expect(removed.contains { if case .routeRemoved(_, _, .pairingExpired) = $0 { true } else { false } })
        #expect(h.switchCauses.last == .pairingExpired)
        #expect(h.switchCauses.first == .firstUsable)
    }
}
