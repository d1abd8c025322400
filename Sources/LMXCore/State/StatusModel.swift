#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The JSON shapes of the status API (`/v1/*` on the agent's socket). Field names are part of the
/// public interface: add fields, never rename them. No secret is ever part of these types.
public enum StatusAPI {
    public static let version = "0.4.0"

    /// `GET /v1/active`.
    public struct Active: Codable, Sendable, Hashable {
        public var baseURL: String
        public var openAIBaseURL: String
        public var via: Via
        public var instanceID: String?
        public var name: String
        public var verdict: HealthVerdict
        public var since: String
        public var routeID: String
        public var source: RouteSource

        enum CodingKeys: String, CodingKey {
            case baseURL = "base_url", openAIBaseURL = "openai_base_url", via
            case instanceID = "instance_id", name, verdict, since, routeID = "route_id", source
        }

        public init(
            baseURL: String, openAIBaseURL: String, via: Via, instanceID: String?, name: String,
            verdict: HealthVerdict, since: String, routeID: String, source: RouteSource
        ) {
            self.baseURL = baseURL
            self.openAIBaseURL = openAIBaseURL
            self.via = via
            self.instanceID = instanceID
            self.name = name
            self.verdict = verdict
            self.since = since
            self.routeID = routeID
            self.source = source
        }
    }

    /// The last probe of a route.
    public struct Probe: Codable, Sendable, Hashable {
        public var at: String
        public var verdict: HealthVerdict
        public var latencyMS: Double
        public var detail: String?
        /// `detail` as a code (``Cause``): nil when the server is ready.
        public var cause: Cause?

        public init(at: String, verdict: HealthVerdict, latencyMS: Double, detail: String?, cause: Cause? = nil) {
            self.at = at
            self.verdict = verdict
            self.latencyMS = latencyMS
            self.detail = detail
            self.cause = cause
        }

        enum CodingKeys: String, CodingKey { case at, verdict, latencyMS = "latency_ms", detail, cause }
    }

    /// One way to reach a server, with its health.
    public struct RouteStatus: Codable, Sendable, Hashable {
        public var id: String
        public var baseURL: String
        public var via: Via
        public var source: RouteSource
        public var name: String
        public var addresses: [String]
        public var announced: Bool
        public var health: RouteHealth
        public var verdict: HealthVerdict?
        public var active: Bool
        /// Why it is or is not the active route.
        public var reason: String
        /// `reason` as a code (``Cause``) when something keeps the route from use (its last probe
        /// failed, this machine left its network, the trust policy); nil when nothing does.
        public var cause: Cause?
        public var latencyMS: Double?
        public var lastProbe: Probe?
        public var version: String?
        public var models: Int?
        public var ready: Bool?
        public var probes: Int
        public var failures: Int
        /// Names of the secrets configured for the route (`admin_key`, `api_key`, `cf_access`), never values.
        public var credentials: [String]
        public var pinnedInstance: String?
        /// The models the server has loaded, when known.
        public var loadedModels: [String]?
        /// Who vouches for the route: `vouched-by-user`, `vouched-by-tunnel`, `announced`, `impostor`.
        public var trust: RouteTrust?
        /// For an address the server listed through its tunnel: that tunnel's route id.
        public var vouchedBy: String?
        /// Whether the server requires an inference key (its discovery document's
        /// `auth.inference_key_required`), when known.
        public var keyRequired: Bool?
        /// The route can serve inference requests as they are: the server is ready and, if it
        /// requires an inference key, the route carries one.
        public var inferenceReady: Bool?
        /// Requests the server says it is working on (`in_flight_requests` of its discovery
        /// document at the last probe), when it says.
        public var inFlightRequests: Int?
        /// For an announced route, where it was found: "mDNS on eth0", "DNS domain example.lan".
        public var foundBy: String?

