/// What a route was doing over a stretch of time, as the history keeps it and the ribbons draw
/// it: its health in three words, or that nothing was known (not probed yet, or the agent not
/// running).
public enum RibbonState: String, Sendable, Hashable, Codable, CaseIterable {
    /// Probed and ready for requests.
    case ready
    /// Answering, but not ready (no model loaded, busy).
    case notReady = "not-ready"
    /// Not usable (down, tunnel down, key refused, not an LMX server).
    case down
    /// Known but not probed yet.
    case unknown
    /// The agent was not running (stopped, or killed: from its last sign of life).
    case stopped

    /// The state of a route as the planner holds it.
    public init(health: RouteHealth, verdict: HealthVerdict?) {
        switch health {
        case .unknown: self = .unknown
        case .down: self = .down
        case .up: self = verdict == .ready ? .ready : .notReady
        }
    }

    /// The one character of the terminal's ribbons (``HistoryRibbon``).
    public var character: Character {
        switch self {
        case .ready: "="
        case .notReady: "~"
        case .down: "x"
        case .unknown: "?"
        case .stopped: "."
        }
    }

    public var words: String {
        switch self {
        case .ready: "ready"
        case .notReady: "not ready"
        case .down: "down"
        case .unknown: "not probed yet"
        case .stopped: "agent not running"
        }
    }
}

extension StatusAPI {
    /// `GET /v1/history`: what each route and each model through the gateway did between
    /// `since` and `until`, figures in steps of `step` seconds.
    public struct History: Codable, Sendable, Hashable {
        public var since: String
        public var until: String
        /// Seconds per point of the figures.
        public var step: Int
        public var routes: [HistoryRoute]
        public var models: [HistoryModel]
        /// Every change of the route in use, oldest first.
        public var switches: [HistorySwitch]

        public init(
            since: String, until: String, step: Int, routes: [HistoryRoute], models: [HistoryModel],
            switches: [HistorySwitch]
        ) {
            self.since = since
            self.until = until
            self.step = step
            self.routes = routes
            self.models = models
            self.switches = switches
        }
    }

    /// One route's ribbon and probe latency.
    public struct HistoryRoute: Codable, Sendable, Hashable {
        public var id: String
        public var name: String
        public var via: Via
        /// The server's instance, as far as the agent knew (routes of one server share it).
        public var server: String?
        /// Back to back from `since` to `until` (or from when the route was first seen).
        public var segments: [HistorySegment]
        public var latency: [LatencyPoint]

        public init(
            id: String, name: String, via: Via, server: String?, segments: [HistorySegment], latency: [LatencyPoint]
        ) {
            self.id = id
            self.name = name
            self.via = via
            self.server = server
            self.segments = segments
            self.latency = latency
        }
    }

    /// A stretch of time in one state.
    public struct HistorySegment: Codable, Sendable, Hashable {
        public var from: String
        public var to: String
        public var state: RibbonState
        /// Requests went this way.
        public var active: Bool
        /// Why it began, in the agent's words.
        public var cause: String
        /// Why it began, as a code (``Cause``), when one was told.
        public var causeCode: Cause?

        public init(from: String, to: String, state: RibbonState, active: Bool, cause: String, causeCode: Cause? = nil)
        {
            self.from = from
            self.to = to
            self.state = state
            self.active = active
            self.cause = cause
            self.causeCode = causeCode
        }

        enum CodingKeys: String, CodingKey { case from, to, state, active, cause, causeCode = "cause_code" }
    }

    /// Probe latency over one step.
    public struct LatencyPoint: Codable, Sendable, Hashable {
        public var at: String
        public var probes: Int
        public var p50MS: Double?
        public var p95MS: Double?

        enum CodingKeys: String, CodingKey { case at, probes, p50MS = "p50_ms", p95MS = "p95_ms" }

        public init(at: String, probes: Int, p50MS: Double?, p95MS: Double?) {
            self.at = at
            self.probes = probes
            self.p50MS = p50MS
            self.p95MS = p95MS
        }
    }

    /// One model on one path (LAN or tunnel) through the gateway.
    public struct HistoryModel: Codable, Sendable, Hashable {
        public var model: String
        public var via: Via
        public var points: [TrafficPoint]

        public init(model: String, via: Via, points: [TrafficPoint]) {
            self.model = model
            self.via = via
            self.points = points
        }
    }

    /// A model's traffic over one step.
    public struct TrafficPoint: Codable, Sendable, Hashable {
        public var at: String
        public var requests: Int
        /// Answered 429 or 5xx, or not answered.
        public var errors: Int
        /// Time to the first token (for streams; to the first byte otherwise).
        public var firstTokenP50MS: Double?
        public var firstTokenP95MS: Double?
        /// Streamed tokens per second, median.
        public var tokensPerSecond: Double?

        enum CodingKeys: String, CodingKey {
            case at, requests, errors, firstTokenP50MS = "first_token_p50_ms", firstTokenP95MS = "first_token_p95_ms"
            case tokensPerSecond = "tokens_per_second"
        }

        public init(
            at: String, requests: Int, errors: Int, firstTokenP50MS: Double?, firstTokenP95MS: Double?,
            tokensPerSecond: Double?
        ) {
            self.at = at
            self.requests = requests
            self.errors = errors
            self.firstTokenP50MS = firstTokenP50MS
            self.firstTokenP95MS = firstTokenP95MS
            self.tokensPerSecond = tokensPerSecond
        }
    }

    /// The route in use changed.
    public struct HistorySwitch: Codable, Sendable, Hashable {
        public var at: String
        /// Route ids (nil: none in use).
        public var from: String?
        public var to: String?
        /// Why, in the agent's words.
        public var cause: String
        /// Why, as a code (``Cause``), when one was told.
        public var causeCode: Cause?

        public init(at: String, from: String?, to: String?, cause: String, causeCode: Cause? = nil) {
            self.at = at
            self.from = from
            self.to = to
            self.cause = cause
            self.causeCode = causeCode
        }

        enum CodingKeys: String, CodingKey { case at, from, to, cause, causeCode = "cause_code" }
    }
}
