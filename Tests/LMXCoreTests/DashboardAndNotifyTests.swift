import Testing

@testable import LMXCore

@Suite("The dashboard's rules: its paths, who may load it")
struct DashboardPolicyTests {
    private func refusal(
        method: String = "GET", host: String? = "127.0.0.1:1235", headers: [(String, String)] = [], tcp: Bool = true,
        port: Int? = 1235, localhostIsOurs: Bool = true
    ) -> String? {
        DashboardPolicy.refusal(
            method: method, authority: host, headers: headers.map { (name: $0.0, value: $0.1) }, overTCP: tcp,
            localPort: port,
            localhostIsOurs: localhostIsOurs)?.code
    }

    @Test("the root, the assets and the read endpoints are the dashboard's; /v1/* and /admin/* are not")
    func paths() {
        #expect(DashboardPolicy.resource(path: "/") == .page)
        #expect(DashboardPolicy.resource(path: "/dashboard/app.js") == .script)
        #expect(DashboardPolicy.resource(path: "/dashboard/api/watch") == .watch)
        #expect(DashboardPolicy.resource(path: "/dashboard/api/secrets") == .missing)
        #expect(DashboardPolicy.resource(path: "/dashboard") == .missing)
        for path in ["/v1/models", "/admin/models", "/healthz", "/dashboardx", "//", "/v1/dashboard/app.js"] {
            #expect(DashboardPolicy.resource(path: path) == nil, "\(path)")
        }
    }

    @Test("typed in or from its own page: served; Host with the gateway's port only (DNS rebinding)")
    func host() {
        #expect(refusal() == nil)
        #expect(refusal(host: "localhost:1235") == nil)
        #expect(refusal(host: "[::1]:1235") == nil)
        #expect(refusal(host: "127.0.0.1:1235", headers: [("Sec-Fetch-Site", "none")]) == nil)
        #expect(refusal(headers: [("Origin", "http://127.0.0.1:1235"), ("Sec-Fetch-Site", "same-origin")]) == nil)
        for host in [
            "evil.example:1235", "evil.example", "127.0.0.1", "127.0.0.1:80", "localhost", "[::1]",
            "127.0.0.1:1235.evil", "10.0.0.1:1235", "",
        ] {
            #expect(refusal(host: host) == "forbidden_host", "\(host)")
        }
        #expect(refusal(host: nil) == "forbidden_host")
        #expect(refusal(port: nil) == "forbidden_host")
        #expect(refusal(host: "localhost:1235", localhostIsOurs: false) == "localhost_not_ours")
        #expect(refusal(host: "127.0.0.1:1235", localhostIsOurs: false) == nil)
        // Over the Unix socket no Host is checked (only local users reach it).
        #expect(refusal(host: "anything", tcp: false, port: nil) == nil)
    }

    @Test("other origins, other sites, frames and anything but GET are refused")
    func crossSite() {
        #expect(refusal(headers: [("Origin", "http://evil.example")]) == "forbidden_origin")
        #expect(refusal(headers: [("Origin", "http://localhost:3000")]) == "forbidden_origin")  // another local app
        #expect(refusal(headers: [("Origin", "null")]) == "forbidden_origin")
        #expect(refusal(headers: [("Sec-Fetch-Site", "cross-site")]) == "forbidden_site")
        #expect(refusal(headers: [("Sec-Fetch-Site", "same-site")]) == "forbidden_site")
        #expect(
            refusal(headers: [("Sec-Fetch-Dest", "iframe"), ("Sec-Fetch-Site", "same-origin")]) == "forbidden_frame")
        for method in ["POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"] {
            #expect(refusal(method: method) == "method_not_allowed", "\(method)")
        }
        let names = Set(DashboardPolicy.headers.map { $0.name.lowercased() })
        #expect(
            names.isSuperset(of: [
                "content-security-policy", "x-frame-options", "x-content-type-options", "cache-control",
            ]))
        #expect(!names.contains { $0.hasPrefix("access-control-") || $0 == "set-cookie" })
        let csp = DashboardPolicy.headers.first { $0.name == "Content-Security-Policy" }?.value ?? ""
        #expect(csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'") && !csp.contains("unsafe"))
    }
}

