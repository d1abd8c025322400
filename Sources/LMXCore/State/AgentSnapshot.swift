/// What the agent knows at one moment, immutable: the planner's state, discovery and the
/// gateway. The manager publishes one after every input; the status API, the gateway, the watch
/// hub and systemd's status line read it without entering the manager.
public struct AgentSnapshot: Sendable {
    public var planner: ConnectionPlanner
    public var discovery: DiscoveryState
    public var gateway: StatusAPI.Gateway?
    /// Real time (seconds since 1970) at monotonic instant 0.
    public var originWall: Double
    /// Why discovery finds nothing usable (the doctor's findings), while nothing is.
    public var discoveryFindings: [DoctorFinding]

    public init(
        planner: ConnectionPlanner, discovery: DiscoveryState = .stopped, gateway: StatusAPI.Gateway? = nil,
        originWall: Double, discoveryFindings: [DoctorFinding] = []
    ) {
        self.planner = planner
        self.discovery = discovery
        self.gateway = gateway
        self.originWall = originWall
        self.discoveryFindings = discoveryFindings
    }

    public func iso(_ t: Double) -> String { Timestamp.iso8601(originWall + t) }
}

// MARK: - Status views

extension AgentSnapshot {
    public func activeEndpoint(now: Double) -> StatusAPI.Active? {
        planner.active.flatMap { endpoint($0, now: now) }
    }

    func endpoint(_ state: RouteState, now: Double) -> StatusAPI.Active? {
        guard let verdict = state.verdict else { return nil }
        return StatusAPI.Active(
            baseURL: state.route.baseURL, openAIBaseURL: state.route.openAIBaseURL, via: state.route.via,
            instanceID: state.instanceID, name: state.route.name, verdict: verdict,
            since: iso(state.id == planner.activeID ? (planner.activeSince ?? now) : (state.healthySince ?? now)),
            routeID: state.id, source: state.route.source)
    }

    /// A route as sentences name it, if the agent knows it.
    public func place(_ routeID: String) -> EventWords.Place? { planner.routes[routeID].map(planner.place) }

    /// An event of the history with its sentence (`text`): the one recorded with it, else (rows
    /// of earlier versions) one made now, its routes named as they are now.
    public func told(_ event: StatusAPI.Event) -> StatusAPI.Event {
        if let text = event.text, !text.isEmpty { return event }
        var event = event
        event.text = EventWords.sentence(
            kind: event.kind, routeID: event.routeID, to: event.to, reason: event.reason, place: place)
        return event
    }

    /// Why there is no active endpoint, for `/v1/active`'s 503, `endpoint.env` and the gateway.
    public var noActiveReason: String {
        let routes = planner.sortedRoutes
        if routes.isEmpty {
            return discovery == .running
                ? "no Opta LMX server found on the LAN, and none paired or configured"
                : "no server known: none paired or configured, and mDNS discovery is \(discovery.name)\(discovery.detail.map { " (\($0))" } ?? "")"
        }
        if routes.allSatisfy({ $0.health == .unknown }) {
            return routes.count == 1 ? "probing the one route known" : "probing the \(routes.count) routes known"
        }
        let summary = routes.prefix(5).map { state in
            state.lastReport.map { EventWords.situation(planner.place(state), $0.verdict, detail: $0.detail) }
                ?? "\(planner.describe(state)) is not probed yet"
        }
        let more = routes.count > 5 ? "; and \(routes.count - 5) more" : ""
        return summary.joined(separator: "; ") + more
    }

    /// Why there is no active endpoint, as a code: the first route's failure that is known; nil
    /// when no route is known or none has failed.
    public var noActiveCause: Cause? {
        planner.sortedRoutes.lazy.compactMap { $0.offNetworkCause ?? $0.lastReport?.effectiveCause }.first
    }

