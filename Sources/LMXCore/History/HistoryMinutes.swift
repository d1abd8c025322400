/// Samples of the minute under way, per route (probe latency) and per model and path (gateway
/// traffic), summed into figures when the minute is over (``take(before:)``). Bounded: at most
/// `maxSamples` samples per key and minute (a bigger minute keeps every count and a sample of
/// its figures), at most `maxKeys` keys per minute (more are left out and counted).
public struct HistoryMinutes: Sendable {
    struct ProbeKey: Hashable {
        var route: String
        var minute: Double
    }
    struct TrafficKey: Hashable {
        var model: String
        var via: Via
        var minute: Double
    }
    struct TrafficSamples {
        var requests = 0
        var errors = 0
        var firstTokens: [Double] = []
        var rates: [Double] = []
    }

    let maxSamples: Int
    let maxKeys: Int
    private var probes: [ProbeKey: [Double]] = [:]
    private var probeCounts: [ProbeKey: Int] = [:]
    private var traffic: [TrafficKey: TrafficSamples] = [:]
    /// Samples left out because a minute had too many keys.
    public private(set) var leftOut = 0

    public init(maxSamples: Int = 600, maxKeys: Int = 256) {
        self.maxSamples = maxSamples
        self.maxKeys = maxKeys
    }

    /// A probe of `route` at `at` (seconds since 1970) took `latency` seconds.
    public mutating func probed(route: String, at: Double, latency: Double) {
        let key = ProbeKey(route: route, minute: History.align(at, 60))
        guard probeCounts[key] != nil || probeCounts.count < maxKeys else {
            leftOut += 1
            return
        }
        probeCounts[key, default: 0] += 1
        guard latency.isFinite, latency >= 0 else { return }
        if probes[key, default: []].count < maxSamples { probes[key, default: []].append(latency) }
    }

    /// The gateway answered a request for `model` on `via` (see ``TrafficStats``): an error when
    /// no server answered, or it answered 429 or 5xx; `firstToken` seconds to its first byte or
    /// event.
    public mutating func answered(model: String, via: Via, at: Double, status: Int, answered: Bool, firstToken: Double?)
    {
        update(model: model, via: via, at: at) { samples in
            samples.requests += 1
            if !answered || status == 429 || status >= 500 { samples.errors += 1 }
            if let firstToken, firstToken.isFinite, firstToken >= 0, status < 400 {
                samples.firstTokens.append(firstToken)
            }
        }
    }

    /// A stream for `model` on `via` ended: its first event `firstToken` seconds after the
    /// request, `events` events over `seconds`.
    public mutating func streamed(
        model: String, via: Via, at: Double, firstToken: Double?, events: Int, seconds: Double
    ) {
        update(model: model, via: via, at: at) { samples in
            if let firstToken, firstToken.isFinite, firstToken >= 0 { samples.firstTokens.append(firstToken) }
            if events >= 2, seconds > 0, seconds.isFinite { samples.rates.append(Double(events - 1) / seconds) }
        }
    }

    private mutating func update(model: String, via: Via, at: Double, _ change: (inout TrafficSamples) -> Void) {
        let key = TrafficKey(model: model, via: via, minute: History.align(at, 60))
        guard traffic.count < maxKeys || traffic[key] != nil else {
            leftOut += 1
            return
        }
        // Changed in place, in one look-up of the key (it is looked up on every answer).
        let maxSamples = maxSamples
        func apply(_ samples: inout TrafficSamples) {
            change(&samples)
            if samples.firstTokens.count > maxSamples { samples.firstTokens.removeFirst() }
            if samples.rates.count > maxSamples { samples.rates.removeFirst() }
        }
        apply(&traffic[key, default: TrafficSamples()])
    }

    /// The figures of every minute that began before `before`, taken out.
    public mutating func take(before: Double) -> (probes: [ProbeFigures], traffic: [TrafficFigures]) {
        let taken = figures(before: before)
        for key in probeCounts.keys where key.minute < before {
            probeCounts[key] = nil
            probes[key] = nil
        }
        for key in traffic.keys where key.minute < before { traffic[key] = nil }
        return taken
    }

    /// The figures of every minute that began before `before` (`.infinity`: the one under way
    /// too), left in place: what `/v1/history` adds to what the store has.
    public func figures(before: Double = .infinity) -> (probes: [ProbeFigures], traffic: [TrafficFigures]) {
        var done: [ProbeFigures] = []
        for (key, count) in probeCounts where key.minute < before {
            let values = probes[key] ?? []
            done.append(
                ProbeFigures(
                    routeID: key.route, at: key.minute, step: 60, probes: count, p50: Quantile.of(values, 0.5),
                    p95: Quantile.of(values, 0.95)))
        }
        var figures: [TrafficFigures] = []
        for (key, samples) in traffic where key.minute < before {
            figures.append(
                TrafficFigures(
                    model: key.model, via: key.via, at: key.minute, step: 60, requests: samples.requests,
                    errors: samples.errors, firstTokens: samples.firstTokens.count,
                    firstTokenP50: Quantile.of(samples.firstTokens, 0.5),
                    firstTokenP95: Quantile.of(samples.firstTokens, 0.95), streams: samples.rates.count,
                    tokensPerSecond: Quantile.of(samples.rates, 0.5)))
        }
        return (done.sorted { ($0.at, $0.routeID) < ($1.at, $1.routeID) }, figures.sorted { $0.at < $1.at })
    }
}
