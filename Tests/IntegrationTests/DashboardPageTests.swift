import Foundation
import LMXCore
import Testing

/// The agent's state as its core computes it, for feeding the dashboard page: a real planner
/// given probe results by hand, its status (`/dashboard/api/status`), its change lines
/// (`/dashboard/api/watch`) and its history with sentences (`/dashboard/api/events`).
private struct Scene {
    var planner = ConnectionPlanner()
    var now = 0.0
    var seq: UInt64 = 0
    var history: [StatusAPI.Event] = []
    /// Real time at instant 0: 2026-11-29T00:00:00Z.
    let origin = 1_795_910_400.0

    var snapshot: AgentSnapshot { AgentSnapshot(planner: planner, discovery: .running, originWall: origin) }
    var status: StatusAPI.Status { snapshot.status(seq: seq, now: now) }
    var events: [StatusAPI.Event] { history.map(snapshot.told) }  // oldest first, as the store answers

    /// The planner's decisions as the agent's outputs see them: the history's rows and the
    /// change stream's lines, numbered.
    mutating func apply(_ decided: [PlannerEvent]) -> [StatusAPI.WatchLine] {
        var lines: [StatusAPI.WatchLine] = []
        for event in AgentEvent.from(decided, of: planner) {
            if let row = event.record {
                history.append(
                    StatusAPI.Event(
                        id: Int64(history.count + 1), at: snapshot.iso(now), kind: row.kind, routeID: row.routeID,
                        from: row.from, to: row.to, reason: row.reason, text: event.sentence(in: snapshot),
                        cause: row.cause))
            }
            if var line = event.watchLine(in: snapshot, now: now) {
                seq += 1
                line.seq = seq
                lines.append(line)
            }
        }
        return lines
    }

    mutating func add(_ route: Route) -> [StatusAPI.WatchLine] { apply(planner.upsert(route, now: now)) }

    mutating func probe(
        _ id: String, _ verdict: HealthVerdict, detail: String? = nil, instance: String?, models: [String]? = nil,
        cause: Cause? = nil
    ) -> [StatusAPI.WatchLine] {
        now += 1
        var report = ProbeReport(
            verdict: verdict, latency: 0.004 + Double(seq % 5) / 1000, detail: detail, cause: cause,
            instanceID: instance, ready: verdict == .ready, modelCount: models?.count)
        report.models = models
        return apply(planner.record(report, for: id, now: now) + planner.tick(now: now))
    }

    /// Probes `id` with `verdict` until `done` says the planner has moved (hysteresis).
    mutating func probeUntil(
        _ id: String, _ verdict: HealthVerdict, detail: String, instance: String?, cause: Cause? = nil,
        _ done: (ConnectionPlanner) -> Bool
    ) -> [StatusAPI.WatchLine] {
        var lines: [StatusAPI.WatchLine] = []
        for _ in 0..<10 where !done(planner) {
            lines += probe(id, verdict, detail: detail, instance: instance, cause: cause)
        }
        return lines
    }
}

/// The dashboard page's own logic in real Chromium: the page's files as the agent serves them,
/// fed by a stand-in with the status, change lines and history the agent's core computes, so every
/// state the page can be in is reached on purpose (a failover while the status answer is slow,
/// no server usable, the agent gone and back, hostile names, nothing known at all).
@Suite("The dashboard page's logic in Chromium (state from a snapshot and change lines)", .serialized)
struct DashboardPageTests {
    private func encode<T: Encodable>(_ value: T) throws -> Any {
        try JSONSerialization.jsonObject(with: StatusAPI.encoder.encode(value), options: [.fragmentsAllowed])
    }

    private func command(_ standIn: LiveProcess, _ value: [String: Any], ack: String) async throws {
        let before = standIn.stdoutLines.filter { $0 == "ok \(ack)" }.count
        let data = try JSONSerialization.data(withJSONObject: value)
        standIn.send(String(decoding: data, as: UTF8.self))
        let acked = await standIn.waitFor(timeout: 5) { process in
            process.stdoutLines.filter { $0 == "ok \(ack)" }.count > before
        }
        #expect(acked, "the stand-in did not take \(ack): \(standIn.stdout.suffix(300)) \(standIn.stderr.suffix(300))")
    }