    public func routeStatus(_ state: RouteState, now t: Double) -> StatusAPI.RouteStatus {
        // A route the trust policy keeps from requests shows how many models it has, not their
        // names: an announcer's list is of no use to anyone here and would only grow the answer.
        let allowed = planner.isAllowed(state)
        return StatusAPI.RouteStatus(
            id: state.id, baseURL: state.route.baseURL, via: state.route.via, source: state.route.source,
            name: state.route.name, addresses: state.route.addresses, announced: state.route.announced,
            health: state.health, verdict: state.verdict, active: state.id == planner.activeID,
            reason: planner.explain(state, now: t),
            latencyMS: state.smoothedLatency.map { ($0 * 10_000).rounded() / 10 },
            lastProbe: state.lastReport.map { report in
                StatusAPI.Probe(
                    at: iso(state.lastProbeAt ?? t), verdict: report.verdict,
                    latencyMS: (report.latency * 10_000).rounded() / 10, detail: report.detail,
                    cause: report.effectiveCause)
            },
            version: state.lastReport?.version, models: state.lastReport?.modelCount, ready: state.lastReport?.ready,
            probes: state.probeCount, failures: state.failureCount, credentials: state.route.credentials.setNames,
            pinnedInstance: state.route.pinnedInstance, loadedModels: allowed ? state.lastReport?.models : nil,
            trust: planner.trust(of: state), vouchedBy: state.route.vouchedBy,
            keyRequired: state.lastReport?.inferenceKeyRequired,
            inferenceReady: state.verdict.map {
                $0 == .ready && state.health == .up && !planner.lacksRequiredKey(state)
            },
            inFlightRequests: state.lastReport?.inFlightRequests, foundBy: state.route.foundBy,
            cause: planner.explainCause(state))
    }

    /// The key that merges routes into one server: its instance (``serverInstance(_:)``), except
    /// for an impostor, which is never merged into the server whose id it repeats.
    public func serverKey(_ state: RouteState) -> String {
        if planner.trust(of: state) == .impostor { return "route:\(state.id)" }
        return serverInstance(state).map { "instance:\($0)" } ?? "route:\(state.id)"
    }

    /// The server a route reaches, as far as the agent knows, whether or not it answers now: the
    /// instance it reported; else the one its pairing or configuration pins; else that of the
    /// tunnel that vouches for its address. A paired server's LAN route and tunnel are one server
    /// even while one of them has never answered.
    public func serverInstance(_ state: RouteState) -> String? {
        if let reported = state.instanceID { return reported }
        if let pinned = state.route.pinnedInstance { return pinned }
        guard let voucher = state.route.vouchedBy.flatMap({ planner.routes[$0] }) else { return nil }
        return voucher.instanceID ?? voucher.route.pinnedInstance
    }

    /// Candidates: routes merged into servers.
    public func candidates(now t: Double) -> [StatusAPI.Candidate] {
        var groups: [String: [RouteState]] = [:]
        var order: [String] = []
        for state in planner.sortedRoutes {
            let key = serverKey(state)
            if groups[key] == nil { order.append(key) }
            groups[key, default: []].append(state)
        }
        return order.map { key in
            let states = groups[key]!
            let best = states.min { (planner.rank($0) ?? 9) < (planner.rank($1) ?? 9) }
            return StatusAPI.Candidate(
                instanceID: states.lazy.compactMap(serverInstance).first,
                name: states.first { $0.route.source == .mdns }?.route.name ?? states[0].route.name,
                active: states.contains { $0.id == planner.activeID },
                verdict: best?.verdict,
                routes: states.map { routeStatus($0, now: t) })
        }
    }

    /// The number of distinct servers (for metrics).
    public var serverCount: Int { Set(planner.routes.values.map(serverKey)).count }

    public func status(seq: UInt64, now: Double) -> StatusAPI.Status {
        let active = activeEndpoint(now: now)
        var status = StatusAPI.Status(
            agentVersion: StatusAPI.version, seq: seq, avahi: discovery.name, avahiDetail: discovery.detail,
            active: active, noActiveReason: active == nil ? noActiveReason : nil, candidates: candidates(now: now),
            trust: planner.policy.trust.rawValue, gateway: gateway,
            prefer: planner.policy.preferredInstances.isEmpty ? nil : planner.policy.preferredInstances)
        if active == nil { status.noActiveCause = noActiveCause }
        if active == nil && !discoveryFindings.isEmpty { status.discoveryFindings = discoveryFindings }
        return status
    }

