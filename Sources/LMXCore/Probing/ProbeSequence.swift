#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// One HTTP answer as the prober saw it.
public struct ProbeResponse: Sendable, Hashable {
    public var status: Int
    /// Header names lower-cased.
    public var headers: [String: String]
    /// The body, possibly truncated by the prober (it reads at most a few KiB).
    public var body: [UInt8]

    public init(status: Int, headers: [String: String] = [:], body: [UInt8] = []) {
        self.status = status
        self.headers = Dictionary(headers.map { ($0.key.lowercased(), $0.value) }, uniquingKeysWith: { a, _ in a })
        self.body = body
    }
}

/// Why a request got no HTTP answer.
public enum ProbeTransportFailure: Error, Sendable, Hashable {
    case refused
    case reset
    case timeout
    case unreachable
    /// This machine has no address on a network that reaches the host.
    case noAddress
    /// A firewall on this machine blocks the connection.
    case blocked
    case nameResolution
    case tls(String)
    case other(String)

    public var detail: String {
        switch self {
        case .refused: "connection refused"
        case .reset: "connection reset"
        case .timeout: "timed out"
        case .unreachable: "host unreachable"
        case .noAddress: "this machine has no address on a network that reaches it"
        case .blocked: "a firewall on this machine blocks the connection"
        case .nameResolution: "name not resolved"
        case .tls(let why): "TLS failure: \(why)"
        case .other(let why): why
        }
    }

    /// The failure as a code, beside ``detail``.
    public var cause: Cause {
        switch self {
        case .refused: .refused
        case .reset: .reset
        case .timeout: .timedOut
        case .unreachable: .unreachable
        case .noAddress: .addressLost
        case .blocked: .blocked
        case .nameResolution: .nameUnresolved
        case .tls: .tls
        case .other: .connectionFailed
        }
    }
}

/// The probe of one endpoint by the LMX contract, as a pure state machine: `/healthz`, then the
/// discovery document at the TXT `path` (falling back to `/v1/discovery`), then `/readyz`.
/// The prober performs the requests; this decides what they mean and what to ask next.
public struct ProbeSequence: Sendable {
    public enum Step: Sendable, Hashable {
        /// Perform `GET path` next.
        case request(path: String)
        /// The probe is over; latency is filled in by the prober.
        case finished(ProbeReport)
    }

    public let via: Via
    public let pinnedInstance: String?
    private var stage: Stage
    private var report = ProbeReport(verdict: .down, latency: 0)
    private let discoveryPaths: [String]

    private enum Stage: Sendable {
        case healthz
        case discovery(Int)
        case readyz, models, done
    }
    /// The route carries an inference key (for `/v1/models` under the `cloud` profile).
    private let hasInferenceKey: Bool
    /// Whether `/v1/models` is asked whatever the profile, and its answer judged: a page that
    /// is not the server's stands on the route (``RouteState/foreign``) until the server answers
    /// its API itself (``ProbeReport/apiAnswered``). The health paths may be answered by the
    /// server while its API is behind a login page.
    private let checkAPI: Bool
    /// The route's base URL: a redirect to its own host is the server's (``ForeignAnswer``).
    private let baseURL: String?

    /// Model names kept per server, and their length: enough for any real server.
    public static let maxModels = 512
    public static let maxModelNameBytes = 256
    /// A server's `version` as kept and shown (a real one is `0.1.0`).
    public static let maxVersionBytes = 64

    /// - Parameters:
    ///   - quick: a liveness check of a route already known to be this server: `/readyz` alone.
    ///   - hasInferenceKey: the route can list models on a server that requires a key.
    ///   - checkAPI: ask `/v1/models` after a good `/readyz` and judge who answered it.
    ///   - baseURL: the route's base URL (a redirect to its own host is the server's).
    public init(
        servicePath: String, via: Via, pinnedInstance: String? = nil, quick: Bool = false,
        hasInferenceKey: Bool = false,
        checkAPI: Bool = false, baseURL: String? = nil
    ) {
        self.via = via
        self.pinnedInstance = pinnedInstance
        self.hasInferenceKey = hasInferenceKey
        self.checkAPI = checkAPI
        self.baseURL = baseURL
        var path = servicePath.isEmpty ? TXTRecord.defaultServicePath : servicePath
        if !path.hasPrefix("/") { path = "/" + path }
        discoveryPaths = path == "/v1/discovery" ? [path] : [path, "/v1/discovery"]
        stage = quick ? .readyz : .healthz
    }

    /// The first request to make.
    public var firstPath: String {
        if case .readyz = stage { return "/readyz" }
        return "/healthz"
    }

