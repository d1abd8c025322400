import LMXCore
import LMXProbe
import LMXStore
import Logging

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Glibc)
import Glibc
#endif

/// The agent's shared state: owns the planner (the pure decisions), runs probes, keeps the store
/// up to date and tells watchers about every change. Event-driven: every input (an mDNS event, a
/// probe result, the timer, a refresh) updates the planner, then `pump()` starts the probes that
/// fall due and sets the one timer for the next wakeup.
public actor ConnectionManager {
    private var planner: ConnectionPlanner
    private var configuration: AgentConfiguration
    private let prober: Prober
    private let store: AgentStore
    /// Every write after start goes through it, so that a locked database never blocks the actor.
    private let writer: StoreWriter
    private let logger: Logger
    private let clock = ContinuousClock()
    private let origin: ContinuousClock.Instant
    private let originWall: Double

    private var timer: Task<Void, Never>?
    private var timerDeadline: Double?
    private var probeTasks: [String: Task<Void, Never>] = [:]
    private var heartbeat: Task<Void, Never>?
    private var stopped = false

    private var avahiState = "stopped"
    private var avahiDetail: String?
    /// mDNS instance → the route it is reached by.
    private var mdnsRoutes: [ServiceInstanceID: String] = [:]
    private var manualRouteIDs: Set<String> = []
    /// Pairing id → the routes it brought.
    private var pairingRoutes: [String: [String]] = [:]
    /// Pairing id → when it expires (seconds since 1970, by the real-time clock): its routes are
    /// dropped at that moment, not at the next start.
    private var pairingExpiry: [String: Double] = [:]
    /// Announced servers followed at most.
    static let maxDiscovered = 1024
    private var floodLogged = false
    /// mDNS instances whose refused addresses were already logged.
    private var refusalLogged: Set<ServiceInstanceID> = []
    /// The mDNS version of each announced route, to fall back to when a pairing of the same
    /// address is removed.
    private var mdnsRouteByID: [String: Route] = [:]

    // Watchers of `/v1/watch`: numbered lines, a ring of recent ones for `?since=`.
    private var seq: UInt64 = 0
    private var recent: [(seq: UInt64, line: [UInt8])] = []
    private let recentLimit = 1024
    /// Following the active server's `/admin/events` (when its admin key is known).
    private var eventTask: Task<Void, Never>?
    private var eventRouteID: String?
    private var gatewayInfo: StatusAPI.Gateway?
    /// `endpoint.env` beside the socket, when the daemon keeps one.
    private var endpointFile: EndpointFile?
    private var endpointFileFailed = false
    private var watchers: [UInt64: AsyncStream<[UInt8]>.Continuation] = [:]
    private var nextWatcherID: UInt64 = 0
    private let watcherBuffer = 4096

    // Metrics (counted as they happen; states sampled at each scrape).
    public let metricsRegistry = AgentMetrics()
    private var lastDroppedWrites = 0

    public init(configuration: AgentConfiguration, prober: Prober, store: AgentStore, logger: Logger) {
        self.configuration = configuration
        self.planner = ConnectionPlanner(policy: configuration.policy, seed: UInt64(truncatingIfNeeded: getpid()))
        self.prober = prober
        self.store = store
        self.writer = StoreWriter(store: store, logger: logger)
        self.logger = logger
        self.origin = clock.now
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        self.originWall = Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    // MARK: - Time

    private func now() -> Double {
        let d = clock.now - origin
        return Double(d.components.seconds) + Double(d.components.attoseconds) * 1e-18
    }

    private func wall(_ t: Double) -> Double { originWall + t }

    /// The real-time clock now (expiry is a wall-clock notion: it follows clock corrections).
    private func realtime() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }
    private func iso(_ t: Double) -> String { Timestamp.iso8601(wall(t)) }

    // MARK: - Lifecycle

    /// Restores remembered routes and manual endpoints, then starts probing (last-good first).
    public func start() {
        let t = now()
        do {
            let stats = try store.stats()
            planner.lastGoodID = try store.meta("last_good_route")
            for stored in try store.routes() {
                if let expires = stored.expiresAt, expires < wall(t) {
                    logger.notice("pairing expired; not probing it", metadata: ["route": "\(stored.route.id)"])
                    continue
                }
                var route = stored.route
                if route.source == .mdns { route.source = .remembered }
                if route.source == .manual { continue }  // manual endpoints come from the current config
                handle(planner.upsert(route, instanceID: stored.instanceID ?? stats[route.id]?.instanceID, now: t), quiet: true)
            }
            logger.info(
                "restored from the store",
                metadata: ["routes": "\(planner.routes.count)", "last_good": "\(planner.lastGoodID ?? "none")"])
        } catch {
            logger.error("could not read the store: \(error)")
        }
        do {
            for stored in try store.pairings() {
                addPairing(stored.pairing, now: t, quiet: true)
            }
        } catch {
            logger.error("could not read pairings from the store: \(error)")
        }
        applyManualEndpoints(configuration.endpoints, now: t)
        do {
            // What the tunnels vouched for when last read: the paired server is used on the LAN
            // at once, also while its tunnel is down.
            for vouch in try store.vouches() {
                handle(
                    planner.applyVouches(for: vouch.tunnelRouteID, advertised: vouch.baseURLs, instanceID: vouch.instanceID, now: t),
                    quiet: true)
            }
        } catch {
            logger.error("could not read the tunnels' vouched addresses from the store: \(error)")
        }
        startHeartbeat()
        pump()
    }

    /// Stops timers and probes; remembers the active route.
    public func shutdown() async {
        stopped = true
        timer?.cancel()
        heartbeat?.cancel()
        eventTask?.cancel()
        if let eventTask { await eventTask.value }
        eventTask = nil
        let tasks = Array(probeTasks.values)
        for task in tasks { task.cancel() }
        for task in tasks { await task.value }
        probeTasks.removeAll()
        for watcher in watchers.values { watcher.finish() }
        watchers.removeAll()
        let lastGood = planner.activeID ?? planner.lastGoodID
        writer.write("remember the active endpoint") { try $0.setMeta("last_good_route", lastGood) }
        await writer.flush(seconds: 3)
    }

    /// Applies a reloaded configuration (SIGHUP).
    public func reload(_ new: AgentConfiguration) {
        let t = now()
        let keysChanged = new.policy.lanKeys != configuration.policy.lanKeys
        configuration = new
        handle(planner.updatePolicy(new.policy, now: t))
        if keysChanged, let stored = try? store.pairings() {
            // `lan_keys` changed: the pairings' LAN routes get (or lose) their keys.
            for pairing in stored.map(\.pairing) { addPairing(pairing, now: t, quiet: true) }
        }
        applyManualEndpoints(new.endpoints, now: t)
        // A reload is also a sign of life: whatever was backing off is probed at once.
        planner.refreshAll(now: t)
        startHeartbeat()
        logger.info("configuration reloaded", metadata: ["endpoints": "\(new.endpoints.count)"])
        pump()
    }

    private func applyManualEndpoints(_ endpoints: [ManualEndpoint], now t: Double) {
        var ids = Set<String>()
        for endpoint in endpoints {
            guard var route = try? endpoint.route() else { continue }  // validated when the file was read
            if planner.policy.lanKeys == .never, route.baseURL.hasPrefix("http://") {
                // lan_keys: never: no key travels over plain HTTP, whatever an endpoint says.
                route.credentials = Credentials(
                    accessClientID: route.credentials.accessClientID, accessClientSecret: route.credentials.accessClientSecret)
            }
            ids.insert(route.id)
            handle(planner.upsert(route, now: t))
        }
        for id in manualRouteIDs.subtracting(ids) {
            handle(planner.remove(id, reason: "removed from the configuration", now: t))
        }
        manualRouteIDs = ids
    }

    // MARK: - Inputs

    /// Feeds one merged mDNS event.
    public func discovery(_ event: DiscoveryEvent) {
        let t = now()
        switch event {
        case .added(let server), .updated(let server, _):
            let refused = Route.refusedAddresses(of: server)
            if !refused.isEmpty, refusalLogged.insert(server.id).inserted {
                logger.notice(
                    "ignoring announced addresses the agent never connects to",
                    metadata: [
                        "server": "\(ServerTable.printable(server.name))",
                        "refused": "\(refused.map { "\(ServerTable.printable($0.address)) (\($0.reason))" }.joined(separator: ", "))",
                    ])
            }
            guard let route = Route.lan(for: server) else { return }
            if mdnsRoutes[server.id] == nil, mdnsRoutes.count >= Self.maxDiscovered {
                // A flood of announcements: memory, probes and the database stay bounded.
                if !floodLogged {
                    floodLogged = true
                    logger.warning(
                        "more than \(Self.maxDiscovered) servers announced: ignoring new ones until some go away",
                        metadata: ["server": "\(ServerTable.printable(server.name))"])
                }
                metricsRegistry.ignoredAnnouncements.increment()
                return
            }
            if let old = mdnsRoutes[server.id], old != route.id {
                handle(planner.withdraw(old, now: t))
            }
            mdnsRoutes[server.id] = route.id
            mdnsRouteByID[route.id] = route
            handle(planner.upsert(route, now: t))
            let instance = planner.routes[route.id]?.instanceID, at = wall(t)
            let name = server.name, addresses = server.addresses
            writer.write("save a discovered server", droppable: true) { store in
                try store.saveRoute(StoredRoute(route: route, instanceID: instance, createdAt: at, lastSeen: at))
                try store.recordServerSeen(
                    key: instance ?? route.id, instanceID: instance, name: name, addresses: addresses, source: .mdns, at: at)
            }
        case .removed(let server, let reason):
            refusalLogged.remove(server.id)
            if mdnsRoutes.count < Self.maxDiscovered / 2 { floodLogged = false }
            guard let id = mdnsRoutes.removeValue(forKey: server.id) else { return }
            mdnsRouteByID[id] = nil
            logger.info("mDNS \(reason == .withdrawn ? "withdrew" : "lost") \(ServerTable.printable(server.name)); probing to confirm", metadata: ["route": "\(id)"])
            handle(planner.withdraw(id, now: t))
        case .daemon(let state):
            let (name, detail): (String, String?) =
                switch state {
                case .running: ("running", nil)
                case .waiting(let reason): ("waiting", reason)
                case .reconnecting: ("reconnecting", nil)
                }
            guard name != avahiState || detail != avahiDetail else { return }
            avahiState = name
            avahiDetail = detail
            logger.info("avahi-daemon \(name)\(detail.map { ": \($0)" } ?? "")")
            broadcast(StatusAPI.WatchLine(type: "avahi", seq: 0, at: iso(t), avahi: name, reason: detail))
        }
        pump()
    }

    // MARK: - Pairings

    /// Imports pairings (already parsed and validated): stored in one transaction, then their
    /// routes are added or updated and probed at once.
    public func importPairings(_ pairings: [Pairing]) async throws -> [PairingImport] {
        let at = wall(now())
        let results = try await writer.perform { try $0.importPairings(pairings, at: at) }
        let t = now()
        for result in results {
            let pairing = result.stored.pairing
            let newIDs = Set(pairing.routes(lanKeys: planner.policy.lanKeys).map(\.id))
            for old in (pairingRoutes[pairing.id] ?? []) where !newIDs.contains(old) {
                dropPairingRoute(old, reason: "pairing \(pairing.id) updated", now: t)
            }
            addPairing(pairing, now: t, quiet: false)
            for id in newIDs { planner.probeNow(id, now: t) }
            logger.notice(
                result.isUpdate ? "pairing updated" : "pairing imported",
                metadata: ["pairing": "\(pairing.id)", "routes": "\(newIDs.sorted().joined(separator: " "))"])
            record(
                kind: result.isUpdate ? "pairing-updated" : "pairing-added", routeID: nil, from: nil, to: pairing.id,
                reason: "\(pairing.format.rawValue): \(pairing.label)", at: t)
        }
        pump()
        return results
    }

    /// Removes a pairing (by id, or by a name only one pairing has) and drops its routes at once.
    public func removePairing(_ idOrName: String) async throws -> StoredPairing? {
        guard let removed = try await writer.perform({ try $0.removePairing(idOrName) }) else { return nil }
        let t = now()
        let id = removed.pairing.id
        pairingExpiry[id] = nil
        for routeID in pairingRoutes.removeValue(forKey: id) ?? removed.pairing.routes(lanKeys: planner.policy.lanKeys).map(\.id) {
            dropPairingRoute(routeID, reason: "pairing \(id) removed", now: t)
        }
        logger.notice("pairing removed", metadata: ["pairing": "\(id)"])
        record(kind: "pairing-removed", routeID: nil, from: id, to: nil, reason: removed.pairing.label, at: t)
        pump()
        return removed
    }

    /// The stored pairings (inside the daemon only: they hold secrets).
    public func storedPairings() async throws -> [Pairing] {
        try await writer.read { try $0.pairings() }.map(\.pairing)
    }

    /// Every pairing with what the agent knows of its routes (no secrets).
    public func pairingSummaries() async throws -> [PairingSummary] {
        try await writer.read { try $0.pairings() }.map { stored in
            var summary = stored.summary
            summary.routes = stored.pairing.routes(lanKeys: planner.policy.lanKeys).map { route in
                let state = planner.routes[route.id]
                return PairingRouteState(
                    id: route.id, baseURL: route.baseURL, via: route.via, verdict: state?.verdict,
                    detail: state?.lastReport?.detail, active: planner.activeID == route.id)
            }
            return summary
        }
    }

    private func addPairing(_ pairing: Pairing, now t: Double, quiet: Bool) {
        if let expires = pairing.expiresAt, Double(expires) < wall(t) {
            logger.notice("pairing expired; not probing it", metadata: ["pairing": "\(pairing.id)"])
            return
        }
        let routes = pairing.routes(lanKeys: planner.policy.lanKeys)
        for route in routes {
            handle(planner.upsert(route, now: t), quiet: quiet)
        }
        pairingRoutes[pairing.id] = routes.map(\.id)
        pairingExpiry[pairing.id] = pairing.expiresAt.map(Double.init)
    }

    /// Drops the routes of pairings whose expiry has passed (the pairing stays listed).
    private func expirePairings(now t: Double) {
        let wallNow = realtime()
        for (id, expires) in pairingExpiry where expires <= wallNow {
            pairingExpiry[id] = nil
            for routeID in pairingRoutes.removeValue(forKey: id) ?? [] {
                dropPairingRoute(routeID, reason: "pairing \(id) expired", now: t)
            }
            logger.notice("pairing expired; its routes are no longer used", metadata: ["pairing": "\(id)"])
            record(kind: "pairing-expired", routeID: nil, from: id, to: nil, reason: "expired", at: t)
        }
    }

    /// Drops a pairing's route; one that mDNS still announces goes back to being an mDNS route.
    private func dropPairingRoute(_ routeID: String, reason: String, now t: Double) {
        guard planner.routes[routeID]?.route.source == .pairing else { return }
        handle(planner.remove(routeID, reason: reason, now: t))
        if let announced = mdnsRouteByID[routeID] {
            handle(planner.upsert(announced, now: t))
        }
    }

    /// Marks discovery as not running (disabled in the configuration, or stopped).
    public func setDiscoveryState(_ state: String, detail: String?) {
        avahiState = state
        avahiDetail = detail
    }

    /// Probes everything now (`POST /v1/refresh`).
    public func refresh() {
        planner.refreshAll(now: now())
        logger.info("refresh requested: probing every endpoint")
        pump()
    }

    // MARK: - Probing

    /// - Parameter reselect: re-run selection first (a timer fired or the inputs changed);
    ///   after a probe result the planner has just selected.
    private func pump(reselect: Bool = true) {
        guard !stopped else { return }
        let t = now()
        if !pairingExpiry.isEmpty { expirePairings(now: t) }
        if reselect { handle(planner.tick(now: t)) }
        for task in planner.takeDueProbes(now: t) {
            let route = task.route, full = task.full
            let timeout = planner.policy.timeout(for: route.via)
            let prober = self.prober
            probeTasks[route.id] = Task {
                let report = await prober.probe(route, timeout: timeout, full: full)
                self.probeFinished(route.id, report: report, full: full)
            }
        }
        schedule()
    }

    private func probeFinished(_ routeID: String, report: ProbeReport, full: Bool) {
        probeTasks[routeID] = nil
        guard !stopped else { return }
        let t = now()
        metricsRegistry.probes.increment()
        if report.verdict.isAlive { metricsRegistry.probeDuration.record(report.latency) }
        let knownInstance = planner.routes[routeID]?.instanceID
        handle(planner.record(report, for: routeID, full: full, now: t))
        if let state = planner.routes[routeID], let instance = state.instanceID, instance != knownInstance {
            // Learned who this is: remember it by instance_id, the key that merges routes.
            let at = wall(t)
            var route = state.route
            let remember = route.source == .mdns || route.source == .remembered
            let source = route.source
            // An announcer repeating a set-up server's id is kept apart from that server.
            let key = planner.trust(of: state) == .impostor ? "impostor:\(state.id)" : instance
            route.source = .mdns
            writer.write("save a server's identity") { [route] store in
                if remember { try store.saveRoute(StoredRoute(route: route, instanceID: instance, createdAt: at, lastSeen: at)) }
                try store.recordServerSeen(
                    key: key, instanceID: instance, name: route.name, addresses: route.addresses, source: source, at: at)
            }
        }
        if let state = planner.routes[routeID] {
            let stats = ProbeStats(
                routeID: routeID, probes: state.probeCount, failures: state.failureCount,
                smoothedLatency: state.smoothedLatency, lastVerdict: report.verdict, lastDetail: report.detail,
                lastProbeAt: wall(t), lastGoodAt: report.verdict.isAlive ? wall(t) : nil, instanceID: state.instanceID)
            writer.write("save probe statistics", droppable: true) { try $0.saveStats(stats) }
        }
        pump(reselect: false)
    }

    private func schedule() {
        var next = planner.nextWakeup()
        if let expires = pairingExpiry.values.min() {
            let at = now() + max(0, expires - realtime())
            next = min(next ?? at, at)
        }
        guard let next else {
            timer?.cancel()
            timer = nil
            timerDeadline = nil
            return
        }
        if let deadline = timerDeadline, deadline <= next, timer != nil { return }
        timer?.cancel()
        timerDeadline = next
        let delay = max(0, next - now())
        timer = Task { [weak self] in
            try? await Task.sleep(for: .milliseconds(Int64(delay * 1000) + 1))
            guard !Task.isCancelled else { return }
            await self?.timerFired()
        }
    }

    private func timerFired() {
        timer = nil
        timerDeadline = nil
        pump()
    }

    // MARK: - Events out

    private func handle(_ events: [PlannerEvent], quiet: Bool = false) {
        let t = now()
        for event in events {
            switch event {
            case .routeAdded(let state):
                if !quiet {
                    logger.info("endpoint added", metadata: ["route": "\(state.id)", "source": "\(state.route.source.rawValue)"])
                }
                record(kind: "candidate-added", routeID: state.id, from: nil, to: nil, reason: "\(state.route.source.rawValue): \(state.route.name)", at: t)
                broadcast(StatusAPI.WatchLine(type: "candidate-added", seq: 0, at: iso(t), route: routeStatus(state, now: t)))
            case .routeRemoved(let state, let reason):
                logger.info("endpoint removed: \(reason)", metadata: ["route": "\(state.id)"])
                // Every removal is final (deleted from the config, or forgotten after long silence).
                let id = state.id, tunnel = state.route.via == .wan
                writer.write("forget a route") { store in
                    try store.deleteRoute(id)
                    if tunnel { try store.deleteVouch(tunnelRouteID: id) }
                }
                record(kind: "candidate-removed", routeID: state.id, from: nil, to: nil, reason: reason, at: t)
                broadcast(StatusAPI.WatchLine(type: "candidate-removed", seq: 0, at: iso(t), route: routeStatus(state, now: t), reason: reason))
            case .healthChanged(let state, let from, let reason):
                logger.info(
                    "health \(from?.rawValue ?? "unknown") → \(state.verdict?.rawValue ?? "unknown")",
                    metadata: ["route": "\(state.id)", "reason": "\(reason)"])
                record(kind: "health", routeID: state.id, from: from?.rawValue, to: state.verdict?.rawValue, reason: reason, at: t)
                broadcast(StatusAPI.WatchLine(type: "health", seq: 0, at: iso(t), route: routeStatus(state, now: t), reason: reason))
            case .routeUpdated:
                break
            case .impostor(let state, let owner):
                let why = planner.untrustedWhy(state)
                logger.warning(
                    "an announced server \(why): never used, never sent a key",
                    metadata: ["route": "\(state.id)", "owner": "\(ServerTable.printable(owner))"])
                record(kind: "impostor", routeID: state.id, from: nil, to: nil, reason: why, at: t)
            case .vouchesChanged(let tunnelID, let urls, let instance):
                logger.info(
                    "the tunnel vouches for LAN addresses",
                    metadata: ["route": "\(tunnelID)", "addresses": "\(urls.isEmpty ? "none" : urls.joined(separator: " "))"])
                let at = wall(t)
                writer.write("keep a tunnel's vouched addresses") {
                    try $0.saveVouch(StoredVouch(tunnelRouteID: tunnelID, baseURLs: urls, instanceID: instance, updatedAt: at))
                }
            case .activeChanged(let from, let to, let reason):
                metricsRegistry.switches.increment()
                if let to {
                    logger.notice(
                        "active endpoint: \(to.route.baseURL) via \(to.route.via.rawValue)",
                        metadata: ["route": "\(to.id)", "reason": "\(reason)", "previous": "\(from?.id ?? "none")"])
                } else {
                    logger.warning("no usable endpoint", metadata: ["reason": "\(reason)", "previous": "\(from?.id ?? "none")"])
                }
                record(kind: "active", routeID: to?.id, from: from?.id, to: to?.id, reason: reason, at: t)
                if let id = to?.id { writer.write("remember the active endpoint") { try $0.setMeta("last_good_route", id) } }
                broadcast(StatusAPI.WatchLine(type: "active", seq: 0, at: iso(t), active: activeEndpoint(), reason: reason))
                writeEndpointFile(at: t)
                followEvents(of: to?.route)
            }
        }
    }

    /// Where the gateway listens, for `/v1/status` and `endpoint.env`.
    public func setGatewayInfo(url: String?, socket: String?) {
        gatewayInfo = StatusAPI.Gateway(openAIBaseURL: url.map { $0 + "/v1" }, socket: socket)
        writeEndpointFile(at: now())
    }

    // MARK: - Passive health: the active server's event stream

    /// Follows the active server's `/admin/events` when its admin key is known: model and
    /// readiness events update the agent at once, and silence where a heartbeat was due counts
    /// as a failed probe. Reconnects with backoff; each connection starts with a full probe
    /// (snapshot), then follows the diffs.
    private func followEvents(of route: Route?) {
        let wanted = route.flatMap { $0.credentials.adminKey == nil ? nil : $0 }
        guard wanted?.id != eventRouteID else { return }
        eventTask?.cancel()
        eventTask = nil
        eventRouteID = wanted?.id
        guard let route = wanted, !stopped else { return }
        let prober = self.prober
        let silence = planner.policy.eventHeartbeatTimeout
        let connect = planner.policy.timeout(for: route.via)
        eventTask = Task {
            var backoff = 1.0
            while !Task.isCancelled {
                let end = await prober.followEvents(route, silence: silence, connectTimeout: connect) { event in
                    await self.serverEvent(event, routeID: route.id)
                }
                guard !Task.isCancelled else { return }
                let pause = self.eventStreamEnded(end, routeID: route.id, backoff: backoff)
                try? await Task.sleep(for: .milliseconds(Int64(pause * 1000)))
                backoff = min(backoff * 2, 30)
            }
        }
    }

    private func serverEvent(_ event: ServerEvent, routeID: String) {
        guard routeID == eventRouteID, !stopped else { return }
        metricsRegistry.serverEvents.increment()
        let t = now()
        switch event.type {
        case "heartbeat":
            return
        case "model_loaded", "model_unloaded":
            if let model = event.model {
                planner.applyModelEvent(routeID, model: model, loaded: event.type == "model_loaded")
            }
            logger.info("server event", metadata: ["route": "\(routeID)", "event": "\(event.type)"])
            planner.resync(routeID, now: t)
        case "readiness_changed", "config_reloaded", "ttl_evicted":
            logger.info("server event", metadata: ["route": "\(routeID)", "event": "\(event.type)"])
            planner.resync(routeID, now: t)
        default:
            return
        }
        pump(reselect: false)
    }

    /// Returns the pause before reconnecting.
    private func eventStreamEnded(_ end: EventStreamEnd, routeID: String, backoff: Double) -> Double {
        guard routeID == eventRouteID, !stopped else { return backoff }
        let t = now()
        switch end {
        case .silent(let seconds):
            let detail = "no heartbeat on /admin/events for \(Int(seconds)) s"
            logger.warning("\(detail): counted as a failed probe; reconnecting", metadata: ["route": "\(routeID)"])
            handle(planner.recordPassiveFailure(routeID, detail: detail, now: t))
            planner.probeNow(routeID, now: t)
            pump(reselect: false)
            return 0.5
        case .refused(let status):
            logger.notice("the server refused its event stream (HTTP \(status)): relying on probes", metadata: ["route": "\(routeID)"])
            return 300
        case .closed(let why):
            logger.info("event stream closed (\(why)); reconnecting", metadata: ["route": "\(routeID)"])
            // Whatever happened meanwhile is learned from a full probe after reconnecting.
            planner.resync(routeID, now: t)
            pump(reselect: false)
            return backoff
        }
    }

    /// Keeps `endpoint.env` (beside the socket) in step with the active endpoint; nil removes it.
    public func setEndpointFile(_ file: EndpointFile?) {
        if file == nil { endpointFile?.remove() }
        endpointFile = file
        writeEndpointFile(at: now())
    }

    private func writeEndpointFile(at t: Double) {
        guard let endpointFile else { return }
        let active = activeEndpoint()
        let text = EndpointFile.render(
            active, reason: active == nil ? noActiveReason() : nil, gateway: gatewayInfo?.openAIBaseURL, updated: iso(t))
        if let problem = endpointFile.write(text) {
            if !endpointFileFailed { logger.warning("\(problem)") }
            endpointFileFailed = true
        } else {
            endpointFileFailed = false
        }
    }

    private func record(kind: String, routeID: String?, from: String?, to: String?, reason: String, at t: Double) {
        let at = wall(t)
        writer.write("record an event") { _ = try $0.appendEvent(kind: kind, routeID: routeID, from: from, to: to, reason: reason, at: at) }
    }

    /// Numbers a line and sends it to every watcher. A watcher whose buffer is full has stopped
    /// reading: it is dropped (its stream ends) so that it never slows anyone else.
    private func broadcast(_ line: StatusAPI.WatchLine) {
        seq += 1
        var line = line
        line.seq = seq
        let bytes = Self.encodeLine(line)
        recent.append((seq, bytes))
        if recent.count > recentLimit { recent.removeFirst(recent.count - recentLimit) }
        for (id, watcher) in watchers {
            if case .dropped = watcher.yield(bytes) {
                watcher.finish()
                watchers[id] = nil
                logger.notice("dropped a watch client that stopped reading")
            }
        }
    }

    static func encodeLine(_ line: StatusAPI.WatchLine) -> [UInt8] {
        var bytes = (try? StatusAPI.encoder.encode(line)).map { Array($0) } ?? Array(#"{"type":"error"}"#.utf8)
        bytes.append(0x0A)
        return bytes
    }

    private func startHeartbeat() {
        heartbeat?.cancel()
        let interval = configuration.watchHeartbeat
        heartbeat = Task { [weak self] in
            while !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(Int64(interval * 1000)))
                guard !Task.isCancelled else { return }
                await self?.sendHeartbeat()
            }
        }
    }

    private func sendHeartbeat() {
        let bytes = Self.encodeLine(StatusAPI.WatchLine(type: "heartbeat", seq: seq, at: iso(now())))
        for (id, watcher) in watchers {
            if case .dropped = watcher.yield(bytes) {
                watcher.finish()
                watchers[id] = nil
            }
        }
    }

    // MARK: - Reading state

    /// Subscribes to `/v1/watch`: the lines to send first (a snapshot, or the missed lines when
    /// `since` is recent enough) and the stream of later lines.
    public func watch(since: UInt64?) -> (first: [[UInt8]], stream: AsyncStream<[UInt8]>, id: UInt64) {
        let (stream, continuation) = AsyncStream<[UInt8]>.makeStream(bufferingPolicy: .bufferingOldest(watcherBuffer))
        nextWatcherID += 1
        let id = nextWatcherID
        watchers[id] = continuation
        var first: [[UInt8]]
        if let since, since <= seq, since + 1 >= (recent.first?.seq ?? seq + 1) || since == seq {
            first = recent.filter { $0.seq > since }.map(\.line)
        } else {
            first = [Self.encodeLine(StatusAPI.WatchLine(type: "snapshot", seq: seq, at: iso(now()), status: status()))]
        }
        return (first, stream, id)
    }

    /// Ends every watch stream (the daemon is stopping).
    public func closeWatchers() {
        for watcher in watchers.values { watcher.finish() }
        watchers.removeAll()
    }

    public func unwatch(_ id: UInt64) {
        watchers.removeValue(forKey: id)?.finish()
    }

    public var watcherCount: Int { watchers.count }

    /// The routes a gateway request may use, best first (the active one, then fallbacks), with
    /// what is needed to reach them. Stays inside the daemon: credentials never leave it.
    /// - Parameters:
    ///   - model: the request's JSON `model`, to route by.
    ///   - clientHasKey: the request carries its own `Authorization` or `X-Api-Key`.
    public func gatewayTargets(limit: Int, model: String? = nil, clientHasKey: Bool = false) -> GatewayPlan {
        if let refusal = planner.untrustedOnly(model: model) {
            return .refuse(status: 404, code: "model_not_trusted", message: refusal)
        }
        let order = planner.requestOrder(model: model)
        // A route without the key its server requires would answer a certain 401.
        let keyed = clientHasKey ? order : order.filter { !planner.lacksRequiredKey($0) }
        if keyed.isEmpty, let keyless = order.first {
            return .refuse(
                status: 401, code: "inference_key_required",
                message: "\(keyless.route.name) requires an inference key and no usable route to it carries one"
                    + (planner.policy.lanKeys == .never ? " (lan_keys: never keeps keys off the LAN; its tunnel is not usable now)" : "")
                    + ": send your own Authorization header, or pair again with the server's api_key")
        }
        return .forward(keyed.prefix(limit).map { state in
            GatewayTarget(routeID: state.id, baseURL: state.route.baseURL, via: state.route.via, credentials: state.route.credentials)
        })
    }

    /// The gateway could not reach a route (refused, reset, timed out): probe it now rather
    /// than at its next turn, so the active endpoint moves on quickly.
    public func gatewayFailed(_ routeID: String, reason: String) {
        guard planner.routes[routeID] != nil, probeTasks[routeID] == nil else { return }
        logger.info("gateway could not reach a route: probing it now", metadata: ["route": "\(routeID)", "reason": "\(reason)"])
        planner.probeNow(routeID, now: now())
        pump(reselect: false)
    }

    /// `GET /v1/resolve?model=`: the best usable endpoint that has `model`, with the reason.
    public func resolve(model: String) -> StatusAPI.Resolved {
        let (state, reason) = planner.resolve(model: model)
        return StatusAPI.Resolved(model: model, endpoint: state.flatMap(endpoint), reason: reason)
    }

    public func activeEndpoint() -> StatusAPI.Active? {
        planner.active.flatMap(endpoint)
    }

    private func endpoint(_ state: RouteState) -> StatusAPI.Active? {
        guard let verdict = state.verdict else { return nil }
        return StatusAPI.Active(
            baseURL: state.route.baseURL, openAIBaseURL: state.route.openAIBaseURL, via: state.route.via,
            instanceID: state.instanceID, name: state.route.name, verdict: verdict,
            since: iso(state.id == planner.activeID ? (planner.activeSince ?? now()) : (state.healthySince ?? now())),
            routeID: state.id, source: state.route.source)
    }

    /// Why there is no active endpoint, for `/v1/active`'s 503.
    public func noActiveReason() -> String {
        let routes = planner.sortedRoutes
        if routes.isEmpty {
            return avahiState == "running"
                ? "no Opta LMX server found on the LAN and no endpoint paired or configured"
                : "no endpoint known and mDNS discovery is \(avahiState)\(avahiDetail.map { " (\($0))" } ?? "")"
        }
        if routes.allSatisfy({ $0.health == .unknown }) { return "probing \(routes.count) endpoint(s)" }
        let summary = routes.prefix(5).map { "\($0.route.name): \($0.lastReport.map { r in r.detail ?? r.verdict.rawValue } ?? "not probed")" }
        return "no usable endpoint among \(routes.count): " + summary.joined(separator: "; ")
    }

    private func routeStatus(_ state: RouteState, now t: Double) -> StatusAPI.RouteStatus {
        StatusAPI.RouteStatus(
            id: state.id, baseURL: state.route.baseURL, via: state.route.via, source: state.route.source,
            name: state.route.name, addresses: state.route.addresses, announced: state.route.announced,
            health: state.health, verdict: state.verdict, active: state.id == planner.activeID,
            reason: planner.explain(state, now: t),
            latencyMS: state.smoothedLatency.map { ($0 * 10_000).rounded() / 10 },
            lastProbe: state.lastReport.map { report in
                StatusAPI.Probe(
                    at: iso(state.lastProbeAt ?? t), verdict: report.verdict,
                    latencyMS: (report.latency * 10_000).rounded() / 10, detail: report.detail)
            },
            version: state.lastReport?.version, models: state.lastReport?.modelCount, ready: state.lastReport?.ready,
            probes: state.probeCount, failures: state.failureCount, credentials: state.route.credentials.setNames,
            pinnedInstance: state.route.pinnedInstance, loadedModels: state.lastReport?.models,
            trust: planner.trust(of: state), vouchedBy: state.route.vouchedBy,
            keyRequired: state.lastReport?.inferenceKeyRequired,
            inferenceReady: state.verdict.map { $0 == .ready && state.health == .up && !planner.lacksRequiredKey(state) })
    }

    /// Candidates: routes merged into servers by `instance_id`.
    public func candidates() -> [StatusAPI.Candidate] {
        let t = now()
        var groups: [String: [RouteState]] = [:]
        var order: [String] = []
        for state in planner.sortedRoutes {
            // An impostor is never merged into the server whose id it repeats.
            let key = planner.trust(of: state) == .impostor ? "route:\(state.id)"
                : state.instanceID.map { "instance:\($0)" } ?? "route:\(state.id)"
            if groups[key] == nil { order.append(key) }
            groups[key, default: []].append(state)
        }
        return order.map { key in
            let states = groups[key]!
            let best = states.min { (planner.rank($0) ?? 9) < (planner.rank($1) ?? 9) }
            return StatusAPI.Candidate(
                instanceID: states.first?.instanceID,
                name: states.first { $0.route.source == .mdns }?.route.name ?? states[0].route.name,
                active: states.contains { $0.id == planner.activeID },
                verdict: best?.verdict,
                routes: states.map { routeStatus($0, now: t) })
        }
    }

    public func status() -> StatusAPI.Status {
        let active = activeEndpoint()
        return StatusAPI.Status(
            agentVersion: StatusAPI.version, seq: seq, avahi: avahiState, avahiDetail: avahiDetail,
            active: active, noActiveReason: active == nil ? noActiveReason() : nil, candidates: candidates(),
            trust: planner.policy.trust.rawValue, gateway: gatewayInfo,
            prefer: planner.policy.preferredInstances.isEmpty ? nil : planner.policy.preferredInstances)
    }

    public nonisolated func events(limit: Int) async -> [StatusAPI.Event] {
        (try? await writer.read { try $0.recentEvents(limit: limit) }) ?? []
    }

    /// Prometheus text exposition: states sampled now, then everything swift-prometheus holds.
    public func metrics() -> String {
        let m = metricsRegistry
        var byVerdict: [String: Int] = [:]
        for state in planner.routes.values { byVerdict[state.verdict?.rawValue ?? "unknown", default: 0] += 1 }
        for (verdict, gauge) in m.routes { gauge.set(Double(byVerdict[verdict] ?? 0)) }
        m.candidates.set(Double(Set(planner.routes.values.map { $0.instanceID.map { "i:" + $0 } ?? "r:" + $0.id }).count))
        let via = planner.active?.route.via.rawValue ?? "none"
        for (name, gauge) in m.activeVia { gauge.set(to: name == via ? 1.0 : 0.0) }
        m.storePendingWrites.set(Double(writer.pending))
        let dropped = writer.dropped
        if dropped > lastDroppedWrites {
            m.storeDroppedWrites.increment(by: Int64(dropped - lastDroppedWrites))
            lastDroppedWrites = dropped
        }
        m.watchClients.set(Double(watchers.count))
        return m.text()
    }

    /// One line for systemd's `STATUS=`.
    public func statusLine() -> String {
        if let active = planner.active {
            return "active: \(active.route.baseURL) via \(active.route.via.rawValue) (\(active.verdict?.rawValue ?? "?")); \(planner.routes.count) endpoint(s)"
        }
        return "no active endpoint; \(planner.routes.count) endpoint(s) known"
    }
}