    /// `GET /v1/resolve?model=`: the best usable endpoint that has `model`, with the reason.
    public func resolve(model: String, now: Double) -> StatusAPI.Resolved {
        let (state, reason) = planner.resolve(model: model)
        return StatusAPI.Resolved(model: model, endpoint: state.flatMap { endpoint($0, now: now) }, reason: reason)
    }

    private var routesKnown: String {
        planner.routes.count == 1 ? "1 route known" : "\(planner.routes.count) routes known"
    }

    /// One line for systemd's `STATUS=`.
    public var statusLine: String {
        if let active = planner.active {
            return
                "Active: \(planner.describe(active)) at \(active.route.baseURL), \(EventWords.label(active.verdict)); \(routesKnown)"
        }
        return "No server is usable now; \(routesKnown)"
    }

    /// What the agent knows of a pairing's routes (no secrets).
    public func summary(of pairing: Pairing, stored: PairingSummary) -> PairingSummary {
        var summary = stored
        summary.routes = pairing.routes(lanKeys: planner.policy.lanKeys).map { route in
            let state = planner.routes[route.id]
            return PairingRouteState(
                id: route.id, baseURL: route.baseURL, via: route.via, verdict: state?.verdict,
                detail: state?.lastReport?.detail, active: planner.activeID == route.id)
        }
        return summary
    }

    /// The routes a gateway request may use, best first (the active one, then fallbacks), with
    /// what is needed to reach them. Stays inside the daemon: credentials never leave it.
    /// - Parameters:
    ///   - model: the request's JSON `model`, to route by.
    ///   - clientHasKey: the request carries its own `Authorization` or `X-Api-Key`.
    ///   - server: the `instance_id` of the one server the request must reach (it names an object
    ///     that lives there): only its routes, LAN or tunnel; none usable is an empty plan.
    public func gatewayPlan(limit: Int, model: String? = nil, clientHasKey: Bool = false, server: String? = nil)
        -> GatewayPlan
    {
        if server == nil, let refusal = planner.untrustedOnly(model: model) {
            return .refuse(status: 404, code: "model_not_trusted", message: refusal)
        }
        // Nothing goes to a route whose verdict predates a sleep: the request waits for its
        // first probe since the wake (the gateway holds it while the plan is empty).
        var order = planner.requestOrder(model: server == nil ? model : nil).filter { !$0.stale }
        if let server { order = order.filter { $0.instanceID == server } }
        // A route without the key its server requires would answer a certain 401.
        // A client that brings its own key (maybe a placeholder: the OpenAI SDKs always send one)
        // may also use routes without the key, but only after every route that carries it.
        let withKey = order.filter { !planner.lacksRequiredKey($0) }
        let keyed = clientHasKey ? withKey + order.filter { planner.lacksRequiredKey($0) } : withKey
        if keyed.isEmpty, let keyless = order.first {
            return .refuse(
                status: 401, code: "inference_key_required",
                message: "\(keyless.route.name) requires an inference key and no usable route to it carries one"
                    + (planner.policy.lanKeys == .never
                        ? " (lan_keys: never keeps keys off the LAN; its tunnel is not usable now)" : "")
                    + ": send your own Authorization header, or pair again with the server's api_key")
        }
        return .forward(
            keyed.prefix(limit).map { state in
                GatewayTarget(
                    routeID: state.id, baseURL: state.route.baseURL, via: state.route.via,
                    credentials: state.route.credentials,
                    rank: planner.rank(state) ?? 9, serverInFlight: state.lastReport?.inFlightRequests ?? 0,
                    instanceID: state.instanceID)
            })
    }

