import LMXCore
import Prometheus
import Synchronization

/// The daemon's metrics, kept by swift-prometheus and exposed as Prometheus text at `/metrics`
/// (status socket) and, with `--metrics-address`, over TCP for a Prometheus server. Events are
/// counted as they happen; states (routes by verdict, queue lengths) are sampled at each scrape.
public final class AgentMetrics: Sendable {
    public let registry = PrometheusCollectorRegistry()

    let probes: Counter
    let probeDuration: ValueHistogram
    let switches: Counter
    let serverEvents: Counter
    let ignoredAnnouncements: Counter
    let networkChanges: Counter
    let wakes: Counter
    let storeDroppedWrites: Counter
    let storePendingWrites: Gauge
    let watchClients: Gauge
    let candidates: Gauge
    let routes: [String: Gauge]
    let activeVia: [String: Gauge]
    // The gateway.
    let gatewayRequests: Counter
    let gatewayRetries: Counter
    let gatewayFailures: Counter
    let gatewayRefused: Counter
    let gatewayInFlight: Gauge
    let gatewayHandedOver: Counter
    let gatewayStreamsResumed: Counter
    /// Requests cut at the server because their client closed its connection before the answer.
    let gatewayClientsLeft: Counter
    /// Connections the data path opened to servers, by path (`lan`, `wan`).
    let gatewayUpstreamConnections: [Via: Counter]
    /// Dropped store writes already added to the counter.
    private let droppedCounted = Mutex(0)
    /// `lmx_active_server`: one series, the active server's, made again when it changes.
    private let activeServer = Mutex<(key: String, gauge: Gauge)?>(nil)
    /// `lmx_pairing_expiry_timestamp_seconds`, by pairing name (``setPairingExpiries(_:)``).
    private let pairingExpiries = Mutex<[String: Gauge]>([:])
    /// The labelled histograms made so far, by series and key: the registry makes each once, but
    /// asking it costs a lock, a descriptor and label arrays per answer (bounded: cleared past
    /// 1,024 entries; the registry keeps the series).
    private let histograms = Mutex<[HistogramKey: ValueHistogram]>([:])
    private struct HistogramKey: Hashable {
        /// The series (not its name: hashing the name's text cost most of the look-up made on
        /// every answer).
        var series: HistogramSeries
        var key: TrafficStats.Key
    }
    private enum HistogramSeries: Hashable {
        case firstToken, tokensPerSecond

        var name: String {
            switch self {
            case .firstToken: "lmx_gateway_first_token_seconds"
            case .tokensPerSecond: "lmx_gateway_stream_tokens_per_second"
            }
        }

        var help: String {
            switch self {
            case .firstToken:
                "Gateway requests: seconds to the answer's first byte; for streams, to the first event (the first token)."
            case .tokensPerSecond:
                "Streamed gateway answers: events (one token each, as servers send them) per second."
            }
        }

        var buckets: [Double] {
            switch self {
            case .firstToken: AgentMetrics.firstTokenBuckets
            case .tokensPerSecond: AgentMetrics.rateBuckets
            }
        }
    }

    public static let latencyBuckets: [Double] = [
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
    ]