    /// Feeds the answer (or failure) to the request last asked for; returns what to do next.
    public mutating func receive(_ result: Result<ProbeResponse, ProbeTransportFailure>) -> Step {
        if case .models = stage {
            guard checkAPI else {
                // Only the model list was asked for: the verdict stands whatever the answer.
                if case .success(let response) = result, response.status == 200,
                    let names = Self.modelIDs(response.body)
                {
                    report.models = names
                }
                stage = .done
                return .finished(report)
            }
            return judgeAPI(result)
        }
        let response: ProbeResponse
        switch result {
        case .failure(let failure):
            if failure == .timeout { report.timedOut = true }
            return finish(.down, detail: failure.detail, cause: failure.cause)
        case .success(let r):
            response = r
        }
        if let (verdict, cause) = Self.classifyFailureStatus(response, via: via) {
            if verdict == .overloaded {
                report.retryAfter = Self.retryAfter(response)
                return finish(.overloaded, detail: "overloaded (HTTP \(response.status))", cause: cause)
            }
            return finish(verdict, detail: Self.statusDetail(response), cause: cause)
        }

        switch stage {
        case .healthz:
            guard response.status == 200 else {
                // A web server without /healthz is something else than an LMX server.
                return finish(
                    response.status == 404 ? .wrongService : .down, detail: "/healthz answered HTTP \(response.status)",
                    cause: response.status == 404 ? .wrongService : .httpStatus)
            }
            let body = ContractBody.decode(response.body)
            guard let body, body.status != nil || body.version != nil else {
                return finish(
                    .wrongService, detail: "/healthz did not answer the LMX health document", cause: .wrongService)
            }
            report.version = OutsideInput.label(body.version, maxBytes: Self.maxVersionBytes)
            stage = .discovery(0)
            return .request(path: discoveryPaths[0])

        case .discovery(let index):
            if response.status == 200, let document = DiscoveryDocument.decode(response.body) {
                if let service = document.service, service != "opta-lmx" {
                    return finish(
                        .wrongService, detail: "service is \"\(Self.printable(service))\", not opta-lmx",
                        cause: .wrongService)
                }
                if let pinned = pinnedInstance, let instance = document.instanceID, instance != pinned {
                    return finish(
                        .wrongService,
                        detail:
                            "instance_id is \"\(Self.printable(instance))\", expected \"\(Self.printable(pinned))\"",
                        cause: .wrongInstance)
                }
                // Kept whole or not at all: a pinned identity compares the server's own text.
                report.instanceID = OutsideInput.identifier(document.instanceID)
                report.version = OutsideInput.label(document.version, maxBytes: Self.maxVersionBytes) ?? report.version
                report.securityProfile = OutsideInput.label(document.securityProfile, maxBytes: 32)
                report.adminKeyRequired = document.auth?.adminKeyRequired
                report.inferenceKeyRequired = document.auth?.inferenceKeyRequired
                report.modelCount = OutsideInput.count(document.loadedModelCount ?? document.loadedModels?.count)
                report.ready = document.ready
                report.advertisedBaseURLs = document.endpoints?.all ?? []
                report.inFlightRequests = OutsideInput.count(document.inFlightRequests)
                if let names = document.loadedModels, !names.isEmpty || document.loadedModelCount == 0 {
                    report.models = Self.cleanModels(names)
                }
            } else if index + 1 < discoveryPaths.count {
                // 404 on servers older than 2026-02-28, or another path: try the fallback.
                stage = .discovery(index + 1)
                return .request(path: discoveryPaths[index + 1])
            }
            if let pinned = pinnedInstance, report.instanceID == nil {
                // The user paired a particular server: one that cannot say who it is is not it.
                return finish(
                    .wrongService, detail: "did not report an instance_id (expected \"\(Self.printable(pinned))\")",
                    cause: .wrongInstance)
            }
            stage = .readyz
            return .request(path: "/readyz")

        case .readyz:
            let body = ContractBody.decode(response.body)
            switch response.status {
            case 200:
                report.ready = true
                if let count = body?.modelsLoaded { report.modelCount = count }
                if let version = OutsideInput.label(body?.version, maxBytes: Self.maxVersionBytes),
                    report.version == nil
                {
                    report.version = version
                }
                // Under the `cloud` profile the document lists no models; /v1/models does, with
                // the inference key when one is required.
                if checkAPI
                    || report.models == nil && (report.modelCount ?? 1) > 0
                        && (report.instanceID != nil || report.securityProfile != nil)
                        && (hasInferenceKey || report.inferenceKeyRequired == false)
                {
                    report.verdict = .ready
                    report.detail = nil
                    report.cause = nil
                    stage = .models
                    return .request(path: "/v1/models")
                }
                return finish(.ready, detail: nil, cause: nil)
            case 503:
                report.ready = false
                if report.modelCount == nil { report.modelCount = 0 }
                let reason = body?.reason.map { Self.printable($0) } ?? "not ready"
                return finish(.aliveNotReady, detail: reason, cause: .notReady)
            default:
                return finish(.down, detail: "/readyz answered HTTP \(response.status)", cause: .httpStatus)
            }

        case .models, .done:
            return .finished(report)
        }
    }

