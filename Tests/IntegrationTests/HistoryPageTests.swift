import Foundation
import LMXCore
import Testing

/// A day of the agent's core on a manual clock: a real planner fed probes a minute apart (a
/// failover at 09:00, the return at 11:00, a slow hour from 15:00), the history's tracker turning
/// its events and snapshots into the history's rows as the daemon's recorder does, and the events
/// as the store keeps them.
private struct Day {
    var planner = ConnectionPlanner()
    var tracker = HistoryTracker()
    var transitions: [HistoryTransition] = []
    var events: [StatusAPI.Event] = []
    var probes: [ProbeFigures] = []
    var traffic: [TrafficFigures] = []
    var now = 0.0
    /// Real time at instant 0: a day before the test ran, on a whole hour.
    let origin = History.align(Date().timeIntervalSince1970 - 86_400, 3600)

    var snapshot: AgentSnapshot { AgentSnapshot(planner: planner, discovery: .running, originWall: origin) }

    mutating func apply(_ decided: [PlannerEvent]) {
        let snapshot = snapshot
        let agentEvents = AgentEvent.from(decided, of: planner)
        for event in agentEvents {
            if let row = event.record {
                events.append(
                    StatusAPI.Event(
                        id: Int64(events.count + 1), at: snapshot.iso(now), kind: row.kind, routeID: row.routeID,
                        from: row.from, to: row.to, reason: row.reason, text: event.sentence(in: snapshot)))
            }
        }
        transitions += tracker.receive(agentEvents, snapshot: snapshot, at: origin + now)
    }

    mutating func probe(_ id: String, _ verdict: HealthVerdict, latency: Double, detail: String? = nil) {
        let report = ProbeReport(
            verdict: verdict, latency: latency, detail: detail, instanceID: verdict.isAlive ? "studio-1" : nil,
            ready: verdict == .ready, modelCount: 1)
        tracker.minutes.probed(route: id, at: origin + now, latency: latency)
        apply(planner.record(report, for: id, now: now) + planner.tick(now: now))
    }

    /// The minutes that are over, taken as the recorder takes them each minute.
    mutating func flush(final: Bool = false) {
        let taken = tracker.minutes.take(before: final ? .infinity : History.align(origin + now, 60))
        probes += taken.probes
        traffic += taken.traffic
    }
}

/// The dashboard's history in real Chromium: the page's files as the agent serves them, fed by
/// the stand-in with the history the agent's core makes of a scripted day; then a week of 20
/// routes for speed; the screenshots of docs/images.
@Suite("The dashboard's history in Chromium: a scripted day on a manual clock, a week of 20 routes", .serialized)
struct HistoryPageTests {
    private func encode<T: Encodable>(_ value: T) throws -> Any {
        try JSONSerialization.jsonObject(with: StatusAPI.encoder.encode(value), options: [.fragmentsAllowed])
    }

    private func set(_ standIn: LiveProcess, _ name: String, _ value: Any) async throws {
        let before = standIn.stdoutLines.filter { $0 == "ok set \(name)" }.count
        let data = try JSONSerialization.data(withJSONObject: ["set": name, "value": value])
        standIn.send(String(decoding: data, as: UTF8.self))
        let acked = await standIn.waitFor(timeout: 5) { process in
            process.stdoutLines.filter { $0 == "ok set \(name)" }.count > before
        }
        #expect(acked, "the stand-in did not take \(name)")
    }

    private var screenshotDirectory: String {
        ProcessInfo.processInfo.environment["LMX_SCREENSHOT_DIR"] ?? "/tmp/lmx-screenshots"
    }

    /// The scripted day: Studio paired (its tunnel) with its LAN address; the LAN down from 09:00
    /// to 11:00, slow from 15:00 to 16:00; requests through the gateway each minute on the route
    /// in use.
    private func scriptedDay() -> (Day, lanID: String, tunnelID: String) {
        var day = Day()
        let tunnel = Route(
            baseURL: "https://studio.example.com", via: .wan, source: .pairing, name: "Studio",
            pinnedInstance: "studio-1")
        day.apply(day.planner.upsert(tunnel, now: 0))
        day.apply(
            day.planner.applyVouches(
                for: tunnel.id, advertised: ["http://10.0.0.1:1234"], instanceID: "studio-1", now: 0))
        let lanID = Route.identifier(baseURL: "http://10.0.0.1:1234", via: .lan)
        for minute in 0..<1440 {
            day.now = Double(minute) * 60 + 1
            let hour = minute / 60
            let lanDown = (9..<11).contains(hour)
            let slow = hour == 15
            day.probe(
                lanID, lanDown ? .down : .ready, latency: lanDown ? 3 : slow ? 0.9 : 0.004 + Double(minute % 7) / 1000,
                detail: lanDown ? "timed out" : nil)
            day.now += 1
            day.probe(tunnel.id, .ready, latency: 0.04 + Double(minute % 5) / 1000)
            let via: Via = day.planner.activeID == tunnel.id ? .wan : .lan
            let at = day.origin + day.now + 10
            for request in 0..<3 {
                let firstToken = via == .wan ? 0.8 : slow ? 2.5 : 0.25 + Double(request) / 100
                day.tracker.minutes.answered(
                    model: "qwen3-32b", via: via, at: at, status: 200, answered: true, firstToken: nil)
                day.tracker.minutes.streamed(
                    model: "qwen3-32b", via: via, at: at, firstToken: firstToken, events: via == .wan ? 36 : 61,
                    seconds: 1)
            }
            day.flush()
        }
        day.flush(final: true)
        return (day, lanID, tunnel.id)
    }