        public init(
            id: String, baseURL: String, via: Via, source: RouteSource, name: String, addresses: [String],
            announced: Bool, health: RouteHealth, verdict: HealthVerdict?, active: Bool, reason: String,
            latencyMS: Double?, lastProbe: Probe?, version: String?, models: Int?, ready: Bool?, probes: Int,
            failures: Int, credentials: [String], pinnedInstance: String?, loadedModels: [String]? = nil,
            trust: RouteTrust? = nil, vouchedBy: String? = nil, keyRequired: Bool? = nil, inferenceReady: Bool? = nil,
            inFlightRequests: Int? = nil, foundBy: String? = nil, cause: Cause? = nil
        ) {
            self.cause = cause
            self.foundBy = foundBy
            self.inFlightRequests = inFlightRequests
            self.trust = trust
            self.vouchedBy = vouchedBy
            self.keyRequired = keyRequired
            self.inferenceReady = inferenceReady
            self.id = id
            self.baseURL = baseURL
            self.via = via
            self.source = source
            self.name = name
            self.addresses = addresses
            self.announced = announced
            self.health = health
            self.verdict = verdict
            self.active = active
            self.reason = reason
            self.latencyMS = latencyMS
            self.lastProbe = lastProbe
            self.version = version
            self.models = models
            self.ready = ready
            self.probes = probes
            self.failures = failures
            self.credentials = credentials
            self.pinnedInstance = pinnedInstance
            self.loadedModels = loadedModels
        }

        enum CodingKeys: String, CodingKey {
            case id, baseURL = "base_url", via, source, name, addresses, announced, health, verdict, active, reason
            case latencyMS = "latency_ms", lastProbe = "last_probe", version, models, ready, probes, failures
            case credentials, pinnedInstance = "pinned_instance", loadedModels = "loaded_models"
            case trust, vouchedBy = "vouched_by", keyRequired = "key_required", inferenceReady = "inference_ready"
            case inFlightRequests = "in_flight_requests"
            case foundBy = "found_by"
            case cause
        }
    }

    /// One server (routes merged by `instance_id`).
    public struct Candidate: Codable, Sendable, Hashable {
        public var instanceID: String?
        public var name: String
        public var active: Bool
        /// The best verdict among its routes.
        public var verdict: HealthVerdict?
        public var routes: [RouteStatus]

        public init(instanceID: String?, name: String, active: Bool, verdict: HealthVerdict?, routes: [RouteStatus]) {
            self.instanceID = instanceID
            self.name = name
            self.active = active
            self.verdict = verdict
            self.routes = routes
        }

        enum CodingKeys: String, CodingKey { case instanceID = "instance_id", name, active, verdict, routes }
    }

    /// `GET /v1/status` (and the first line of `/v1/watch`).
    public struct Status: Codable, Sendable, Hashable {
        public var agentVersion: String
        public var seq: UInt64
        public var avahi: String
        public var avahiDetail: String?
        public var active: Active?
        public var noActiveReason: String?
        /// `noActiveReason` as a code (``Cause``): that of the first route's failure; nil while
        /// a route is active, none is known, or they are being probed.
        public var noActiveCause: Cause?
        public var candidates: [Candidate]
        /// The trust policy in force (`paired`, `pinned`, `lan`).
        public var trust: String?
        /// The local gateway, when it runs.
        public var gateway: Gateway?
        /// Instances preferred among equals (`prefer` in the config), in order.
        public var prefer: [String]?
        /// The gateway's recent figures per model and path (as `/v1/traffic`), when it runs.
        public var traffic: [ModelTraffic]?
        /// Why discovery finds nothing usable, when nothing is (the checks of
        /// `lmx-discover --doctor`, made by the agent).
        public var discoveryFindings: [DoctorFinding]?