@Suite("The gateway's traffic per model")
struct TrafficStatsTests {
    @Test("requests, errors, first byte and events per second per model and path; bounded")
    func figures() {
        var stats = TrafficStats(maxKeys: 4, samples: 8)
        for i in 0..<10 { stats.answered(model: "m", via: .lan, status: 200, firstByte: Double(i) / 1000, now: 1) }
        stats.answered(model: "m", via: .lan, status: 503, firstByte: 0.5, now: 2)
        stats.answered(model: "m", via: .wan, status: 502, firstByte: nil, answered: false, now: 2)
        stats.streamed(model: "m", via: .lan, firstEvent: 0.02, events: 11, seconds: 0.5, now: 3)
        let report = stats.report(iso: { "\($0)" })
        let lan = report.first { $0.model == "m" && $0.via == .lan }
        #expect(lan?.requests == 11 && lan?.errors == 1 && lan?.streams == 1)
        #expect(stats.recorded == 13)  // every answer and stream end, whichever key
        // The latest 8 first-byte figures: 3…9 ms and the stream's 20 ms.
        #expect(lan?.firstByteP50MS == 6 && lan?.firstByteP95MS == 20)
        #expect(lan?.eventsPerSecondP50 == 20)
        #expect(report.first { $0.via == .wan }?.errors == 1)
        #expect(report.first?.model == "m" && report.first?.via == .lan)  // busiest first

        // Past the bound, a new model takes the place of the one used longest ago; names are
        // bounded and printable.
        stats.answered(model: "bad\nname", via: .lan, status: 200, firstByte: 0.001, now: 4)
        #expect(stats.report(iso: { "\($0)" }).contains { $0.model == TrafficStats.unnamed })
        for i in 0..<100 {
            stats.answered(
                model: "model-\(i)" + String(repeating: "x", count: i * 10), via: .lan, status: 200, firstByte: 0.001,
                now: 4)
        }
        stats.answered(model: nil, via: .lan, status: 200, firstByte: 0.001, now: 4)
        let all = stats.report(iso: { "\($0)" })
        #expect(all.count == 4)
        #expect(!all.contains { $0.model == "m" }, "junk names pushed the model out while they came")
        #expect(all.contains { $0.model == TrafficStats.unnamed } && all.contains { $0.model.hasPrefix("model-99") })
        #expect(stats.takeEvicted().count == 4, "at most maxKeys evicted keys are kept for the caller")
        #expect(stats.takeEvicted().isEmpty)
        #expect(all.allSatisfy { !$0.model.contains("\n") && $0.model.utf8.count <= 128 })
        stats.answered(model: "x", via: .lan, status: 200, firstByte: .nan, now: 5)
        stats.streamed(model: "x", via: .lan, firstEvent: -1, events: Int.max, seconds: 0, now: 5)
    }

    @Test("junk names age out: the models in use keep their places, and one that comes back gets one again")
    func mostRecentlyUsed() {
        var stats = TrafficStats(maxKeys: 8, samples: 4)
        for round in 0..<50 {
            stats.answered(model: "junk-\(round)", via: .lan, status: 200, firstByte: 0.001, now: 1)
            stats.answered(model: "real", via: .lan, status: 200, firstByte: 0.001, now: 1)
        }
        var models = Set(stats.report(iso: { "\($0)" }).map(\.model))
        #expect(models.contains("real") && models.count == 8)
        #expect(!models.contains("junk-0") && models.contains("junk-49"))
        // Real models after the junk: every one of them has its place.
        for model in (0..<8).map({ "model-\($0)" }) {
            stats.answered(model: model, via: .wan, status: 200, firstByte: 0.001, now: 2)
        }
        models = Set(stats.report(iso: { "\($0)" }).map(\.model))
        #expect(models == Set((0..<8).map { "model-\($0)" }))
        #expect(stats.contains(TrafficStats.named(model: "model-0", via: .wan)))
        #expect(!stats.contains(TrafficStats.named(model: "real", via: .lan)))
    }

