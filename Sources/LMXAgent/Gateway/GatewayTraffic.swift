import LMXCore
import LMXSystem
import Prometheus
import Synchronization

/// The gateway's traffic per model (``TrafficStats``), shared by the gateway that records it and
/// the status API and dashboard that read it (`/v1/traffic`).
public final class GatewayTraffic: Sendable {
    private let stats = Mutex(TrafficStats())
    private let started = SystemClock.realtime()
    /// Where the same figures go as Prometheus histograms (nil in tests that do not look).
    private let metrics: AgentMetrics?
    /// Where the same answers go, per minute, for the history (nil: none kept).
    private let history: HistoryRecorder?

    public init(metrics: AgentMetrics? = nil, history: HistoryRecorder? = nil) {
        self.metrics = metrics
        self.history = history
    }

    /// One model and path's figures, resolved once: the key the table counts them under and the
    /// key's two Prometheus histograms. A request's answer returns
    /// it, and the request's stream, if any, is counted through it; each event loop keeps the last
    /// one and gives it back with its next answer (``answered(model:via:status:firstByte:answered:recent:)``):
    /// requests mostly name the same model, whose text is then compared, not labelled and hashed,
    /// and whose histograms are not looked up again (on a new connection too).
    final class Series: Sendable {
        /// The model as the request named it (what the next request's is compared with).
        let model: String?
        let key: TrafficStats.Key
        let firstToken: ValueHistogram?
        let tokensPerSecond: ValueHistogram?

        init(model: String?, key: TrafficStats.Key, metrics: AgentMetrics?) {
            self.model = model
            self.key = key
            let histograms = metrics?.gatewayHistograms(key)
            firstToken = histograms?.firstToken
            tokensPerSecond = histograms?.tokensPerSecond
        }

        func names(model other: String?, via: Via) -> Bool { key.via == via && model == other }
    }

    /// Counts an answer; returns the figures' series (for the stream's figures that may follow).
    /// `recent`: the series the event loop's last answer was counted under, used again when the
    /// model and path are the same and the table still has its key (a key that gave its place to
    /// newer ones is counted afresh, with new histograms).
    @discardableResult
    func answered(
        model: String?, via: Via, status: Int, firstByte: Double?, answered: Bool, recent: Series? = nil
    ) -> Series {
        let now = SystemClock.realtime()
        var series: Series?
        var key: TrafficStats.Key
        var evicted: [TrafficStats.Key] = []
        if let recent, recent.names(model: model, via: via) {
            let kept = stats.withLock { stats in
                let kept = stats.countAnswer(
                    key: recent.key, status: status, firstByte: firstByte, answered: answered, now: now)
                evicted = stats.takeEvicted()
                return kept
            }
            key = recent.key
            if kept { series = recent }
        } else {
            key = stats.withLock {
                let key = $0.answered(
                    model: model, via: via, status: status, firstByte: firstByte, answered: answered, now: now)
                evicted = $0.takeEvicted()
                return key
            }
        }
        forget(evicted)
        history?.answered(model: key.model, via: key.via, status: status, answered: answered, firstToken: firstByte)
        let counted = series ?? Series(model: model, key: key, metrics: metrics)
        if let firstByte, status < 400 { counted.firstToken?.record(seconds: firstByte) }
        return counted
    }

    /// Lets go of the Prometheus series of keys the table no longer has.
    private func forget(_ keys: [TrafficStats.Key]) {
        guard let metrics else { return }
        for key in keys { metrics.forgetGatewayHistograms(key) }
    }

    /// A stream's figures, under the series its answer was counted under
    /// (``answered(model:via:status:firstByte:answered:recent:)``).
    func streamed(series: Series, firstEvent: Double?, events: Int, seconds: Double) {
        let now = SystemClock.realtime()
        let evicted = stats.withLock {
            _ = $0.streamed(key: series.key, firstEvent: firstEvent, events: events, seconds: seconds, now: now)
            return $0.takeEvicted()
        }
        forget(evicted)
        history?.streamed(
            model: series.key.model, via: series.key.via, firstToken: firstEvent, events: events, seconds: seconds)
        if let firstEvent { series.firstToken?.record(seconds: firstEvent) }
        if events >= 2, seconds > 0 { series.tokensPerSecond?.record(seconds: Double(events - 1) / seconds) }
    }

    /// Answers and ends of streams counted so far (``TrafficStats/recorded``).
    var recorded: Int { stats.withLock { $0.recorded } }

    public func report() -> StatusAPI.Traffic {
        let models = stats.withLock { $0.report(iso: Timestamp.iso8601) }
        return StatusAPI.Traffic(since: Timestamp.iso8601(started), models: models)
    }
}

extension ValueHistogram {
    /// Records `value` when it is a figure (finite, not negative), as the metrics' own recording does.
    fileprivate func record(seconds value: Double) {
        guard value.isFinite, value >= 0 else { return }
        record(value)
    }
}