        public init(
            agentVersion: String, seq: UInt64, avahi: String, avahiDetail: String?, active: Active?,
            noActiveReason: String?,
            candidates: [Candidate], trust: String? = nil, gateway: Gateway? = nil, prefer: [String]? = nil
        ) {
            self.prefer = prefer
            self.trust = trust
            self.gateway = gateway
            self.agentVersion = agentVersion
            self.seq = seq
            self.avahi = avahi
            self.avahiDetail = avahiDetail
            self.active = active
            self.noActiveReason = noActiveReason
            self.candidates = candidates
        }

        enum CodingKeys: String, CodingKey {
            case agentVersion = "agent_version", seq, avahi, avahiDetail = "avahi_detail", active
            case noActiveReason = "no_active_reason", candidates, trust, gateway, prefer
            case discoveryFindings = "discovery_findings"
            case noActiveCause = "no_active_cause"
        }
    }

    /// `GET /v1/resolve?model=NAME`: the best usable endpoint that has the model.
    public struct Resolved: Codable, Sendable, Hashable {
        public var model: String
        public var endpoint: Active?
        public var reason: String

        public init(model: String, endpoint: Active?, reason: String) {
            self.model = model
            self.endpoint = endpoint
            self.reason = reason
        }
    }

    /// Where the local gateway listens: the fixed URL for OpenAI clients.
    public struct Gateway: Codable, Sendable, Hashable {
        /// `http://127.0.0.1:1235/v1`, or nil when there is no TCP listener.
        public var openAIBaseURL: String?
        /// The gateway's Unix socket, once it is bound.
        public var socket: String?
        /// Why the Unix socket is not advertised (its path is over the bind limit, its bind
        /// failed), and why the TCP listener is not (`not on TCP: ` and its port held by another
        /// user, or that cannot be bound; the agent keeps trying): nil when both serve.
        public var problem: String?

        public init(openAIBaseURL: String?, socket: String?, problem: String? = nil) {
            self.openAIBaseURL = openAIBaseURL
            self.socket = socket
            self.problem = problem
        }

        enum CodingKeys: String, CodingKey { case openAIBaseURL = "openai_base_url", socket, problem }
    }

    /// A recorded event (`GET /v1/events`).
    public struct Event: Codable, Sendable, Hashable {
        public var id: Int64
        public var at: String
        public var kind: String
        public var routeID: String?
        public var from: String?
        public var to: String?
        public var reason: String
        /// The event as a sentence for people (``EventWords``); the fields above are for programs.
        public var text: String?
        /// Why, as a code (``Cause``); nil for kinds that say it all (a route found, a pairing,
        /// this machine's network, a wake) and for events recorded by older versions.
        public var cause: Cause?

        enum CodingKeys: String, CodingKey { case id, at, kind, routeID = "route_id", from, to, reason, text, cause }

        public init(
            id: Int64, at: String, kind: String, routeID: String?, from: String?, to: String?, reason: String,
            text: String? = nil, cause: Cause? = nil
        ) {
            self.cause = cause
            self.text = text
            self.id = id
            self.at = at
            self.kind = kind
            self.routeID = routeID
            self.from = from
            self.to = to
            self.reason = reason
        }
    }

    /// One line of `GET /v1/watch`.
    public struct WatchLine: Codable, Sendable, Hashable {
        public enum Kind: String, Codable, Sendable, Hashable {
            case snapshot, heartbeat, active, health, avahi
            case candidateAdded = "candidate-added"
            case candidateRemoved = "candidate-removed"
            /// A kind this client does not know (from a newer agent).
            case unknown

            public init(from decoder: any Decoder) throws {
                self = Kind(rawValue: try decoder.singleValueContainer().decode(String.self)) ?? .unknown
            }
        }

        public var type: Kind
        public var seq: UInt64
        public var at: String
        public var status: Status?
        public var active: Active?
        public var route: RouteStatus?
        public var avahi: String?
        /// Why, for people (a sentence or its words: never parse it).
        public var reason: String?
        /// Why, as a code (``Cause``): on `active`, `health` and `candidate-removed` lines.
        public var cause: Cause?