    private func publish(_ standIn: LiveProcess, _ scene: Scene) async throws {
        try await command(standIn, ["set": "status", "value": try encode(scene.status)], ack: "set status")
        try await command(standIn, ["set": "events", "value": try encode(scene.events)], ack: "set events")
    }

    private func push(_ standIn: LiveProcess, _ lines: [StatusAPI.WatchLine]) async throws {
        for line in lines { try await command(standIn, ["push": try encode(line)], ack: "push 1") }
    }

    @Test(
        "one card per server, failover drawn from the change lines alone (status answer held 5 s), the timeline in the agent's sentences, no server usable, the agent gone and back (resumed with ?since=), hostile names as text, empty states"
    )
    func pageLogic() async throws {
        try await withResources {
            let standIn = LiveProcess(
                "/usr/bin/python3",
                [
                    "\(TestBed.repo)/scripts/fixtures/dashboard-stand-in.py", "--assets",
                    "\(TestBed.repo)/Sources/LMXAgent/Dashboard/Assets",
                ])
            try await standIn.start()
            #expect(await standIn.waitForLine(containing: "listening ", timeout: 10))
            let port = standIn.stdoutLines.first { $0.hasPrefix("listening ") }.flatMap { Int($0.dropFirst(10)) } ?? 0
            try #require(port > 0)

            // The paired server "Studio": its tunnel, and its LAN address the tunnel vouches for;
            // an announcer with a hostile name beside it.
            var scene = Scene()
            let tunnel = Route(
                baseURL: "https://studio.example.com", via: .wan, source: .pairing, name: "Studio",
                pinnedInstance: "studio-1")
            let hostileName = #"<img src=x onerror="document.title='pwned'">Evil & "co""#
            let hostile = Route(
                baseURL: "http://10.0.0.9:1234", via: .lan, source: .mdns, name: hostileName, announced: true)
            _ = scene.add(tunnel)
            _ = scene.add(hostile)
            _ = scene.probe(tunnel.id, .ready, instance: "studio-1", models: ["qwen3-32b"])
            _ = scene.apply(
                scene.planner.applyVouches(
                    for: tunnel.id, advertised: ["http://10.0.0.1:1234"], instanceID: "studio-1", now: scene.now))
            let lanID = Route.identifier(baseURL: "http://10.0.0.1:1234", via: .lan)
            _ = scene.probe(lanID, .ready, instance: "studio-1", models: ["qwen3-32b"])
            _ = scene.probe(hostile.id, .ready, instance: "evil", models: ["x"])
            try #require(scene.planner.activeID == lanID, "the LAN route is active: \(scene.status)")
            try #require(scene.status.candidates.count == 2)

            try await publish(standIn, scene)
            let expires = Timestamp.iso8601(Date().timeIntervalSince1970 + 2 * 86_400 + 3_600)
            let pairing = PairingSummary(
                id: "p1", name: "Studio", format: .token, url: tunnel.baseURL, lan: "10.0.0.1:1234",
                instance: "studio-1", secrets: ["admin_key", "api_key"], expiresAt: expires,
                routes: [
                    PairingRouteState(
                        id: tunnel.id, baseURL: tunnel.baseURL, via: .wan, verdict: .aliveNotReady, detail: nil,
                        active: false)
                ])
            try await command(standIn, ["set": "pairings", "value": try encode([pairing])], ack: "set pairings")
            let traffic = StatusAPI.Traffic(
                since: scene.snapshot.iso(0),
                models: [
                    StatusAPI.ModelTraffic(
                        model: "qwen3-32b", via: .lan, requests: 12, errors: 1, streams: 3, firstByteP50MS: 41.5,
                        firstByteP95MS: 120, eventsPerSecondP50: 38.2, lastAt: scene.snapshot.iso(scene.now))
                ])
            try await command(standIn, ["set": "traffic", "value": try encode(traffic)], ack: "set traffic")

            let browser = try await Browser.start()
            try await browser.open("http://127.0.0.1:\(port)/")
            #expect(
                await browser.waitUntil("return document.getElementById('now').dataset.via === 'lan'", timeout: 10)
                    != nil)
            #expect(await browser.text("connection") == "Live")
            #expect(await browser.text("active-where") == "On the LAN: Studio")
            #expect(await browser.text("active-why") == "Directly on the local network.")
            // One card per server: Studio with its two routes; the announcer apart, its name as text.
            let cards =
                try await browser.run(
                    "return [...document.querySelectorAll('#servers .card')].map((c) => [c.querySelector('h3').textContent, c.querySelectorAll('.route').length])"
                ) as? [[Any]] ?? []
            #expect(cards.count == 2, "\(cards)")
            #expect(cards.contains { $0.first as? String == "Studio" && $0.last as? Int == 2 }, "\(cards)")
            #expect(cards.contains { $0.first as? String == hostileName && $0.last as? Int == 1 }, "\(cards)")
            #expect((try await browser.run("return document.querySelectorAll('#servers img').length")) as? Int == 0)
            // The active route says so once, with its badge, not again as its reason.
            let activeRoute =
                try await browser.run(
                    "const r = document.querySelector('[data-route=\"\(lanID)\"]'); return [r.querySelectorAll('.reason').length, [...r.querySelectorAll('.badge')].map((b) => b.textContent).join(' ')]"
                ) as? [Any]
            #expect(
                activeRoute?.first as? Int == 0 && activeRoute?.last as? String == "LAN ready active",
                "\(activeRoute ?? [])")
            #expect((try await browser.run("return document.title")) as? String == "lmx-agent")
            let hostileVerdict =
                try await browser.run(
                    "return document.querySelector('[data-route=\"\(hostile.id)\"]').dataset.verdict") as? String
            #expect(hostileVerdict == "untrusted", "an announcer under the paired trust policy")
            // The timeline: the agent's sentences, newest first; an event without one (an older agent) still reads.
            let upgrade = await browser.waitUntil(
                "return [...document.querySelectorAll('#events .what')].some((e) => e.textContent === 'Requests now go on the LAN to Studio: Studio on the LAN is preferred to Studio through its tunnel.')",
                timeout: 5)
            let timeline = await browser.text("events")
            #expect(upgrade != nil, "\(timeline)")
            #expect(timeline.contains("Found Studio through its tunnel (from a pairing)."), "\(timeline)")
            #expect(
                await browser.waitUntil(
                    "return /12/.test(document.querySelector('#traffic tbody').textContent)", timeout: 5) != nil)
            let trafficText = await browser.text("traffic")
            #expect(trafficText.contains("42 ms / 120 ms"), "\(trafficText)")
            let pairings = await browser.text("pairings")
            #expect(
                pairings.contains("Expires in 2 days") && pairings.contains("routes: no model loaded"), "\(pairings)")
            #expect(pairings.contains("Keys: admin_key, api_key (kept by the agent)"), "\(pairings)")

            // The page's verdict words are the agent's (EventWords.label), code by code.
            let words =
                try await browser.run(
                    "return Object.fromEntries(Object.entries(VERDICTS).map(([k, v]) => [k, v[0]]))")
                as? [String: String]
            for verdict in HealthVerdict.allCases {
                #expect(words?[verdict.rawValue] == EventWords.label(verdict), "\(verdict)")
            }

            // Failover, drawn from the change lines alone: the status answer is held for 5 s.
            try await command(standIn, ["delay": "status", "seconds": 5], ack: "delay status")
            let failover = scene.probeUntil(lanID, .down, detail: "timed out", instance: nil, cause: .timedOut) {
                $0.activeID != lanID
            }
            try #require(scene.planner.activeID == tunnel.id, "\(scene.status)")
            try await push(standIn, failover)
            #expect(
                await browser.waitUntil("return document.getElementById('now').dataset.via === 'wan'", timeout: 2)
                    != nil)
            #expect(await browser.text("active-where") == "Through the tunnel: Studio")
            // The LAN route's verdict from its own line, once the agent counts it down.
            let down = scene.probeUntil(lanID, .down, detail: "timed out", instance: nil, cause: .timedOut) {
                $0.routes[lanID]?.health == .down
            }
            try await push(standIn, down)
            #expect(
                await browser.waitUntil(
                    "return document.querySelector('[data-route=\"\(lanID)\"]').dataset.verdict === 'down'", timeout: 2)
                    != nil)
            // Why the tunnel: the LAN route's reason, from the status fetched again once it answers.
            try await publish(standIn, scene)
            try await command(standIn, ["delay": "status", "seconds": 0], ack: "delay status")
            let whyNow = await browser.waitUntil(
                "return document.getElementById('active-why').textContent.startsWith('The LAN route is not usable: not answering: timed out')",
                timeout: 8)
            let why = await browser.text("active-why")
            #expect(whyNow != nil, "\(why)")
            // The route's cause code beside its reason, for programs and a hover.
            #expect(
                try await browser.run(
                    "const r = document.querySelector('[data-route=\"\(lanID)\"]'); return [r.dataset.cause, r.querySelector('.reason').title].join(' ')"
                ) as? String == "timed_out cause: timed_out")
            let moved = "Requests now go through the tunnel to Studio: Studio on the LAN is not answering (timed out)."
            let told = await browser.waitUntil(
                "return [...document.querySelectorAll('#events .what')].some((e) => e.textContent === '\(moved)')",
                timeout: 5)
            let later = await browser.text("events")
            #expect(told != nil, "\(later)")

            // Nothing usable: the page says so, with the agent's reason.
            let lost = scene.probeUntil(tunnel.id, .tunnelDown, detail: "HTTP 530", instance: nil) {
                $0.activeID == nil
            }
            try #require(scene.planner.activeID == nil)
            try await publish(standIn, scene)
            try await push(standIn, lost)
            #expect(
                await browser.waitUntil("return document.getElementById('now').dataset.via === 'none'", timeout: 2)
                    != nil)
            #expect(await browser.text("active-where") == "No server usable")
            let none = await browser.text("active-why")
            #expect(
                none.contains("Studio through its tunnel cannot be reached: its tunnel is down (HTTP 530)"), "\(none)")

            // The agent gone: said at once; back: live again, resumed after the last line seen.
            try await command(standIn, ["refuse": true], ack: "refuse")
            try await command(standIn, ["cut": true], ack: "cut")
            #expect(
                await browser.waitUntil(
                    "return document.getElementById('connection').dataset.state === 'lost'", timeout: 3) != nil)
            #expect(await browser.text("connection") == "Agent not answering; reconnecting…")
            try await command(standIn, ["refuse": false], ack: "accept")
            #expect(
                await browser.waitUntil(
                    "return document.getElementById('connection').dataset.state === 'live'", timeout: 5) != nil)
            #expect(
                standIn.stdoutLines.contains("watch since=\(scene.seq)"),
                "\(standIn.stdoutLines.filter { $0.hasPrefix("watch") })")

            // Nothing known at all: each part says so.
            let empty = Scene()
            try await command(standIn, ["set": "events", "value": [Any]()], ack: "set events")
            try await command(standIn, ["set": "pairings", "value": [Any]()], ack: "set pairings")
            try await command(
                standIn, ["set": "traffic", "value": try encode(StatusAPI.Traffic(since: "", models: []))],
                ack: "set traffic")
            try await command(standIn, ["set": "status", "value": try encode(empty.status)], ack: "set status")
            let snapshot = StatusAPI.WatchLine(type: .snapshot, seq: scene.seq + 1, at: "", status: empty.status)
            try await push(standIn, [snapshot])
            #expect(
                await browser.waitUntil(
                    "return document.getElementById('servers').textContent.startsWith('No server known yet')",
                    timeout: 5)
                    != nil)
            #expect(
                await browser.waitUntil(
                    "return document.getElementById('events').textContent === 'No event yet.'", timeout: 5) != nil)
            #expect(await browser.text("pairings") == "No pairing. Pair with: lmx-pair pairing.png")
            #expect(
                await browser.waitUntil(
                    "return document.getElementById('traffic').tBodies[0].textContent === 'No request through the gateway yet.'",
                    timeout: 8) != nil)

            // No script error on the way (the refused streams' 503s are the browser's own notes).
            let errors = try await browser.console().filter {
                $0.level == "SEVERE" && !$0.message.contains("Failed to load resource")
            }
            #expect(errors.isEmpty, "\(errors)")
        }
    }
}
