import LMXCore
import Testing

@Suite("History: windows, segments, switches, ribbons")
struct HistoryTests {
    let now = 1_790_006_400.0  // a whole day

    func change(_ route: String, _ ago: Double, _ state: RibbonState?, active: Bool = false, via: Via = .lan)
        -> HistoryTransition
    {
        HistoryTransition(
            routeID: route, at: now - ago, state: state, active: active, cause: "\(route) \(state?.rawValue ?? "gone")",
            name: route == "lan" ? "Studio" : "Studio", via: via, server: "studio")
    }

    /// A day: LAN in use, a failover to the tunnel 10 h ago, back 8 h ago.
    var day: [HistoryTransition] {
        [
            change("lan", 30 * 3600, .ready, active: true), change("wan", 30 * 3600, .ready, via: .wan),
            change("lan", 10 * 3600, .down), change("wan", 10 * 3600, .ready, active: true, via: .wan),
            change("lan", 8 * 3600, .ready, active: true), change("wan", 8 * 3600, .ready, via: .wan),
        ]
    }

    @Test("the window reads durations, times and seconds; a bad value is named")
    func query() throws {
        let q = try History.Query.parse(since: "24h", until: nil, step: nil, now: now)
        #expect(q.since == now - 86_400 && q.until == now && q.step == 300)
        #expect(try History.Query.parse(since: "-90m", until: nil, step: "1m", now: now).since == now - 5400)
        #expect(
            try History.Query.parse(since: Timestamp.iso8601(now - 3600), until: nil, step: "60", now: now).step == 60)
        #expect(throws: History.QueryError.self) {
            try History.Query.parse(since: "yesterday", until: nil, step: nil, now: now)
        }
        #expect(throws: History.QueryError.self) {
            try History.Query.parse(since: "30d", until: nil, step: nil, now: now)
        }
        #expect(throws: History.QueryError.self) {
            try History.Query.parse(since: "7d", until: nil, step: "1m", now: now)
        }
        #expect(throws: History.QueryError.self) {
            try History.Query.parse(since: "1h", until: nil, step: "5s", now: now)
        }
        #expect(throws: History.QueryError.self) {
            _ = try History.Query.parse(since: "0", until: "1", step: nil, now: now)
        }
    }

    @Test("a time past year 9999 is refused by name, not answered with a window of no length")
    func queryFarFuture() throws {
        // (until=1e20 answered 200 with since == until == "506713-02-07T00:00:00.000Z".)
        func refused(_ since: String?, _ until: String?) -> String? {
            do {
                _ = try History.Query.parse(since: since, until: until, step: nil, now: now)
                return nil
            } catch { return error.parameter }
        }
        #expect(refused(nil, "1e20") == "until")
        #expect(refused("1e300", nil) == "since")
        #expect(refused("1e20", "2e20") != nil)
        // A `since` left out but an `until` too early to have one before it: named `until`.
        #expect(refused(nil, "1e300") == "until")
        #expect(refused(nil, "1") == "until")
        let last = try History.Query.parse(
            since: "9999-12-30T00:00:00Z", until: "9999-12-31T00:00:00Z", step: nil, now: now)
        #expect(last.until - last.since == 86_400)
    }

    @Test("segments begin at the window, follow each change and end at its end; switches name both ends")
    func segmentsAndSwitches() throws {
        let q = History.Query(since: now - 86_400, until: now, step: 3600)
        let history = History.build(q, transitions: day, probes: [], traffic: [])
        let lan = try #require(history.routes.first { $0.id == "lan" })
        #expect(lan.segments.map(\.state) == [.ready, .down, .ready])
        #expect(lan.segments.map(\.active) == [true, false, true])
        #expect(lan.segments.first?.from == history.since)
        #expect(lan.segments.last?.to == history.until)
        #expect(lan.segments[1].from == Timestamp.iso8601(now - 10 * 3600))
        #expect(history.switches.map(\.at) == [Timestamp.iso8601(now - 10 * 3600), Timestamp.iso8601(now - 8 * 3600)])
        #expect(history.switches.map(\.to) == ["wan", "lan"])
        #expect(history.switches.first?.cause == "wan ready")
        // Before the window: the one to the LAN 30 h ago is not in it.
        #expect(!history.switches.contains { $0.from == nil })
    }

    @Test("a removed route's ribbon ends where it went")
    func removed() throws {
        let q = History.Query(since: now - 86_400, until: now, step: 3600)
        let history = History.build(
            q, transitions: day + [change("wan", 3600, nil)], probes: [], traffic: [])
        let wan = try #require(history.routes.first { $0.id == "wan" })
        #expect(wan.segments.last?.to == Timestamp.iso8601(now - 3600))
    }

    @Test("many routes and models: the step grows so one answer holds at most maxTotalPoints figures")
    func manySeriesStepUp() throws {
        let q = History.Query(since: now - 86_400, until: now, step: 60)
        let minutes = (0..<1440).map { now - 86_400 + Double($0) * 60 }
        let probes = (0..<30).flatMap { route in
            minutes.map {
                ProbeFigures(routeID: "route-\(route)", at: $0, step: 60, probes: 6, p50: 0.0123, p95: 0.0456)
            }
        }
        let traffic = (0..<10).flatMap { model in
            minutes.map {
                TrafficFigures(
                    model: "organisation/a-long-model-name-\(model)", via: .wan, at: $0, step: 60, requests: 3,
                    errors: 1, firstTokens: 3, firstTokenP50: 0.3, firstTokenP95: 0.9, streams: 2, tokensPerSecond: 40.5
                )
            }
        }
        let transitions = (0..<30).map { change("route-\($0)", 86_400, .ready) }
        let history = History.build(q, transitions: transitions, probes: probes, traffic: traffic)
        let points = history.routes.map(\.latency.count).reduce(0, +) + history.models.map(\.points.count).reduce(0, +)
        #expect(history.routes.count == 30 && history.models.count == 10)
        #expect(history.step > 60 && history.step % 60 == 0, "stepped up in whole minutes: \(history.step)")
        #expect(points <= History.maxTotalPoints && points > History.maxTotalPoints / 2, "\(points) points")
        let bytes = try StatusAPI.encoder.encode(history).count
        #expect(bytes < 1_600_000, "\(bytes) bytes")
        // One route over the same day keeps the step asked for.
        let one = History.build(q, transitions: [transitions[0]], probes: Array(probes.prefix(1440)), traffic: [])
        #expect(one.step == 60 && one.routes.first?.latency.count == 1440)
    }

    @Test("figures of minutes summed into the step asked for")
    func figures() throws {
        let q = History.Query(since: now - 3600, until: now, step: 600)
        let probes = (0..<60).map {
            ProbeFigures(routeID: "lan", at: now - 3600 + Double($0) * 60, step: 60, probes: 2, p50: 0.01, p95: 0.05)
        }
        let traffic = (0..<60).map {
            TrafficFigures(
                model: "m", via: .wan, at: now - 3600 + Double($0) * 60, step: 60, requests: 3, errors: 1,
                firstTokens: 3, firstTokenP50: 0.3, firstTokenP95: 0.9, streams: 2, tokensPerSecond: 40)
        }
        let history = History.build(q, transitions: day, probes: probes, traffic: traffic)
        let lan = try #require(history.routes.first { $0.id == "lan" })
        #expect(lan.latency.count == 6)
        #expect(lan.latency.first?.probes == 20 && lan.latency.first?.p50MS == 10 && lan.latency.first?.p95MS == 50)
        let model = try #require(history.models.first)
        #expect(model.points.count == 6 && model.points.allSatisfy { $0.requests == 30 && $0.errors == 10 })
        #expect(model.points.first?.firstTokenP50MS == 300 && model.points.first?.tokensPerSecond == 40)
    }

    @Test("a minute's samples become figures once it is over")
    func minutes() {
        var minutes = HistoryMinutes()
        for latency in [0.010, 0.020, 0.030, 0.040, 0.100] {
            minutes.probed(route: "lan", at: now + 5, latency: latency)
        }
        minutes.answered(model: "m", via: .lan, at: now + 1, status: 200, answered: true, firstToken: nil)
        minutes.streamed(model: "m", via: .lan, at: now + 2, firstToken: 0.25, events: 11, seconds: 0.5)
        minutes.answered(model: "m", via: .lan, at: now + 3, status: 503, answered: true, firstToken: 0.1)
        #expect(minutes.take(before: now).probes.isEmpty)
        let taken = minutes.take(before: now + 60)
        #expect(taken.probes == [ProbeFigures(routeID: "lan", at: now, step: 60, probes: 5, p50: 0.03, p95: 0.1)])
        #expect(taken.traffic.first?.requests == 2 && taken.traffic.first?.errors == 1)
        #expect(taken.traffic.first?.firstTokenP50 == 0.25 && taken.traffic.first?.tokensPerSecond == 20)
        #expect(minutes.take(before: now + 120).probes.isEmpty)
    }

    @Test("the terminal's ribbons: 80 columns, one line per route, the switches where they happened")
    func ribbon() throws {
        let q = History.Query(since: now - 86_400, until: now, step: 300)
        let history = History.build(q, transitions: day, probes: [], traffic: [])
        let lines = HistoryRibbon.render(history)
        #expect(lines.allSatisfy { $0.count <= 80 })
        let lan = try #require(lines.first { $0.hasPrefix("Studio LAN") })
        let wan = try #require(lines.first { $0.hasPrefix("Studio tunnel") })
        let cells = { (line: String) in Array(line.dropFirst(21).prefix(48)) }
        // Half an hour a cell: down from 10 h to 8 h ago is cells 28 to 31; the tunnel in use then.
        #expect(String(cells(lan)) == String(repeating: "#", count: 28) + "xxxx" + String(repeating: "#", count: 16))
        #expect(String(cells(wan)) == String(repeating: "=", count: 28) + "####" + String(repeating: "=", count: 16))
        #expect(lan.hasSuffix("91%"))
        let switches = try #require(lines.first { $0.hasPrefix("switches: 2") })
        #expect(Array(switches.dropFirst(21)).enumerated().filter { $0.element == "^" }.map(\.offset) == [28, 32])
        #expect(lines.first?.contains("-24h") == true && lines.first?.contains("now") == true)
    }

    @Test("a hostile server's name: wide, combining, escape characters, 5,000 of them, still one line of 80 columns")
    func ribbonHostileNames() {
        let names = [
            String(repeating: "服", count: 40), String(repeating: "🔥", count: 30),
            "e" + String(repeating: "\u{301}", count: 5000),
            "\u{1B}[2J\u{1B}]0;pwn\u{07}\u{9B}31m" + String(repeating: "Z", count: 5000),
        ]
        for name in names {
            let transition = HistoryTransition(
                routeID: "lan", at: now - 3600, state: .ready, active: true, cause: "x", name: name, via: .lan,
                server: nil)
            let history = History.build(
                History.Query(since: now - 86_400, until: now, step: 300), transitions: [transition], probes: [],
                traffic: [])
            let lines = HistoryRibbon.render(history)
            #expect(lines.count == 4)
            for line in lines {
                #expect(HistoryRibbon.columns(line) <= 80, "\(line)")
                #expect(!line.unicodeScalars.contains { $0.value < 0x20 || (0x7F..<0xA0).contains($0.value) })
            }
            // The cells stay under the axis: the route's line ends in its share.
            #expect(lines[1].hasSuffix("100%"))
            #expect(HistoryRibbon.columns(lines[1]) == HistoryRibbon.columns(lines[0]))
        }
        #expect(HistoryRibbon.columns("服a🔥e\u{301}") == 6)
    }
}