    /// The name people know the server `instance` by (a route's name), else the id itself.
    public func serverName(_ instance: String) -> String {
        planner.routes.values.first { $0.instanceID == instance }.map(\.route.name) ?? instance
    }
}

/// A route's id as a key of the gateway's tables (requests in flight, cool-downs), its hash taken
/// once: they are looked up twice per request, and hashing the id's text each time cost most of it.
public struct RouteKey: Hashable, Sendable, ExpressibleByStringLiteral, CustomStringConvertible {
    public let id: String
    private let hash: Int

    public init(_ id: String) {
        self.id = id
        var hasher = Hasher()
        hasher.combine(id)
        hash = hasher.finalize()
    }

    public init(stringLiteral id: String) { self.init(id) }

    public var description: String { id }

    public static func == (a: RouteKey, b: RouteKey) -> Bool { a.hash == b.hash && a.id == b.id }

    public func hash(into hasher: inout Hasher) { hasher.combine(hash) }
}

/// Where a gateway request may go: one route and what it takes to reach it. Immutable, and held
/// in one object: the gateway's data path copies a request's targets several times per request,
/// and a copy is one retain, not one for each of its texts.
public struct GatewayTarget: Sendable {
    private final class Storage: Sendable {
        let routeID: String
        let baseURL: String
        let via: Via
        let credentials: Credentials
        let rank: Int
        let serverInFlight: Int
        let instanceID: String?
        let routeKey: RouteKey
        let inferenceRule: GatewayPolicy.UpstreamHeaderRule

        init(
            routeID: String, baseURL: String, via: Via, credentials: Credentials, rank: Int, serverInFlight: Int,
            instanceID: String?
        ) {
            routeKey = RouteKey(routeID)
            inferenceRule = GatewayPolicy.UpstreamHeaderRule(
                connectionListed: [], credentials: credentials, path: GatewayTarget.inferencePath)
            self.routeID = routeID
            self.baseURL = baseURL
            self.via = via
            self.credentials = credentials
            self.rank = rank
            self.serverInFlight = serverInFlight
            self.instanceID = instanceID
        }
    }
    private let storage: Storage

    public var routeID: String { storage.routeID }
    /// ``routeID`` as a key, hashed once.
    public var routeKey: RouteKey { storage.routeKey }
    public var baseURL: String { storage.baseURL }
    public var via: Via { storage.via }
    public var credentials: Credentials { storage.credentials }
    /// The planner's rank (lower is better): among equal ranks the gateway picks the least busy.
    public var rank: Int { storage.rank }
    /// Requests the server said it was working on at its last full probe.
    public var serverInFlight: Int { storage.serverInFlight }
    /// The server's `instance_id` (what objects made there are kept against).
    public var instanceID: String? { storage.instanceID }
    /// Which client headers go on and the route's own, for a request under `/v1/` (but the
    /// paths open without a key: ``Credentials/openPaths``) whose `Connection` lists no header:
    /// made once for the route, not for every such request (nearly all of them).
    public var inferenceRule: GatewayPolicy.UpstreamHeaderRule { storage.inferenceRule }
    /// A path the inference rule stands for (any `/v1/` path but the open ones).
    static let inferencePath = "/v1/chat/completions"

    public init(
        routeID: String, baseURL: String, via: Via, credentials: Credentials, rank: Int = 0, serverInFlight: Int = 0,
        instanceID: String? = nil
    ) {
        storage = Storage(
            routeID: routeID, baseURL: baseURL, via: via, credentials: credentials, rank: rank,
            serverInFlight: serverInFlight, instanceID: instanceID)
    }
}

/// What the gateway does with one request: forward it (to these routes, best first) or answer it
/// itself.
public enum GatewayPlan: Sendable {
    case forward([GatewayTarget])
    case refuse(status: Int, code: String, message: String)
}

extension DiscoveryState {
    public init(_ daemon: DaemonState) {
        switch daemon {
        case .running: self = .running
        case .waiting(let reason): self = .waiting(reason)
        case .reconnecting: self = .reconnecting
        }
    }
}