    @Test("event ends are counted across chunks: lines ended by LF, CRLF or CR alone")
    func events() {
        var after = EventBoundary.Line.start
        func count(_ text: String) -> Int {
            Array(text.utf8).withUnsafeBytes { EventBoundary.count(in: $0, line: &after) }
        }
        #expect(count("data: a\n\ndata: b\n") == 1)
        #expect(count("\ndata: c\r\n\r\n") == 2)
        #expect(count("data: d\n") == 0)
        #expect(count("\n") == 1)
        #expect(count("data: e\r\rdata: f\r") == 1)
        #expect(count("\r") == 1)
        #expect(count("data: g\r") == 0)
        #expect(count("\n\r\n") == 1, "the LF of a CRLF split across reads ends nothing more")
        // Against the count byte by byte, on streams of events, blank lines, carriage returns
        // and long lines cut into chunks anywhere (the carried state across each cut).
        var state: UInt64 = 0xE7E7
        func next(_ bound: Int) -> Int {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Int((state >> 33) % UInt64(bound))
        }
        let pieces = [
            "\n", "\r", "\r\n", "\n\n", "\n\r\n", "data: x", String(repeating: "y", count: 20),
            String(repeating: "\r", count: 9), "data: {\"a\": 1}\n\n",
        ]
        for _ in 0..<3000 {
            let bytes = Array((0..<(1 + next(12))).map { _ in pieces[next(pieces.count)] }.joined().utf8)
            // The grammar's reference: split into lines at CRLF, LF or CR; an empty line ends
            // an event.
            var expected = 0
            var lineStart = EventBoundary.Line.start
            var i = 0
            var lineLength = 0
            while i < bytes.count {
                if bytes[i] == 0x0D || bytes[i] == 0x0A {
                    if lineLength == 0, !(lineStart == .afterCR && bytes[i] == 0x0A) { expected += 1 }
                    if lineStart == .afterCR, bytes[i] == 0x0A, lineLength == 0 {
                        lineStart = .start
                    } else {
                        lineStart = bytes[i] == 0x0D ? .afterCR : .start
                    }
                    lineLength = 0
                } else {
                    lineLength += 1
                    lineStart = .midLine
                }
                i += 1
            }
            var carried = EventBoundary.Line.start
            var counted = 0
            var start = 0
            while start < bytes.count {
                let end = min(bytes.count, start + 1 + next(40))
                counted += bytes[start..<end].withUnsafeBytes { EventBoundary.count(in: $0, line: &carried) }
                start = end
            }
            #expect(
                counted == expected && carried == lineStart,
                "\(String(decoding: bytes, as: UTF8.self).debugDescription)")
        }
    }
}

@Suite("lmx-notify's decisions (quiet at start, one per change, coalesced)")
struct NotificationPlannerTests {
    static func active(_ via: Via, _ name: String) -> StatusAPI.Active {
        StatusAPI.Active(
            baseURL: "http://h:1", openAIBaseURL: "http://h:1/v1", via: via, instanceID: "i", name: name,
            verdict: .ready, since: "",
            routeID: "\(via.rawValue)/h:1", source: .manual)
    }

    static func snapshot(_ active: StatusAPI.Active?, routes: [StatusAPI.RouteStatus] = []) -> StatusAPI.WatchLine {
        StatusAPI.WatchLine(
            type: .snapshot, seq: 1, at: "",
            status: StatusAPI.Status(
                agentVersion: "t", seq: 1, avahi: "running", avahiDetail: nil, active: active,
                noActiveReason: active == nil ? "nothing answers" : nil,
                candidates: [
                    StatusAPI.Candidate(instanceID: "i", name: "n", active: false, verdict: nil, routes: routes)
                ],
                gateway: StatusAPI.Gateway(openAIBaseURL: "http://127.0.0.1:1235/v1", socket: nil)))
    }

    static func line(_ active: StatusAPI.Active?, reason: String = "because", cause: Cause? = nil)
        -> StatusAPI.WatchLine
    {
        StatusAPI.WatchLine(type: .active, seq: 2, at: "", active: active, reason: reason, cause: cause)
    }