    public init(version: String = StatusAPI.version) {
        let r = registry
        r.makeGauge(
            descriptor: .lmx("lmx_build_info", "The running lmx-agentd's version (always 1)."),
            labels: [("version", version)]
        ).set(to: 1.0)
        probes = r.makeCounter(descriptor: .lmx("lmx_probes_total", "Probes completed, whatever their verdict."))
        probeDuration = r.makeValueHistogram(
            descriptor: .lmx("lmx_probe_duration_seconds", "Duration of probes that found the server alive."),
            buckets: Self.latencyBuckets)
        switches = r.makeCounter(descriptor: .lmx("lmx_active_switches_total", "Changes of the active endpoint."))
        serverEvents = r.makeCounter(
            descriptor: .lmx("lmx_server_events_total", "Events received on the active server's /admin/events stream."))
        ignoredAnnouncements = r.makeCounter(
            descriptor: .lmx(
                "lmx_ignored_announcements_total", "Servers announced past the limit of followed ones, ignored."))
        networkChanges = r.makeCounter(
            descriptor: .lmx(
                "lmx_network_changes_total",
                "Changes of this machine's links, addresses or routes that moved a LAN route."))
        wakes = r.makeCounter(
            descriptor: .lmx("lmx_wakes_total", "Wakes from sleep (logind's PrepareForSleep, or the clocks)."))
        storeDroppedWrites = r.makeCounter(
            descriptor: .lmx(
                "lmx_store_dropped_writes_total", "Statistics writes skipped while the database write queue was full."))
        storePendingWrites = r.makeGauge(
            descriptor: .lmx("lmx_store_pending_writes", "Database writes waiting (the database may be locked)."))
        watchClients = r.makeGauge(descriptor: .lmx("lmx_watch_clients", "Connected /v1/watch clients."))
        candidates = r.makeGauge(descriptor: .lmx("lmx_candidates", "Servers known (routes merged by instance_id)."))
        var routes: [String: Gauge] = [:]
        for verdict in HealthVerdict.allCases.map(\.rawValue) + ["unknown"] {
            routes[verdict] = r.makeGauge(
                descriptor: .lmx("lmx_routes", "Routes (ways to reach a server) by established verdict."),
                labels: [("verdict", verdict)])
        }
        self.routes = routes
        var via: [String: Gauge] = [:]
        for v in ["lan", "wan", "none"] {
            via[v] = r.makeGauge(
                descriptor: .lmx("lmx_active_via", "How the active endpoint is reached (1 for the current one)."),
                labels: [("via", v)])
        }
        activeVia = via
        gatewayRequests = r.makeCounter(
            descriptor: .lmx("lmx_gateway_requests_total", "Requests the local gateway forwarded."))
        gatewayRetries = r.makeCounter(
            descriptor: .lmx(
                "lmx_gateway_retries_total", "Requests sent to a fallback route before any byte of an answer."))
        gatewayFailures = r.makeCounter(
            descriptor: .lmx(
                "lmx_gateway_upstream_failures_total",
                "Requests the gateway answered 502 or 503 itself (no route reachable)."))
        gatewayRefused = r.makeCounter(
            descriptor: .lmx(
                "lmx_gateway_refused_total", "Requests the gateway refused (path, origin, host, group, size)."))
        gatewayInFlight = r.makeGauge(
            descriptor: .lmx("lmx_gateway_in_flight", "Gateway requests being forwarded now."))
        gatewayHandedOver = r.makeCounter(
            descriptor: .lmx(
                "lmx_gateway_general_path_total",
                "Gateway requests answered by its general path (the dashboard, and refusals of requests its data path did not read)."
            ))
        gatewayStreamsResumed = r.makeCounter(
            descriptor: .lmx(
                "lmx_gateway_streams_resumed_total",
                "Run event streams the gateway opened again by their server's other route, the client's stream going on."
            ))
        gatewayClientsLeft = r.makeCounter(
            descriptor: .lmx(
                "lmx_gateway_clients_left_total",
                "Requests whose client closed its connection before the answer ended: the request to the server was cut (the server stops working on it)."
            ))
        var connections: [Via: Counter] = [:]
        for via in Via.allCases {
            connections[via] = r.makeCounter(
                descriptor: .lmx(
                    "lmx_gateway_upstream_connections_total",
                    "Connections the gateway's data path opened to servers (each then serves requests for as long as the server keeps it)."
                ),
                labels: [("via", via.rawValue)])
        }
        gatewayUpstreamConnections = connections
    }

    /// The Prometheus text exposition.
    public func text() -> String { registry.emitToString() }

    /// Prometheus text exposition: states sampled now, then everything swift-prometheus holds.
    public func render(_ snapshot: AgentSnapshot, store: StoreExecutor, watchers: Int) -> String {
        var byVerdict: [String: Int] = [:]
        for state in snapshot.planner.routes.values { byVerdict[state.verdict?.rawValue ?? "unknown", default: 0] += 1 }
        for (verdict, gauge) in routes { gauge.set(Double(byVerdict[verdict] ?? 0)) }
        candidates.set(Double(snapshot.serverCount))
        let via = snapshot.planner.active?.route.via.rawValue ?? "none"
        for (name, gauge) in activeVia { gauge.set(to: name == via ? 1.0 : 0.0) }
        storePendingWrites.set(Double(store.pending))
        let dropped = store.dropped
        let counted = droppedCounted.withLock { counted in
            defer { counted = max(counted, dropped) }
            return counted
        }
        if dropped > counted { storeDroppedWrites.increment(by: Int64(dropped - counted)) }
        watchClients.set(Double(watchers))
        setActiveServer(snapshot.planner.active.map { ($0.instanceID ?? $0.route.baseURL, $0.route.via.rawValue) })
        return text()
    }

    /// `lmx_active_server{server, via}` = 1 for the active server (its `instance_id`, else its
    /// URL): what lets a fleet's rules tell which agents use the same server, and how.
    private func setActiveServer(_ active: (server: String, via: String)?) {
        let server = active.map { OutsideInput.label($0.server, maxBytes: 128) ?? "(unnamed)" }
        let key = active.map { "\(server ?? "")\u{0}\($0.via)" }
        activeServer.withLock { current in
            guard current?.key != key else { return }
            if let old = current { registry.unregisterGauge(old.gauge) }
            current = nil
            guard let key, let server, let via = active?.via else { return }
            let gauge = registry.makeGauge(
                descriptor: .lmx(
                    "lmx_active_server",
                    "The server the active endpoint reaches (its instance_id, else its URL) and how: 1, one series."),
                labels: [("server", server), ("via", via)])
            gauge.set(to: 1.0)
            current = (key, gauge)
        }
    }

