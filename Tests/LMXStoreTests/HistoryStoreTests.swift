import Foundation
import LMXCore
import LMXStore
import Testing

@Suite("History in the store (a real file)")
struct HistoryStoreTests {
    static func path() -> String { NSTemporaryDirectory() + "lmx-history-\(UUID().uuidString)/agent.db" }

    static func size(_ path: String) -> Int {
        ["", "-wal"].reduce(0) { total, suffix in
            total + ((try? FileManager.default.attributesOfItem(atPath: path + suffix)[.size] as? Int) ?? 0)
        }
    }

    /// A month of 20 routes and 4 models on both paths, written as the agent writes it (figures
    /// per minute, an hour per call here) and trimmed as it trims (every ten minutes: here every
    /// hour), each route flapping twice an hour. To stay a fast test, one minute in ten has
    /// figures (a debug build spends about 50 µs per row): the full month, every minute of it,
    /// held 51 120 probe rows, 20 448 traffic rows and 7 700 changes in 13.4 MiB, the same size
    /// after 10 days as after 31.
    @Test("the history's bound holds over a simulated month: rows capped, size flat, the last 7 days all there")
    func boundHoldsOverAMonth() throws {
        let path = Self.path()
        let store = try AgentStore.open(path: path)
        let start = 1_789_999_200.0  // a whole hour
        let routes = (0..<20).map { "route-\($0)" }
        let models = ["llama-8b", "qwen-32b", "mistral-7b", "phi-4"]
        var sizeAfterTenDays = 0
        let began = Date()
        for hour in 0..<(31 * 24) {
            let base = start + Double(hour) * 3600
            var probes: [ProbeFigures] = []
            var traffic: [TrafficFigures] = []
            for minute in stride(from: 0, to: 60, by: 10) {
                let at = base + Double(minute) * 60
                for (index, route) in routes.enumerated() {
                    probes.append(
                        ProbeFigures(
                            routeID: route, at: at, step: 60, probes: 6, p50: 0.004 + Double(index) / 1000,
                            p95: 0.02 + Double(minute) / 10_000))
                }
                for model in models {
                    for via in Via.allCases {
                        traffic.append(
                            TrafficFigures(
                                model: model, via: via, at: at, step: 60, requests: 12, errors: minute == 7 ? 1 : 0,
                                firstTokens: 12, firstTokenP50: 0.2, firstTokenP95: 0.5, streams: 10,
                                tokensPerSecond: via == .lan ? 80 : 40))
                    }
                }
            }
            let transitions = routes.flatMap { route in
                [
                    HistoryTransition(
                        routeID: route, at: base + 600, state: .down, active: false, cause: "Down: connection refused.",
                        name: route, via: .lan, server: "instance-1"),
                    HistoryTransition(
                        routeID: route, at: base + 900, state: .ready, active: route == "route-0",
                        cause: "Ready again.", name: route, via: .lan, server: "instance-1"),
                ]
            }
            try store.appendHistory(
                transitions: transitions, probes: probes, traffic: traffic, heartbeat: base + 3600)
            try store.trimHistory(now: base + 3600)
            if hour == 10 * 24 - 1 { sizeAfterTenDays = Self.size(path) }
        }
        let seconds = Date().timeIntervalSince(began)
        let end = start + 31 * 86_400
        let retention = HistoryRetention()
        let counts = try store.historyCounts()
        let size = Self.size(path)
        print(
            "simulated month: \(counts.probes) probe rows, \(counts.traffic) traffic rows, \(counts.transitions) changes; \(size / 1024) KiB (after 10 days \(sizeAfterTenDays / 1024) KiB); \(Int(seconds * 1000)) ms"
        )
        #expect(counts.probes <= retention.maxProbeRows)
        #expect(counts.traffic <= retention.maxTrafficRows)
        #expect(counts.transitions <= retention.maxTransitions)
        // Full from day 10 on: the file reuses what the trims free instead of growing.
        #expect(size <= sizeAfterTenDays + sizeAfterTenDays / 10)
        #expect(size < 24 << 20)

        // The last seven days are all there: minutes for the last day, ten-minute steps before.
        let week = try store.historyRows(since: end - 7 * 86_400, until: end)
        let first = try #require(week.probes.filter { $0.routeID == "route-3" }.map(\.at).min())
        #expect(first <= end - 7 * 86_400 + 600)
        #expect(week.probes.contains { $0.step == 60 && $0.at <= end - 23 * 3600 })
        #expect(week.traffic.contains { $0.step == 600 && $0.at <= end - 6 * 86_400 })
        let answer = History.build(
            History.Query(since: end - 7 * 86_400, until: end, step: 3600), transitions: week.transitions,
            probes: week.probes, traffic: week.traffic)
        #expect(answer.routes.count == 20)
        let ribbon = try #require(answer.routes.first { $0.id == "route-0" })
        // The ribbon begins where the window does (its state then came from the last change before).
        #expect(ribbon.segments.first?.from == Timestamp.iso8601(end - 7 * 86_400))
        #expect(ribbon.segments.filter { $0.state == .down }.count == 7 * 24)
        #expect(answer.models.count == 8)
        #expect(
            answer.models.allSatisfy { $0.points.count == 7 * 24 },
            "\(answer.models.map { ($0.model, $0.via, $0.points.count, $0.points.first?.at ?? "", $0.points.last?.at ?? "") })"
        )
        #expect(answer.models.first { $0.via == .lan }?.points.first?.requests == 72)
    }

    @Test("each table holds its row bound whatever comes, oldest rows out first")
    func rowBoundsHold() throws {
        let store = try AgentStore.open(path: Self.path())
        var retention = HistoryRetention()
        retention.maxProbeRows = 50
        retention.maxTransitions = 10
        let now = 1_790_000_000.0
        try store.appendHistory(
            transitions: (0..<30).map {
                HistoryTransition(
                    routeID: "r\($0)", at: now - Double(30 - $0), state: .ready, active: false, cause: "c", name: "n",
                    via: .wan, server: nil)
            },
            probes: (0..<200).map {
                ProbeFigures(
                    routeID: "r\($0 % 7)", at: now - Double(200 - $0) * 60, step: 60, probes: 1, p50: 1, p95: 1)
            }, traffic: [], heartbeat: now)
        try store.trimHistory(now: now, retention: retention)
        let counts = try store.historyCounts()
        #expect(counts.probes == 50)
        #expect(counts.transitions == 10)
        let rows = try store.historyRows(since: now - 86_400, until: now)
        #expect(rows.probes.map(\.at).min() == now - 50 * 60)
    }

    @Test("after a kill, the last run's routes read 'agent not running' from its last sign of life")
    func closeAfterKill() throws {
        let path = Self.path()
        let now = 1_790_000_000.0
        do {
            let store = try AgentStore.open(path: path)
            try store.appendHistory(
                transitions: [
                    HistoryTransition(
                        routeID: "lan", at: now - 500, state: .ready, active: true, cause: "Using Studio.",
                        name: "Studio", via: .lan, server: "s")
                ], probes: [], traffic: [], heartbeat: now - 300)
            // No close: as after SIGKILL.
        }
        let store = try AgentStore.open(path: path)
        try store.closeHistory(now: now)
        let rows = try store.historyRows(since: now - 3600, until: now + 60)
        let history = History.build(
            History.Query(since: now - 3600, until: now + 60, step: 60), transitions: rows.transitions, probes: [],
            traffic: [])
        let segments = try #require(history.routes.first?.segments)
        #expect(segments.map(\.state) == [.ready, .stopped])
        #expect(segments.last?.from == Timestamp.iso8601(now - 300))
        #expect(history.switches.map(\.to) == ["lan", nil])
        // Closing twice adds nothing.
        try store.closeHistory(now: now + 10)
        #expect(try store.historyCounts().transitions == 2)
    }
}