    static func impostor(_ id: String) -> StatusAPI.RouteStatus {
        StatusAPI.RouteStatus(
            id: id, baseURL: "http://10.0.0.9:1234", via: .lan, source: .mdns, name: "Fake <b>Studio</b>",
            addresses: [], announced: true,
            health: .up, verdict: .ready, active: false, reason: "", latencyMS: nil, lastProbe: nil, version: nil,
            models: nil, ready: nil,
            probes: 1, failures: 0, credentials: [], pinnedInstance: nil, trust: .impostor)
    }

    @Test("the start is not told; failover and return are told once each, in words, replacing one notification")
    func failoverAndReturn() {
        var planner = NotificationPlanner(interval: 10)
        planner.receive(Self.snapshot(Self.active(.lan, "Studio")), now: 0)
        #expect(planner.due(now: 0).isEmpty)
        #expect(planner.dashboardURL == "http://127.0.0.1:1235/")
        planner.receive(
            Self.line(
                Self.active(.wan, "Studio"), reason: "lan/10.0.0.2:1234 failed: down: connection refused",
                cause: .refused), now: 1)
        let away = planner.due(now: 1)
        #expect(away.count == 1)
        #expect(away.first?.summary == "Switched to the tunnel" && away.first?.topic == .route)
        #expect(
            away.first?.body
                == "The LAN route is not usable (the connection was refused). Requests go to Studio through the tunnel."
        )
        #expect(away.first?.urgency == .normal)
        #expect(planner.due(now: 2).isEmpty)
        planner.receive(Self.line(Self.active(.lan, "Studio")), now: 20)
        let home = planner.due(now: 20)
        #expect(home.map(\.summary) == ["Back home on the LAN"] && home.first?.urgency == .low)
        #expect(planner.nextDue() == nil)
    }

    @Test("a flapping route: at most one notice per interval, and none when it ends where it was seen")
    func flapping() {
        var planner = NotificationPlanner(interval: 10)
        planner.receive(Self.snapshot(Self.active(.lan, "S")), now: 0)
        var told: [(Double, String)] = []
        var t = 0.0
        while t < 60 {
            planner.receive(Self.line(Self.active(Int(t * 2) % 2 == 0 ? .wan : .lan, "S")), now: t)
            for notice in planner.due(now: t) { told.append((t, notice.summary)) }
            t += 0.5
        }
        #expect(told.count <= 6 && told.count >= 1, "\(told)")
        for (a, b) in zip(told, told.dropFirst()) { #expect(b.0 - a.0 >= 10) }
        // Changes held back inside the interval come out at its end, if they still stand.
        var held = NotificationPlanner(interval: 10)
        held.receive(Self.snapshot(Self.active(.lan, "S")), now: 0)
        held.receive(Self.line(Self.active(.wan, "S")), now: 1)
        #expect(held.due(now: 1).count == 1)
        held.receive(Self.line(Self.active(.lan, "S")), now: 2)
        held.receive(Self.line(Self.active(.wan, "S")), now: 3)
        #expect(held.due(now: 5).isEmpty)
        #expect(held.nextDue() == nil)  // back where it was told: nothing to say
        held.receive(Self.line(Self.active(.lan, "S")), now: 6)
        #expect(held.nextDue() == 11)
        #expect(held.due(now: 11).map(\.summary) == ["Back home on the LAN"])
    }

    @Test(
        "10,000 random histories: route notices are an interval apart, each tells a change from what was last told, and the last state is told"
    )
    func randomHistories() {
        var generator = SplitMix64(seed: 29)
        for _ in 0..<10_000 {
            let interval = Double(Int.random(in: 0...20, using: &generator))
            var planner = NotificationPlanner(interval: interval, noServerGrace: 5)
            func place() -> StatusAPI.Active? {
                switch Int.random(in: 0..<3, using: &generator) {
                case 0: Self.active(.lan, "S")
                case 1: Self.active(.wan, "S")
                default: nil
                }
            }
            var kind: Int? = nil
            let start = place()
            planner.receive(Self.snapshot(start), now: 0)
            func kindOf(_ a: StatusAPI.Active?) -> Int { a == nil ? 2 : a!.via == .lan ? 0 : 1 }
            var told = kindOf(start)
            var lastTold = -Double.infinity
            var t = 0.0
            var current = start
            for _ in 0..<Int.random(in: 1...40, using: &generator) {
                t += Double(Int.random(in: 0...8000, using: &generator)) / 1000
                current = place()
                planner.receive(Self.line(current), now: t)
                for notice in planner.due(now: t) where notice.topic == .route {
                    #expect(t - lastTold >= interval)
                    let now =
                        notice.summary == "Back home on the LAN"
                        ? 0 : notice.summary == "Switched to the tunnel" ? 1 : 2
                    #expect(now != told, "a notice that changes nothing")
                    told = now
                    lastTold = t
                }
                kind = kindOf(current)
            }
            // Left alone long enough, what stands is what was last told.
            let later = t + interval + 6
            for notice in planner.due(now: later) where notice.topic == .route {
                told = notice.summary == "Back home on the LAN" ? 0 : notice.summary == "Switched to the tunnel" ? 1 : 2
            }
            #expect(told == kind)
        }
    }

    @Test("no server usable waits out its grace; a restart's brief none is not told")
    func noServer() {
        var planner = NotificationPlanner(interval: 0, noServerGrace: 5)
        planner.receive(Self.snapshot(Self.active(.lan, "S")), now: 0)
        planner.receive(Self.line(nil, reason: "every route is down", cause: .timedOut), now: 1)
        #expect(planner.due(now: 3).isEmpty)
        let none = planner.due(now: 6)
        #expect(none.map(\.summary) == ["No LMX server usable"] && none.first?.urgency == .critical)
        // The agent restarts: a snapshot with nothing yet, then the LAN again within the grace.
        planner.receive(Self.line(Self.active(.lan, "S")), now: 10)
        #expect(planner.due(now: 10).count == 1)
        planner.receive(Self.snapshot(nil), now: 20)
        planner.receive(Self.line(Self.active(.lan, "S")), now: 21)
        #expect(planner.due(now: 30).isEmpty)
    }

    @Test("impostors: told once each (those at start never), markup in names neutralized")
    func impostors() {
        var planner = NotificationPlanner(interval: 10)
        planner.receive(Self.snapshot(Self.active(.lan, "S"), routes: [Self.impostor("old")]), now: 0)
        planner.receive(StatusAPI.WatchLine(type: .health, seq: 3, at: "", route: Self.impostor("old")), now: 1)
        #expect(planner.due(now: 1).isEmpty)
        planner.receive(StatusAPI.WatchLine(type: .candidateAdded, seq: 4, at: "", route: Self.impostor("new")), now: 2)
        planner.receive(StatusAPI.WatchLine(type: .health, seq: 5, at: "", route: Self.impostor("new")), now: 3)
        let told = planner.due(now: 3)
        #expect(told.count == 1 && told.first?.topic == .impostor)
        #expect(told.first?.summary == "An impostor was refused")
        // Nothing the impostor chose (its name, its address) reaches the notification.
        for text in [told.first?.summary ?? "", told.first?.body ?? ""] {
            #expect(!text.contains("Fake") && !text.contains("10.0.0.9") && !text.contains("<"), "\(text)")
        }
        #expect(told.first?.body.hasSuffix("The dashboard shows them: http://127.0.0.1:1235/") == true)
        planner.receive(StatusAPI.WatchLine(type: .health, seq: 6, at: "", route: Self.impostor("third")), now: 4)
        planner.receive(StatusAPI.WatchLine(type: .health, seq: 7, at: "", route: Self.impostor("fourth")), now: 5)
        #expect(planner.due(now: 13).map(\.summary) == ["2 impostors were refused"])
    }

    @Test(
        "notices carry only names the user chose and the agent's own words: an announced server's name, instance and reasons never"
    )
    func onlyChosenNames() {
        let hostile = "https://evil.example/click <b>now</b>"
        func announced(_ via: Via, instance: String) -> StatusAPI.Active {
            StatusAPI.Active(
                baseURL: "http://10.0.0.7:1234", openAIBaseURL: "http://10.0.0.7:1234/v1", via: via,
                instanceID: instance, name: hostile, verdict: .ready, since: "", routeID: "lan/10.0.0.7:1234",
                source: .mdns)
        }
        var planner = NotificationPlanner(interval: 0)
        planner.receive(Self.snapshot(announced(.lan, instance: hostile)), now: 0)
        planner.receive(
            Self.line(
                Self.active(.wan, "Office"),
                reason: "lan/10.0.0.7:1234 failed: alive-not-ready: \(hostile) says visit https://evil.example",
                cause: .notReady),
            now: 1)
        #expect(planner.due(now: 1).map(\.summary) == ["Switched to the tunnel"])
        planner.receive(Self.line(announced(.lan, instance: hostile), reason: hostile), now: 2)
        let told = planner.due(now: 2)
        #expect(told.map(\.summary) == ["Back home on the LAN"])
        #expect(told.first?.body == "Requests go to a server on the local network again.")
        var away = NotificationPlanner(interval: 0)
        away.receive(Self.snapshot(announced(.lan, instance: "Mono512")), now: 0)
        away.receive(
            Self.line(
                Self.active(.wan, "Office"), reason: "Studio failed: alive-not-ready: \(hostile)", cause: .notReady),
            now: 1)
        let notice = away.due(now: 1).first
        #expect(
            notice?.body
                == "The LAN route is not usable (the server is not ready). Requests go to Office through the tunnel.")
        for text in [notice?.summary ?? "", notice?.body ?? ""] { #expect(!text.contains("evil")) }
        // A paired server reached on the LAN by its announcement: named as the pairing names it.
        var paired = NotificationPlanner(interval: 0)
        paired.pairings(
            [
                PairingSummary(
                    id: "p1", name: "Studio", format: .token, url: nil, lan: nil, instance: "Mono512", secrets: [],
                    expiresAt: nil)
            ], wallNow: 0)
        paired.receive(Self.snapshot(Self.active(.wan, "Studio")), now: 0)
        paired.receive(Self.line(announced(.lan, instance: "Mono512")), now: 1)
        #expect(paired.due(now: 1).first?.body == "Requests go to Studio on the local network again.")
        // A reason's text is never read: without a cause, the notice says no why at all.
        var silent = NotificationPlanner(interval: 0)
        silent.receive(Self.snapshot(Self.active(.lan, "Studio")), now: 0)
        silent.receive(Self.line(Self.active(.wan, "Studio"), reason: "down: connection refused"), now: 1)
        #expect(
            silent.due(now: 1).first?.body == "The LAN route is not usable. Requests go to Studio through the tunnel.")
    }

    @Test("every cause code has the agent's own words; a move that is no failure is told without a why")
    func everyCauseHasWords() {
        let noFailure: Set<Cause> = [.firstUsable, .preferred, .reachableAgain, .unknown]
        var seen: [String: Cause] = [:]
        for cause in Cause.allCases {
            let words = NotificationPlanner.words(cause)
            #expect(!words.isEmpty && words != cause.rawValue && !words.contains("_"), "\(cause)")
            #expect(NotificationPlanner.printable(words) == words, "\(cause): plain words, no markup")
            #expect((NotificationPlanner.ownWords(cause) == nil) == noFailure.contains(cause), "\(cause)")
            if let other = seen[words], ![other, cause].allSatisfy([Cause.unreachable, .addressLost].contains) {
                Issue.record("\(cause) and \(other) say the same: \(words)")
            }
            seen[words] = cause
        }
    }

    @Test("no reason text reaches a notification: for every code, any reason gives the notice the code alone gives")
    func codesNotProse() {
        let hostile = "connection refused: https://evil.example <b>tunnel is down</b> pairing expired"
        for cause in Cause.allCases {
            for (from, to) in [(Via.lan, Via.wan), (.wan, .lan)] as [(Via, Via)] {
                var told: [[DesktopNotice]] = []
                for reason in [hostile, "", "x"] {
                    var planner = NotificationPlanner(interval: 0, noServerGrace: 0)
                    planner.receive(Self.snapshot(Self.active(from, "Studio")), now: 0)
                    planner.receive(Self.line(Self.active(to, "Studio"), reason: reason, cause: cause), now: 1)
                    var notices = planner.due(now: 1)
                    planner.receive(Self.line(nil, reason: reason, cause: cause), now: 2)
                    notices += planner.due(now: 2)
                    told.append(notices)
                }
                #expect(told[0] == told[1] && told[1] == told[2], "\(cause): the reason's text changed the notice")
                #expect(told[0].count == 2, "\(cause)")
                for notice in told[0] {
                    #expect(!notice.body.contains("evil") && !notice.body.contains("<"), "\(cause)")
                    if let words = NotificationPlanner.ownWords(cause), notice.summary != "Back home on the LAN" {
                        #expect(notice.body.contains(words), "\(cause): \(notice.body)")
                    }
                }
            }
        }
        // A snapshot (the agent restarted with nothing usable) is told by its code too.
        var planner = NotificationPlanner(interval: 0, noServerGrace: 0)
        planner.receive(Self.snapshot(Self.active(.lan, "S")), now: 0)
        var status = Self.snapshot(nil)
        status.status?.noActiveReason = "Studio on the LAN is busy"
        status.status?.noActiveCause = .pairingExpired
        planner.receive(status, now: 1)
        #expect(
            planner.due(now: 1).first?.body
                == "No server can take requests now: the pairing expired. The agent keeps probing.")
    }

    @Test("a pairing about to expire is told once; others are not")
    func pairings() {
        var planner = NotificationPlanner(interval: 10, expiryWarning: 3 * 86_400)
        planner.receive(Self.snapshot(Self.active(.lan, "S")), now: 0)
        let now = 1_800_000_000.0
        func pairing(_ id: String, in seconds: Double?) -> PairingSummary {
            PairingSummary(
                id: id, name: id, format: .token, url: nil, lan: nil, instance: nil, secrets: [],
                expiresAt: seconds.map { Timestamp.iso8601(now + $0) })
        }
        let list = [pairing("soon", in: 86_400), pairing("later", in: 30 * 86_400), pairing("never", in: nil)]
        planner.pairings(list, wallNow: now)
        let told = planner.due(now: 1)
        #expect(told.map(\.summary) == ["Pairing “soon” expires in 24 hours"])
        planner.pairings(list, wallNow: now + 60)
        #expect(planner.due(now: 100).isEmpty)
        #expect(Timestamp.parse("2026-11-25T10:00:00Z") == 1_795_600_800)
        #expect(Timestamp.parse("2026-11-25T10:00:00.500Z") == 1_795_600_800.5)
        #expect(Timestamp.parse("tomorrow") == nil)
    }

    @Test(
        "one card per server: a paired tunnel that has never answered and the LAN route its server announced are one server; an impostor stays apart"
    )
    func oneCardPerServer() {
        var h = PlannerHarness { id, _ in id.hasPrefix("wan") ? .down : .ready }
        h.instance = { id in id.hasPrefix("wan") ? nil : "home" }
        h.add(wan("https://t.example.com"))
        h.add(lan("10.0.0.1"))
        h.run(until: 5)
        var snapshot = AgentSnapshot(planner: h.planner, discovery: .running, originWall: 0)
        var candidates = snapshot.candidates(now: h.now)
        #expect(candidates.count == 1, "\(candidates.map(\.name))")
        #expect(candidates.first?.routes.count == 2 && candidates.first?.instanceID == "home")
        #expect(snapshot.serverCount == 1)
        // A route that claims the same server from an address the tunnel does not vouch for.
        h.vouch = { _ in ["http://10.0.0.1:1234"] }
        h.add(lan("10.0.0.66"))
        h.run(until: 10)
        snapshot = AgentSnapshot(planner: h.planner, discovery: .running, originWall: 0)
        candidates = snapshot.candidates(now: h.now)
        #expect(candidates.count == 2, "the impostor apart: \(candidates.map(\.name))")
    }
}