    /// A week of 20 routes (10 servers, LAN and tunnel each) flapping every 40 minutes or so,
    /// four models on both paths: what the page must still draw at once.
    private func week() -> StatusAPI.History {
        let until = History.align(Date().timeIntervalSince1970, 60)
        let since = until - 7 * 86_400
        var transitions: [HistoryTransition] = []
        for server in 0..<10 {
            for via in Via.allCases {
                let id = "\(via.rawValue)/server-\(server)"
                var t = since - 60
                var down = false
                var index = 0
                while t < until {
                    transitions.append(
                        HistoryTransition(
                            routeID: id, at: t, state: down ? .down : .ready, active: !down && via == .lan,
                            cause: down ? "Not answering (timed out)." : "Ready.", name: "Server \(server)", via: via,
                            server: "server-\(server)"))
                    index += 1
                    down.toggle()
                    t += down ? Double(30 + (index * 7 + server) % 25) * 60 : Double(3 + index % 6) * 60
                }
            }
        }
        let traffic = stride(from: since, to: until, by: 600).flatMap { at in
            ["qwen3-32b", "llama-8b", "phi-4", "mistral-7b"].flatMap { model in
                Via.allCases.map { via in
                    TrafficFigures(
                        model: model, via: via, at: at, step: 600, requests: 40, errors: 1, firstTokens: 40,
                        firstTokenP50: via == .lan ? 0.3 : 0.9, firstTokenP95: 1.2, streams: 30,
                        tokensPerSecond: via == .lan ? 60 : 30)
                }
            }
        }
        return History.build(
            History.Query(since: since, until: until, step: 2100), transitions: transitions, probes: [],
            traffic: traffic)
    }

