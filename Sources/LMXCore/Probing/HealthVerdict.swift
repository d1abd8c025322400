#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// What one probe of one endpoint concluded, by the LMX contract (CONTRACT §2, §5).
public enum HealthVerdict: String, Sendable, Hashable, Codable, CaseIterable {
    /// `/readyz` answered 200: models are loaded, inference works.
    case ready
    /// The server answers but `/readyz` says 503 (starting, or no model loaded).
    case aliveNotReady = "alive-not-ready"
    /// Load shedding: 503 with code `overloaded`. Alive, but asked us to come back later.
    case overloaded
    /// Reachable, but credentials were refused (401/403, or a Cloudflare Access login redirect).
    case authRejected = "auth-rejected"
    /// The Cloudflare tunnel answered for a missing origin (502) or is itself down (530, 524).
    case tunnelDown = "tunnel-down"
    /// Something answered that is not this Opta LMX server (other service, other pinned instance).
    case wrongService = "wrong-service"
    /// Nothing usable answered: refused, reset, timed out, TLS failure, or an unexpected reply.
    case down

    /// The server process is alive and could serve requests (maybe not right now).
    public var isAlive: Bool {
        switch self {
        case .ready, .aliveNotReady, .overloaded: true
        default: false
        }
    }
}

/// Everything one probe learned about an endpoint.
public struct ProbeReport: Sendable, Hashable, Codable {
    public var verdict: HealthVerdict
    /// Wall time the whole probe took, in seconds.
    public var latency: Double
    /// Why the verdict is what it is, for people: "connection refused", "HTTP 530", "timed out".
    /// Never carries a secret.
    public var detail: String?
    /// Why the verdict is what it is, as a code for programs (the notifier, the dashboard):
    /// nil when the server is ready, or in a report stored by a version that had no codes
    /// (``effectiveCause`` then tells what the verdict says).
    public var cause: Cause?
    public var instanceID: String?
    public var version: String?
    public var ready: Bool?
    public var modelCount: Int?
    public var securityProfile: String?
    public var adminKeyRequired: Bool?
    public var inferenceKeyRequired: Bool?
    /// Seconds the server asked us to wait (`Retry-After` on an overloaded answer).
    public var retryAfter: Double?
    /// The models the server has loaded (discovery document, else `/v1/models`); nil: not known.
    public var models: [String]?
    /// Requests the server said it was working on at the last full probe.
    public var inFlightRequests: Int?
    /// The server's own base URLs from its discovery document (`endpoints.preferred_base_url`,
    /// then `endpoints.base_urls`), as sent; nil when no document was read. Only a document read
    /// through a tunnel vouches for any of them (`TunnelVouch`).
    public var advertisedBaseURLs: [String]?
    /// The probe failed by waiting too long for an answer (not refused, reset or unreachable):
    /// a server busy with our own traffic may answer its health paths this slowly.
    public var timedOut: Bool?
    /// After a probe that timed out while the gateway had a request on the route: whether the
    /// route's host still accepted a new connection (its kernel answers: busy, not gone).
    public var connectionAccepted: Bool?
    /// Whether the server itself answered `/v1/models` (asked while a page that was not the
    /// server's stands on the route): nil when not asked.
    public var apiAnswered: Bool?

    public init(
        verdict: HealthVerdict, latency: Double, detail: String? = nil, cause: Cause? = nil, instanceID: String? = nil,
        version: String? = nil, ready: Bool? = nil, modelCount: Int? = nil, securityProfile: String? = nil,
        adminKeyRequired: Bool? = nil, inferenceKeyRequired: Bool? = nil, retryAfter: Double? = nil
    ) {
        self.verdict = verdict
        self.latency = latency
        self.detail = detail
        self.cause = cause
        self.instanceID = instanceID
        self.version = version
        self.ready = ready
        self.modelCount = modelCount
        self.securityProfile = securityProfile
        self.adminKeyRequired = adminKeyRequired
        self.inferenceKeyRequired = inferenceKeyRequired
        self.retryAfter = retryAfter
    }

    /// The cause, else what the verdict says of it; nil for a ready server.
    public var effectiveCause: Cause? { cause ?? Cause(verdict: verdict) }
}

/// The discovery document (CONTRACT §3), decoded leniently: every field optional, unknown
/// fields ignored, so older and newer servers both decode.
public struct DiscoveryDocument: Sendable, Hashable, Decodable {
    public struct Auth: Sendable, Hashable, Decodable {
        public var adminKeyRequired: Bool?
        public var inferenceKeyRequired: Bool?
        enum CodingKeys: String, CodingKey {
            case adminKeyRequired = "admin_key_required"
            case inferenceKeyRequired = "inference_key_required"
        }
    }

