/// The history's pure parts: which window a request asks for, and the answer made from the
/// rows the store read (``build(_:transitions:probes:traffic:)``).
public enum History {
    /// `t` rounded down to a multiple of `step` seconds.
    public static func align(_ t: Double, _ step: Int) -> Double {
        guard step > 0 else { return t }
        return (t / Double(step)).rounded(.down) * Double(step)
    }

    /// A window and step asked for (`/v1/history?since=&until=&step=`), checked.
    public struct Query: Sendable, Hashable {
        public var since: Double
        public var until: Double
        public var step: Int

        public init(since: Double, until: Double, step: Int) {
            self.since = since
            self.until = until
            self.step = step
        }

        /// The longest window (what the history keeps) and the most points per series.
        public static let longest = 8 * 86_400.0
        public static let maxPoints = 2_000

        /// Reads the query's values: `since` and `until` as ISO 8601 times, seconds since 1970,
        /// or a duration back from now (`24h`, `90m`, `7d`); `step` as seconds or a duration.
        /// Defaults: the last 24 hours, about 300 points. Throws a sentence naming the bad value.
        public static func parse(since: String?, until: String?, step: String?, now: Double) throws(QueryError)
            -> Query
        {
            let end =
                try until.map { text throws(QueryError) in
                    guard let t = time(text, now: now) else { throw QueryError(parameter: "until", value: text) }
                    return t
                } ?? now
            let start =
                try since.map { text throws(QueryError) in
                    guard let t = time(text, now: now) else { throw QueryError(parameter: "since", value: text) }
                    return t
                } ?? end - 86_400
            guard start < end, start > 0 else {
                // With `since` left out, `until` is what left no day before it.
                guard let since else {
                    throw QueryError(parameter: "until", value: until ?? "", reason: "must be after 1970-01-02")
                }
                throw QueryError(parameter: "since", value: since, reason: "must be before until")
            }
            guard end - start <= longest + 3600 else {
                throw QueryError(parameter: "since", value: since ?? "", reason: "the history keeps 8 days at most")
            }
            var seconds: Int
            if let step {
                guard let value = duration(step), value >= 60, value <= longest else {
                    throw QueryError(parameter: "step", value: step, reason: "give 60 seconds to 8 days (60, 10m, 1h)")
                }
                seconds = Int(value)
            } else {
                // About 300 points, in whole minutes.
                seconds = max(60, Int(((end - start) / 300 / 60).rounded(.up)) * 60)
            }
            if (end - start) / Double(seconds) > Double(maxPoints) {
                throw QueryError(
                    parameter: "step", value: step ?? "", reason: "more than \(maxPoints) points: give a longer step")
            }
            seconds = max(seconds, 60)
            return Query(since: start, until: end, step: seconds)
        }

        /// The last second an answer can name (9999-12-31T23:59:59Z): later times are refused.
        static let latest = 253_402_300_799.0

        static func time(_ text: String, now: Double) -> Double? {
            let t: Double
            if let parsed = Timestamp.parse(text) {
                t = parsed
            } else if let seconds = Double(text), seconds.isFinite, seconds > 0 {
                t = seconds
            } else {
                let trimmed = text.hasPrefix("-") ? String(text.dropFirst()) : text
                guard let ago = duration(trimmed), text.last.map({ !$0.isNumber }) == true else { return nil }
                t = now - ago
            }
            return t <= latest ? t : nil
        }

        /// `90`, `90s`, `10m`, `24h`, `7d` in seconds.
        static func duration(_ text: String) -> Double? {
            guard let last = text.last, text.utf8.count <= 16 else { return nil }
            let units: [Character: Double] = ["s": 1, "m": 60, "h": 3600, "d": 86_400]
            let (number, unit) = last.isNumber ? (Substring(text), 1.0) : (text.dropLast(), units[last] ?? -1)
            guard unit > 0, let value = Double(number), value.isFinite, value > 0 else { return nil }
            return value * unit
        }
    }

    /// A query value that could not be read, and why.
    public struct QueryError: Error, Sendable, Hashable, CustomStringConvertible {
        public var parameter: String
        public var value: String
        public var reason = "give an ISO 8601 time, seconds since 1970, or a duration back from now (24h, 90m, 7d)"

        public var description: String {
            "\(parameter)=\(value.prefix(64)) cannot be used: \(reason)"
        }
    }

    /// Figures in one answer at most, over every series together (each route's latency, each
    /// model's traffic by way): with many routes and models the step grows, in whole minutes, so
    /// an answer stays within about 1.5 MB whatever the window (a point is 70–150 bytes of JSON).
    public static let maxTotalPoints = 10_000

    /// The step that keeps `series` series over `query`'s window within ``maxTotalPoints``: the
    /// one asked for, or the shortest longer one in whole minutes.
    static func step(for query: Query, series: Int) -> Int {
        guard series > 0 else { return query.step }
        // The first step is aligned down, so a series can hold two points more than window / step.
        let perSeries = max(1, maxTotalPoints / series - 2)
        let needed = Int(((query.until - query.since) / Double(perSeries) / 60).rounded(.up)) * 60
        return max(query.step, needed)
    }