    @Test(
        "the ribbons of a scripted day show the switches at the agent's events' times; hover and keys tell each stretch; charts LAN and tunnel; the paths now; 390 px light and dark with nothing cut or overlapping; a week of 20 routes drawn fast"
    )
    func scriptedDayInChromium() async throws {
        try await withResources {
            let (day, lanID, tunnelID) = scriptedDay()
            let history = History.build(
                History.Query(since: day.origin, until: day.origin + 86_400, step: 300),
                transitions: day.transitions, probes: day.probes, traffic: day.traffic)
            let switchTimes = day.events.filter { $0.kind == "active" }.map(\.at)
            // The day as scripted: on the LAN, the tunnel soon after 09:00, back soon after 11:00.
            let away = day.events.filter { $0.kind == "active" && $0.to == tunnelID }.compactMap {
                Timestamp.parse($0.at)
            }
            let back = day.events.filter { $0.kind == "active" && $0.to == lanID }.compactMap { Timestamp.parse($0.at) }
            try #require(
                away.contains { ($0 - day.origin) >= 9 * 3600 && ($0 - day.origin) < 9.25 * 3600 }
                    && back.contains { ($0 - day.origin) >= 11 * 3600 && ($0 - day.origin) < 11.25 * 3600 },
                "\(day.events.map { ($0.at, $0.text ?? "") })")
            #expect(history.switches.map(\.at) == switchTimes)

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
            try await set(standIn, "status", try encode(day.snapshot.status(seq: 1, now: day.now)))
            try await set(standIn, "events", try encode(Array(day.events.suffix(50))))
            try await set(standIn, "history", try encode(history))
            let traffic = StatusAPI.Traffic(
                since: day.snapshot.iso(0),
                models: [
                    StatusAPI.ModelTraffic(
                        model: "qwen3-32b-instruct-with-a-long-name", via: .lan, requests: 4212, errors: 3,
                        streams: 4000,
                        firstByteP50MS: 250, firstByteP95MS: 2480, eventsPerSecondP50: 60.2,
                        lastAt: day.snapshot.iso(day.now)),
                    StatusAPI.ModelTraffic(
                        model: "qwen3-32b-instruct-with-a-long-name", via: .wan, requests: 360, errors: 0, streams: 360,
                        firstByteP50MS: 800, firstByteP95MS: 810, eventsPerSecondP50: 35.1,
                        lastAt: day.snapshot.iso(day.now)),
                ])
            try await set(standIn, "traffic", try encode(traffic))

            let browser = try await Browser.start(width: 1200, height: 900)
            try await browser.open("http://127.0.0.1:\(port)/")
            #expect(
                await browser.waitUntil(
                    "return document.querySelectorAll('#ribbons .ribbon').length === 2", timeout: 10)
                    != nil)
            // The switch marks: at the events' very times, on both ribbons of the server.
            let marks =
                try await browser.run(
                    "return [...new Set([...document.querySelectorAll('#ribbons line.switch')].map((l) => l.dataset.at))]"
                )
                as? [String] ?? []
            #expect(marks == switchTimes, "page \(marks) events \(switchTimes)")
            // Each mark where its time falls across the ribbon (0 to 1000 over the day).
            let xs =
                try await browser.run(
                    "return [...document.querySelectorAll('#ribbons [data-route=\"\(lanID)\"] line.switch')].map((l) => Number(l.getAttribute('x1')))"
                ) as? [Double] ?? []
            for (x, at) in zip(xs, switchTimes) {
                let expected = ((Timestamp.parse(at) ?? 0) - day.origin) / 86_400 * 1000
                #expect(abs(x - expected) < 0.1, "\(at): x \(x), expected \(expected)")
            }
            // The LAN's ribbon: in use, down (not in use) during the failover, in use again.
            let states =
                try await browser.run(
                    "return [...document.querySelectorAll('#ribbons [data-route=\"\(lanID)\"] .seg')].map((r) => r.dataset.state)"
                ) as? [String] ?? []
            #expect(
                states.first { $0 != "unknown" } == "ready" && states.contains("down") && states.last == "ready",
                "\(states)")
            let inUse =
                try await browser.run(
                    "return document.querySelectorAll('#ribbons [data-route=\"\(tunnelID)\"] .in-use').length") as? Int
            #expect((inUse ?? 0) >= 1, "the tunnel was in use")

            // Keys: Home is the first stretch; the arrows walk to the outage, told with its cause.
            let told =
                try await browser.run(
                    """
                    const r = document.querySelector('#ribbons [data-route="\(lanID)"] svg');
                    r.focus();
                    r.dispatchEvent(new KeyboardEvent('keydown', { key: 'Home', bubbles: true }));
                    const said = [r.closest('article').querySelector('.told').textContent];
                    for (let i = 0; i < 6; i++) {
                      r.dispatchEvent(new KeyboardEvent('keydown', { key: 'ArrowRight', bubbles: true }));
                      said.push(r.closest('article').querySelector('.told').textContent);
                    }
                    return said;
                    """) as? [String] ?? []
            #expect(told.contains { $0.hasPrefix("LAN: ready, in use, ") }, "\(told)")
            #expect(told.contains { $0.contains("down") && $0.contains("timed out") }, "\(told)")
            // The pointer: 10:00 is in the outage.
            let pointed =
                try await browser.run(
                    """
                    const r = document.querySelector('#ribbons [data-route="\(tunnelID)"] svg');
                    const b = r.getBoundingClientRect();
                    r.dispatchEvent(new PointerEvent('pointermove', { clientX: b.left + b.width * 10 / 24, clientY: b.top + 5, bubbles: true }));
                    return r.closest('article').querySelector('.told').textContent;
                    """) as? String ?? ""
            #expect(pointed.hasPrefix("tunnel: ready, in use"), "\(pointed)")

            // The charts: first token and tokens per second, LAN and tunnel; the slow hour shows.
            let charts =
                try await browser.run(
                    "return [...document.querySelectorAll('#charts svg.chart')].map((c) => [c.getAttribute('aria-label'), c.querySelectorAll('polyline').length])"
                ) as? [[Any]] ?? []
            #expect(charts.count == 2 && charts.allSatisfy { $0.last as? Int == 2 }, "\(charts)")
            let firstToken = charts.first?.first as? String ?? ""
            // (Medians of 250, 260 and 270 ms, 2.5 s in the slow hour; 800 ms on the tunnel.)
            #expect(
                firstToken.contains("LAN 260 to 2500 ms") && firstToken.contains("tunnel 800 to 800 ms"),
                "\(firstToken)")
            // The paths now: the LAN drawn in use, the tunnel not.
            let links =
                try await browser.run(
                    "return [...document.querySelectorAll('#paths path.link')].map((p) => p.dataset.via + ':' + p.dataset.active)"
                )
                as? [String] ?? []
            #expect(Set(links) == ["lan:true", "wan:false"], "\(links)")

            let dir = screenshotDirectory
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            try await browser.resize(width: 1200, height: 2300)
            _ = try await browser.run("document.getElementById('paths-title').scrollIntoView()")
            try await Task.sleep(for: .milliseconds(300))
            _ = try await browser.screenshot(to: dir + "/dashboard-history-light.png")
            try await browser.prefersDark(true)
            try await Task.sleep(for: .milliseconds(300))
            _ = try await browser.screenshot(to: dir + "/dashboard-history-dark.png")

            // A phone: nothing wider than the screen, the traffic table whole, the sparkline apart.
            for dark in [false, true] {
                try await browser.prefersDark(dark)
                try await browser.resize(width: 390, height: 2600)
                try await Task.sleep(for: .milliseconds(400))
                let overflow =
                    try await browser.run(
                        "return document.documentElement.scrollWidth - document.documentElement.clientWidth") as? Int
                #expect(overflow == 0, "scrolls sideways by \(overflow ?? -1) px")
                let cut =
                    try await browser.run(
                        """
                        const width = document.documentElement.clientWidth;
                        return [...document.querySelectorAll('#traffic td, .ribbon, .chart, .paths, #ranges')]
                          .filter((e) => { const b = e.getBoundingClientRect(); return b.right > width + 0.5 || b.left < -0.5; })
                          .map((e) => e.tagName + ' ' + e.textContent.slice(0, 20));
                        """) as? [String] ?? ["?"]
                #expect(cut.isEmpty, "cut at 390 px: \(cut)")
                let overlaps =
                    try await browser.run(
                        """
                        return [...document.querySelectorAll('.latency')].filter((l) => {
                          const s = l.querySelector('svg'); const t = l.querySelector('span');
                          if (!s || !t) return false;
                          const a = s.getBoundingClientRect(), b = t.getBoundingClientRect();
                          return a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
                        }).length;
                        """) as? Int
                #expect(overlaps == 0)
                _ = try await browser.screenshot(to: dir + "/dashboard-phone-\(dark ? "dark" : "light").png")
            }
            try await browser.prefersDark(false)

            // A week of 20 routes: the 7-day view drawn, and drawn again, in a fraction of a second.
            try await set(standIn, "history", try encode(week()))
            try await browser.resize(width: 1200, height: 900)
            try await browser.open("http://127.0.0.1:\(port)/")
            #expect(
                await browser.waitUntil(
                    "return document.querySelectorAll('#ribbons .ribbon').length === 20", timeout: 10) != nil)
            let paint =
                try await browser.run(
                    "return [performance.getEntriesByName('first-contentful-paint')[0].startTime, Number(document.getElementById('history').dataset.drawnAt)]"
                ) as? [Double] ?? []
            var redraws: [Double] = []
            for range in ["7d", "24h", "7d"] {
                let before =
                    try await browser.run("return document.getElementById('history').dataset.loaded") as? String
                _ = try await browser.run("document.querySelector('#ranges button[data-range=\"\(range)\"]').click()")
                _ = await browser.waitUntil(
                    "return document.getElementById('history').dataset.loaded !== '\(before ?? "")'", timeout: 10)
                redraws.append(
                    Double(
                        try await browser.run("return document.getElementById('history').dataset.drawnMs") as? String
                            ?? "")
                        ?? -1)
            }
            let segments =
                try await browser.run("return document.querySelectorAll('#ribbons .seg').length") as? Int ?? 0
            let hover =
                try await browser.run(
                    """
                    const r = document.querySelector('#ribbons .ribbon');
                    const b = r.getBoundingClientRect();
                    const t0 = performance.now();
                    for (let i = 0; i < 100; i++) r.dispatchEvent(new PointerEvent('pointermove', { clientX: b.left + b.width * i / 100, clientY: b.top + 5 }));
                    return (performance.now() - t0) / 100;
                    """) as? Double ?? -1
            print(
                "figure: a week of 20 routes (\(segments) stretches): first paint \(Int(paint.first ?? -1)) ms, ribbons drawn at \(Int(paint.last ?? -1)) ms; redraw (fetch and draw) \(redraws.map { String(format: "%.0f", $0) }.joined(separator: " / ")) ms; a pointer move \(String(format: "%.2f", hover)) ms"
            )
            #expect(segments > 5000)
            #expect(paint.count == 2 && paint[1] < 3000, "\(paint)")
            #expect(redraws.allSatisfy { $0 >= 0 && $0 < 1000 }, "\(redraws)")
            #expect(hover >= 0 && hover < 16, "a pointer move takes \(hover) ms")

            let errors = try await browser.console().filter { $0.level == "SEVERE" }
            #expect(errors.isEmpty, "\(errors)")
        }
    }
}
