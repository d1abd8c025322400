/// The rows the history keeps (``HistoryRetention`` bounds them): the routes' changes of state,
/// and figures per step (a minute, rolled up into coarser steps as they age).

/// A route's state from `at` on, until its next change. `state` nil: the route was removed (no
/// segment follows).
public struct HistoryTransition: Sendable, Hashable {
    public var routeID: String
    public var at: Double
    public var state: RibbonState?
    public var active: Bool
    /// Why, in the agent's words (the event's sentence).
    public var cause: String
    public var name: String
    public var via: Via
    public var server: String?
    /// Why, as a code (``Cause``), when one was told.
    public var causeCode: Cause?

    public init(
        routeID: String, at: Double, state: RibbonState?, active: Bool, cause: String, name: String, via: Via,
        server: String?, causeCode: Cause? = nil
    ) {
        self.causeCode = causeCode
        self.routeID = routeID
        self.at = at
        self.state = state
        self.active = active
        self.cause = cause
        self.name = name
        self.via = via
        self.server = server
    }
}

/// A route's probe latency over the step starting at `at` (seconds since 1970).
public struct ProbeFigures: Sendable, Hashable {
    public var routeID: String
    public var at: Double
    public var step: Int
    public var probes: Int
    public var p50: Double?
    public var p95: Double?

    public init(routeID: String, at: Double, step: Int, probes: Int, p50: Double?, p95: Double?) {
        self.routeID = routeID
        self.at = at
        self.step = step
        self.probes = probes
        self.p50 = p50
        self.p95 = p95
    }
}

/// A model's traffic on one path over the step starting at `at`.
public struct TrafficFigures: Sendable, Hashable {
    public var model: String
    public var via: Via
    public var at: Double
    public var step: Int
    public var requests: Int
    public var errors: Int
    /// Figures behind the first-token percentiles.
    public var firstTokens: Int
    public var firstTokenP50: Double?
    public var firstTokenP95: Double?
    /// Streams behind the tokens-per-second median.
    public var streams: Int
    public var tokensPerSecond: Double?

    public init(
        model: String, via: Via, at: Double, step: Int, requests: Int, errors: Int, firstTokens: Int,
        firstTokenP50: Double?, firstTokenP95: Double?, streams: Int, tokensPerSecond: Double?
    ) {
        self.model = model
        self.via = via
        self.at = at
        self.step = step
        self.requests = requests
        self.errors = errors
        self.firstTokens = firstTokens
        self.firstTokenP50 = firstTokenP50
        self.firstTokenP95 = firstTokenP95
        self.streams = streams
        self.tokensPerSecond = tokensPerSecond
    }
}

/// How long the history keeps what, and its fixed bound: figures per minute for `fineKeep`
/// seconds, then rolled up into `coarseStep` steps kept until `keep` seconds old, then dropped;
/// at most the given rows per table whatever the number of routes and models (the oldest go
/// first). A month of 20 routes and 8 model paths, every minute, holds 13.4 MiB, flat from the
/// tenth day (`HistoryStoreTests`); the caps hold any load to about 40 MB with ids and names of
/// usual length (texts are cut at 300 bytes: about 170 MB if every one were that long).
public struct HistoryRetention: Sendable, Hashable {
    public var fineStep = 60
    public var fineKeep = 26 * 3600.0
    public var coarseStep = 600
    public var keep = 8 * 86_400.0
    public var maxProbeRows = 100_000
    public var maxTrafficRows = 100_000
    public var maxTransitions = 20_000

    public init() {}
}

/// Quantiles of figures: of raw samples, and of figures already summarised (weighted).
public enum Quantile {
    /// The `q`-quantile (nearest rank) of `values`; nil when there are none.
    public static func of(_ values: [Double], _ q: Double) -> Double? {
        guard !values.isEmpty else { return nil }
        let sorted = values.sorted()
        let rank = Int((q * Double(sorted.count)).rounded(.up))
        return sorted[min(max(rank, 1), sorted.count) - 1]
    }

    /// The `q`-quantile of `values` each counted `weight` times: how steps' medians become a
    /// coarser step's median (an estimate: the samples themselves are not kept).
    public static func weighted(_ values: [(value: Double, weight: Int)], _ q: Double) -> Double? {
        let kept = values.filter { $0.weight > 0 && $0.value.isFinite }.sorted { $0.value < $1.value }
        let total = kept.reduce(0) { $0 + $1.weight }
        guard total > 0 else { return nil }
        let target = q * Double(total)
        var seen = 0
        for entry in kept {
            seen += entry.weight
            if Double(seen) >= target { return entry.value }
        }
        return kept.last?.value
    }
}

extension ProbeFigures {
    /// `rows` summed into steps of `step` seconds (aligned to multiples of it), per route.
    public static func rolledUp(_ rows: [ProbeFigures], step: Int) -> [ProbeFigures] {
        struct Key: Hashable {
            var route: String
            var at: Double
        }
        var groups: [Key: [ProbeFigures]] = [:]
        for row in rows { groups[Key(route: row.routeID, at: History.align(row.at, step)), default: []].append(row) }
        return groups.map { key, rows in
            ProbeFigures(
                routeID: key.route, at: key.at, step: step, probes: rows.reduce(0) { $0 + $1.probes },
                p50: Quantile.weighted(rows.compactMap { r in r.p50.map { (value: $0, weight: r.probes) } }, 0.5),
                p95: Quantile.weighted(rows.compactMap { r in r.p95.map { (value: $0, weight: r.probes) } }, 0.95))
        }.sorted { ($0.at, $0.routeID) < ($1.at, $1.routeID) }
    }
}

extension TrafficFigures {
    /// `rows` summed into steps of `step` seconds, per model and path.
    public static func rolledUp(_ rows: [TrafficFigures], step: Int) -> [TrafficFigures] {
        struct Key: Hashable {
            var model: String
            var via: Via
            var at: Double
        }
        var groups: [Key: [TrafficFigures]] = [:]
        for row in rows {
            groups[Key(model: row.model, via: row.via, at: History.align(row.at, step)), default: []].append(row)
        }
        return groups.map { key, rows in
            TrafficFigures(
                model: key.model, via: key.via, at: key.at, step: step, requests: rows.reduce(0) { $0 + $1.requests },
                errors: rows.reduce(0) { $0 + $1.errors }, firstTokens: rows.reduce(0) { $0 + $1.firstTokens },
                firstTokenP50: Quantile.weighted(
                    rows.compactMap { r in r.firstTokenP50.map { (value: $0, weight: r.firstTokens) } }, 0.5),
                firstTokenP95: Quantile.weighted(
                    rows.compactMap { r in r.firstTokenP95.map { (value: $0, weight: r.firstTokens) } }, 0.95),
                streams: rows.reduce(0) { $0 + $1.streams },
                tokensPerSecond: Quantile.weighted(
                    rows.compactMap { r in r.tokensPerSecond.map { (value: $0, weight: r.streams) } }, 0.5))
        }.sorted { ($0.at, $0.model, $0.via.rawValue) < ($1.at, $1.model, $1.via.rawValue) }
    }
}