    /// `lmx_pairing_expiry_timestamp_seconds{pairing}`: when each pairing with an expiry ends
    /// (seconds since 1970), labelled with the name the user chose (its id when it has none).
    /// Pairings no longer given (removed, or without an expiry) lose their series.
    public func setPairingExpiries(_ expiries: [(pairing: String, expiresAt: Double)]) {
        var wanted: [String: Double] = [:]
        for (pairing, expiresAt) in expiries.prefix(256) {
            wanted[OutsideInput.label(pairing, maxBytes: 128) ?? "(unnamed)"] = expiresAt
        }
        pairingExpiries.withLock { gauges in
            for (name, gauge) in gauges where wanted[name] == nil {
                registry.unregisterGauge(gauge)
                gauges[name] = nil
            }
            for (name, expiresAt) in wanted {
                let gauge =
                    gauges[name]
                    ?? registry.makeGauge(
                        descriptor: .lmx(
                            "lmx_pairing_expiry_timestamp_seconds",
                            "When a pairing expires, in seconds since 1970, by the name the user gave it."),
                        labels: [("pairing", name)])
                gauge.set(to: expiresAt)
                gauges[name] = gauge
            }
        }
    }
}

extension AgentMetrics: AgentEventSink {
    public func receive(_ events: [AgentEvent], snapshot: AgentSnapshot, now: Double) {
        for event in events {
            switch event {
            case .activeChanged: switches.increment()
            case .probed(_, let report):
                probes.increment()
                if report.verdict.isAlive { probeDuration.record(report.latency) }
            case .announcementIgnored: ignoredAnnouncements.increment()
            case .machine(let change, _): (change == .wake ? wakes : networkChanges).increment()
            case .serverEventReceived: serverEvents.increment()
            default: break
            }
        }
    }
}

extension AgentMetrics {
    /// Buckets for the time to a first token, seconds.
    static let firstTokenBuckets: [Double] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]
    /// Buckets for streamed tokens (events) per second.
    static let rateBuckets: [Double] = [1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 500]

    /// The two histograms of the model and path `key` (made on first use), for a caller that
    /// keeps them and records into them itself (``GatewayTraffic/Series``): the time from a
    /// gateway request to its answer's first byte (for streams, the first event: the first token),
    /// and a streamed answer's events (tokens) per second. The labels are the traffic table's
    /// bounded keys.
    func gatewayHistograms(_ key: TrafficStats.Key) -> (firstToken: ValueHistogram, tokensPerSecond: ValueHistogram) {
        (histogram(.firstToken, key: key), histogram(.tokensPerSecond, key: key))
    }

    /// Lets go of the model and path `key`'s histograms (the traffic table let go of the key):
    /// no longer exported, so the series stay as bounded as the table.
    func forgetGatewayHistograms(_ key: TrafficStats.Key) {
        for series in [HistogramSeries.firstToken, .tokensPerSecond] {
            let cacheKey = HistogramKey(series: series, key: key)
            let known = histograms.withLock { $0.removeValue(forKey: cacheKey) }
            // (Made again by the registry, to be unregistered, when this agent never made it.)
            registry.unregisterValueHistogram(
                known
                    ?? registry.makeValueHistogram(
                        descriptor: .lmx(series.name, series.help),
                        labels: [("model", key.model), ("via", key.via.rawValue)], buckets: series.buckets))
        }
    }

    /// The histogram `series` of the model and path `key`, made on first use.
    private func histogram(_ series: HistogramSeries, key: TrafficStats.Key) -> ValueHistogram {
        let cacheKey = HistogramKey(series: series, key: key)
        if let known = histograms.withLock({ $0[cacheKey] }) { return known }
        let histogram = registry.makeValueHistogram(
            descriptor: .lmx(series.name, series.help), labels: [("model", key.model), ("via", key.via.rawValue)],
            buckets: series.buckets)
        histograms.withLock {
            if $0.count >= 1024 { $0 = [:] }
            $0[cacheKey] = histogram
        }
        return histogram
    }
}

extension MetricNameDescriptor {
    /// A series named in full (units are already in the names), with its help text.
    static func lmx(_ name: String, _ help: String) -> MetricNameDescriptor {
        MetricNameDescriptor(metricName: name, unitName: "", helpText: help)
    }
}