        public init(
            type: Kind, seq: UInt64, at: String, status: Status? = nil, active: Active? = nil,
            route: RouteStatus? = nil, avahi: String? = nil, reason: String? = nil, cause: Cause? = nil
        ) {
            self.cause = cause
            self.type = type
            self.seq = seq
            self.at = at
            self.status = status
            self.active = active
            self.route = route
            self.avahi = avahi
            self.reason = reason
        }
    }

    /// `GET /v1/traffic`: what went through the local gateway since the agent started, per model
    /// and path.
    public struct Traffic: Codable, Sendable, Hashable {
        public var since: String
        public var models: [ModelTraffic]

        public init(since: String, models: [ModelTraffic]) {
            self.since = since
            self.models = models
        }
    }

    /// One model over one path (LAN or tunnel) through the gateway. Times are of the latest 256
    /// answers: to the answer's first byte, or for streams to the first event (the first token).
    public struct ModelTraffic: Codable, Sendable, Hashable {
        public var model: String
        public var via: Via
        public var requests: Int
        /// Answered 429 or 5xx, or not answered.
        public var errors: Int
        public var streams: Int
        public var firstByteP50MS: Double?
        public var firstByteP95MS: Double?
        /// Streamed events per second (one token per event, as servers send them), median.
        public var eventsPerSecondP50: Double?
        /// …and the 95th percentile.
        public var eventsPerSecondP95: Double?
        public var lastAt: String

        public init(
            model: String, via: Via, requests: Int, errors: Int, streams: Int, firstByteP50MS: Double?,
            firstByteP95MS: Double?,
            eventsPerSecondP50: Double?, lastAt: String, eventsPerSecondP95: Double? = nil
        ) {
            self.eventsPerSecondP95 = eventsPerSecondP95
            self.model = model
            self.via = via
            self.requests = requests
            self.errors = errors
            self.streams = streams
            self.firstByteP50MS = firstByteP50MS
            self.firstByteP95MS = firstByteP95MS
            self.eventsPerSecondP50 = eventsPerSecondP50
            self.lastAt = lastAt
        }

        enum CodingKeys: String, CodingKey {
            case model, via, requests, errors, streams, firstByteP50MS = "first_byte_p50_ms", firstByteP95MS =
                "first_byte_p95_ms"
            case eventsPerSecondP50 = "events_per_second_p50", lastAt = "last_at"
        }
    }

    /// The one error shape of the API.
    public struct ErrorBody: Codable, Sendable, Hashable {
        public var error: String
        public var reason: String
        public init(error: String, reason: String) {
            self.error = error
            self.reason = reason
        }
    }

    /// `value` as indented JSON, for people (`--json` of the commands).
    public static func prettyJSON<T: Encodable>(_ value: T) -> String {
        let encoder = encoder
        encoder.outputFormatting.insert(.prettyPrinted)
        return String(decoding: (try? encoder.encode(value)) ?? Data("null".utf8), as: UTF8.self)
    }

    public static var encoder: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }
}

/// The one ISO 8601 form every timestamp of the agent uses: UTC, milliseconds, `Z`
/// (`2026-11-23T13:07:41.844Z`), by Foundation's ISO 8601 format style.
public enum Timestamp {
    static let style = Date.ISO8601FormatStyle(includingFractionalSeconds: true, timeZone: .gmt)

    public static func iso8601(_ unixSeconds: Double) -> String {
        Date(timeIntervalSince1970: unixSeconds).formatted(style)
    }

    public static func iso8601(_ date: Date) -> String {
        date.formatted(style)
    }

    /// Seconds since 1970 of an ISO 8601 time with or without fractional seconds; nil when it is
    /// not one.
    public static func parse(_ text: String) -> Double? {
        guard text.utf8.count <= 64 else { return nil }
        if let date = try? style.parse(text) { return date.timeIntervalSince1970 }
        return (try? Date.ISO8601FormatStyle(timeZone: .gmt).parse(text))?.timeIntervalSince1970
    }
}
