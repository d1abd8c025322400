import LMXCore
import LMXSystem
import Synchronization

/// The gateway's traffic per model (``TrafficStats``), shared by the gateway that records it and
/// the status API and dashboard that read it (`/v1/traffic`).
public final class GatewayTraffic: Sendable {
    private let stats = Mutex(TrafficStats())
    private let started = SystemClock.realtime()
    /// Where the same figures go as Prometheus histograms (nil in tests that do not look).
    private let metrics: AgentMetrics?

    public init(metrics: AgentMetrics? = nil) {
        self.metrics = metrics
    }

    /// Returns the key it was counted under (for the stream's figures that may follow).
    @discardableResult
    func answered(model: String?, via: Via, status: Int, firstByte: Double?, answered: Bool) -> TrafficStats.Key {
        let now = SystemClock.realtime()
        let key = stats.withLock {
            $0.answered(model: model, via: via, status: status, firstByte: firstByte, answered: answered, now: now)
        }
        if let firstByte, status < 400 { metrics?.gatewayFirstByte(key, seconds: firstByte) }
        return key
    }

    func streamed(model: String?, via: Via, firstEvent: Double?, events: Int, seconds: Double) {
        streamed(
            key: TrafficStats.named(model: model, via: via), firstEvent: firstEvent, events: events, seconds: seconds)
    }

    /// A stream's figures under the key its answer was counted under (``answered(model:via:status:firstByte:answered:)``).
    func streamed(key named: TrafficStats.Key, firstEvent: Double?, events: Int, seconds: Double) {
        let now = SystemClock.realtime()
        let key = stats.withLock {
            $0.streamed(key: named, firstEvent: firstEvent, events: events, seconds: seconds, now: now)
        }
        if let firstEvent { metrics?.gatewayFirstByte(key, seconds: firstEvent) }
        if events >= 2, seconds > 0 { metrics?.gatewayTokensPerSecond(key, Double(events - 1) / seconds) }
    }

    public func report() -> StatusAPI.Traffic {
        let models = stats.withLock { $0.report(iso: Timestamp.iso8601) }
        return StatusAPI.Traffic(since: Timestamp.iso8601(started), models: models)
    }
}