    public struct Endpoints: Sendable, Hashable, Decodable {
        public var preferredBaseURL: String?
        public var baseURLs: [String]?
        enum CodingKeys: String, CodingKey {
            case preferredBaseURL = "preferred_base_url"
            case baseURLs = "base_urls"
        }

        public init(from decoder: any Decoder) throws {
            let c = try decoder.container(keyedBy: CodingKeys.self)
            preferredBaseURL = try? c.decodeIfPresent(String.self, forKey: .preferredBaseURL)
            baseURLs = try? c.decodeIfPresent([String].self, forKey: .baseURLs)
        }

        /// Every URL named, preferred first, at most 64 (a real server lists a handful), each at
        /// most 512 bytes (longer ones are skipped).
        public var all: [String] {
            Array(
                ([preferredBaseURL].compactMap { $0 } + (baseURLs ?? []).prefix(256)).filter { $0.utf8.count <= 512 }
                    .prefix(64))
        }
    }

    public var schemaVersion: String?
    public var instanceID: String?
    public var service: String?
    public var version: String?
    public var securityProfile: String?
    public var ready: Bool?
    public var loadedModelCount: Int?
    public var loadedModels: [String]?
    /// Requests the server is working on (when the document was read).
    public var inFlightRequests: Int?
    public var auth: Auth?
    public var endpoints: Endpoints?

    enum CodingKeys: String, CodingKey {
        case schemaVersion = "schema_version"
        case instanceID = "instance_id"
        case service, version, ready, auth, endpoints
        case securityProfile = "security_profile"
        case loadedModelCount = "loaded_model_count"
        case loadedModels = "loaded_models"
        case inFlightRequests = "in_flight_requests"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        // `try?` per field: a field of an unexpected type is treated as absent, not as a bad server.
        schemaVersion = try? c.decodeIfPresent(String.self, forKey: .schemaVersion)
        instanceID = try? c.decodeIfPresent(String.self, forKey: .instanceID)
        service = try? c.decodeIfPresent(String.self, forKey: .service)
        version = try? c.decodeIfPresent(String.self, forKey: .version)
        securityProfile = try? c.decodeIfPresent(String.self, forKey: .securityProfile)
        ready = try? c.decodeIfPresent(Bool.self, forKey: .ready)
        loadedModelCount = OutsideInput.count(try? c.decodeIfPresent(Int.self, forKey: .loadedModelCount))
        loadedModels = try? c.decodeIfPresent([String].self, forKey: .loadedModels)
        inFlightRequests = OutsideInput.count(try? c.decodeIfPresent(Int.self, forKey: .inFlightRequests))
        auth = try? c.decodeIfPresent(Auth.self, forKey: .auth)
        endpoints = try? c.decodeIfPresent(Endpoints.self, forKey: .endpoints)
    }

    /// Decodes a document body; `nil` when it is not a JSON object at all.
    public static func decode(_ body: [UInt8]) -> DiscoveryDocument? {
        try? JSONDecoder().decode(DiscoveryDocument.self, from: Data(body))
    }
}

/// Small JSON bodies of `/healthz` and `/readyz`, and the load-shedding error body.
public struct ContractBody: Sendable, Hashable, Decodable {
    public var status: String?
    public var version: String?
    public var modelsLoaded: Int?
    public var reason: String?
    public var errorCode: String?

    enum CodingKeys: String, CodingKey {
        case status, version, reason, error
        case modelsLoaded = "models_loaded"
    }
    enum ErrorKeys: String, CodingKey { case code }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        status = try? c.decodeIfPresent(String.self, forKey: .status)
        version = try? c.decodeIfPresent(String.self, forKey: .version)
        modelsLoaded = OutsideInput.count(try? c.decodeIfPresent(Int.self, forKey: .modelsLoaded))
        reason = try? c.decodeIfPresent(String.self, forKey: .reason)
        let error = try? c.nestedContainer(keyedBy: ErrorKeys.self, forKey: .error)
        errorCode = try? error?.decodeIfPresent(String.self, forKey: .code)
    }

    public static func decode(_ body: [UInt8]) -> ContractBody? {
        try? JSONDecoder().decode(ContractBody.self, from: Data(body))
    }
}