    /// The answer to `/v1/models` when the route's API is in question: the server's own JSON
    /// clears it (and gives the model list); a page in front of it is the verdict; anything else
    /// (a timeout, an unlabelled error) leaves it in question.
    private mutating func judgeAPI(_ result: Result<ProbeResponse, ProbeTransportFailure>) -> Step {
        guard case .success(let response) = result else {
            report.apiAnswered = false
            stage = .done
            return .finished(report)
        }
        let edge = response.headers["cf-ray"] != nil || response.headers["server"]?.lowercased() == "cloudflare"
        switch ForeignAnswer.judgeAPI(
            status: response.status, contentType: response.headers["content-type"],
            location: response.headers["location"], edge: edge, server: baseURL, empty: response.body.isEmpty)
        {
        case .server:
            report.apiAnswered = true
            if response.status == 200, let names = Self.modelIDs(response.body) { report.models = names }
            stage = .done
            return .finished(report)
        case .foreign(let foreign):
            report.apiAnswered = false
            return finish(foreign.verdict, detail: foreign.detail, cause: foreign.cause)
        case .unclear:
            report.apiAnswered = false
            stage = .done
            return .finished(report)
        }
    }

    private mutating func finish(_ verdict: HealthVerdict, detail: String?, cause: Cause?) -> Step {
        stage = .done
        report.verdict = verdict
        report.detail = detail
        report.cause = cause
        return .finished(report)
    }

    /// The ids of an OpenAI `/v1/models` list.
    static func modelIDs(_ body: [UInt8]) -> [String]? {
        struct List: Decodable {
            struct Model: Decodable { var id: String? }
            var data: [Model]?
        }
        guard let list = try? JSONDecoder().decode(List.self, from: Data(body)), let data = list.data else {
            return nil
        }
        return cleanModels(data.compactMap(\.id))
    }

    /// At most `maxModels` names, each printable and at most `maxModelNameBytes` long.
    static func cleanModels(_ names: [String]) -> [String] {
        var seen = Set<String>()
        return names.filter { name in
            !name.isEmpty && name.utf8.count <= maxModelNameBytes
                && !name.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F } && seen.insert(name).inserted
        }.prefix(maxModels).map { $0 }
    }

    /// Statuses that end the probe whatever was asked: auth, tunnel and overload answers, with
    /// their cause.
    static func classifyFailureStatus(_ response: ProbeResponse, via: Via) -> (HealthVerdict, Cause)? {
        switch response.status {
        case 401, 403:
            return (.authRejected, .keysRefused)
        case 300..<400:
            // Cloudflare Access answers a missing or wrong service token with a redirect to its
            // login page; an LMX server never redirects.
            let location = response.headers["location"]?.lowercased() ?? ""
            if via == .wan || location.contains("cdn-cgi/access") || location.contains("login") {
                return (.authRejected, .loginPage)
            }
            return (.down, .httpStatus)
        case 429:
            return (.overloaded, .overloaded)
        case 503:
            let body = ContractBody.decode(response.body)
            return body?.errorCode == "overloaded" ? (.overloaded, .overloaded) : nil
        case 502, 524, 530:
            return via == .wan ? (.tunnelDown, .tunnelDown) : (.down, .httpStatus)
        default:
            return nil
        }
    }

    static func statusDetail(_ response: ProbeResponse) -> String {
        switch response.status {
        case 530: "HTTP 530: the tunnel is down"
        case 502: "HTTP 502: the tunnel cannot reach the server"
        case 524: "HTTP 524: the server did not answer through the tunnel"
        case 300..<400: "HTTP \(response.status): redirected to a login page"
        default: "HTTP \(response.status)"
        }
    }

    static func retryAfter(_ response: ProbeResponse) -> Double? {
        response.headers["retry-after"].flatMap { OutsideInput.delaySeconds($0, cap: 3600) }
    }

    /// Server-provided text shown to people: control characters escaped, length bounded.
    static func printable(_ text: String) -> String {
        // Escaped as every name from the network is (``ServerTable/printable(_:)``): C1 controls,
        // bidirectional overrides and line separators too, not only C0.
        let scalars = text.unicodeScalars
        var head = String.UnicodeScalarView()
        head.append(contentsOf: scalars.prefix(120))
        let shown = ServerTable.printable(String(head))
        return scalars.count > 120 ? shown + "…" : shown
    }
}