    /// The answer to `query` from the rows the store read: `transitions` from the last one of
    /// each route before `since` on, in order of time; figures of the window, of any step. With
    /// more series than ``maxTotalPoints`` allows at the step asked for, a longer step is used
    /// (the answer's `step` says which).
    public static func build(
        _ query: Query, transitions: [HistoryTransition], probes: [ProbeFigures], traffic: [TrafficFigures]
    ) -> StatusAPI.History {
        var query = query
        let series =
            Set(probes.lazy.filter { $0.at < query.until }.map(\.routeID)).count
            + Set(traffic.lazy.filter { $0.at < query.until }.map { $0.via.rawValue + " " + $0.model }).count
        query.step = step(for: query, series: series)
        let iso: (Double) -> String = Timestamp.iso8601
        var byRoute: [String: [HistoryTransition]] = [:]
        var order: [String] = []
        for t in transitions.sorted(by: { $0.at < $1.at }) {
            if byRoute[t.routeID] == nil { order.append(t.routeID) }
            byRoute[t.routeID, default: []].append(t)
        }
        let latency = Dictionary(grouping: ProbeFigures.rolledUp(probes, step: query.step), by: \.routeID)
        var routes: [StatusAPI.HistoryRoute] = []
        for id in order {
            guard let changes = byRoute[id], let last = changes.last else { continue }
            var segments: [StatusAPI.HistorySegment] = []
            for (index, change) in changes.enumerated() {
                guard let state = change.state else { continue }
                let from = max(change.at, query.since)
                let to = min(index + 1 < changes.count ? changes[index + 1].at : query.until, query.until)
                guard to > from else { continue }
                if let previous = segments.last, previous.state == state, previous.active == change.active,
                    previous.to == iso(from)
                {
                    segments[segments.count - 1].to = iso(to)
                    continue
                }
                segments.append(
                    StatusAPI.HistorySegment(
                        from: iso(from), to: iso(to), state: state, active: change.active, cause: change.cause,
                        causeCode: change.causeCode))
            }
            let points = (latency[id] ?? []).filter {
                $0.at >= History.align(query.since, query.step) && $0.at < query.until
            }
            guard !segments.isEmpty || !points.isEmpty else { continue }
            routes.append(
                StatusAPI.HistoryRoute(
                    id: id, name: last.name, via: last.via, server: changes.last(where: { $0.server != nil })?.server,
                    segments: segments,
                    latency: points.map {
                        StatusAPI.LatencyPoint(
                            at: iso($0.at), probes: $0.probes, p50MS: $0.p50.map(milliseconds),
                            p95MS: $0.p95.map(milliseconds))
                    }))
        }
        var models: [StatusAPI.HistoryModel] = []
        let figures = TrafficFigures.rolledUp(traffic, step: query.step).filter {
            $0.at >= History.align(query.since, query.step) && $0.at < query.until
        }
        var modelOrder: [String] = []
        var byModel: [String: [TrafficFigures]] = [:]
        for row in figures {
            let key = row.via.rawValue + " " + row.model
            if byModel[key] == nil { modelOrder.append(key) }
            byModel[key, default: []].append(row)
        }
        for key in modelOrder.sorted() {
            guard let rows = byModel[key], let first = rows.first else { continue }
            models.append(
                StatusAPI.HistoryModel(
                    model: first.model, via: first.via,
                    points: rows.map {
                        StatusAPI.TrafficPoint(
                            at: iso($0.at), requests: $0.requests, errors: $0.errors,
                            firstTokenP50MS: $0.firstTokenP50.map(milliseconds),
                            firstTokenP95MS: $0.firstTokenP95.map(milliseconds),
                            tokensPerSecond: $0.tokensPerSecond.map { ($0 * 10).rounded() / 10 })
                    }))
        }
        models.sort { ($0.model, $0.via.rawValue) < ($1.model, $1.via.rawValue) }
        return StatusAPI.History(
            since: iso(query.since), until: iso(query.until), step: query.step, routes: routes, models: models,
            switches: switches(transitions, query: query))
    }

    /// Where the route in use changed: transitions at one instant taken together (the agent
    /// records both ends of a switch at the same time).
    static func switches(_ transitions: [HistoryTransition], query: Query) -> [StatusAPI.HistorySwitch] {
        var active: String?
        var result: [StatusAPI.HistorySwitch] = []
        var index = 0
        let sorted = transitions.sorted { $0.at < $1.at }
        while index < sorted.count {
            let at = sorted[index].at
            var group: [HistoryTransition] = []
            while index < sorted.count, sorted[index].at == at {
                group.append(sorted[index])
                index += 1
            }
            var next = active
            if let active, group.contains(where: { $0.routeID == active && !($0.active && $0.state != nil) }) {
                next = nil
            }
            if let taking = group.last(where: { $0.active && $0.state != nil }) { next = taking.routeID }
            guard next != active else { continue }
            if at >= query.since, at <= query.until {
                let taking = group.first { $0.routeID == next }
                let leaving = group.first { $0.routeID == active }
                let told = taking ?? leaving
                result.append(
                    StatusAPI.HistorySwitch(
                        at: Timestamp.iso8601(at), from: active, to: next, cause: told?.cause ?? "",
                        causeCode: told?.causeCode))
            }
            active = next
        }
        return result
    }

    static func milliseconds(_ seconds: Double) -> Double { (seconds * 10_000).rounded() / 10 }
}
