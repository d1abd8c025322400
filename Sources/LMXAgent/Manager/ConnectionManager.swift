import LMXCore
import LMXProbe
import LMXStore
import LMXSystem
import Logging

/// The agent's decisions in one place. Every input (an mDNS event, a probe result, a pairing, a
/// reload, the timer, the active server's events) becomes planner calls; what follows is
/// published as one immutable snapshot (for readers) and a list of events (for the outputs: the
/// watch hub, the event recorder, the log, metrics, `endpoint.env`, the passive-health follower).
/// Probes and timers are child tasks of `run()`.
public actor ConnectionManager {
    var planner: ConnectionPlanner
    private var configuration: AgentConfiguration
    private var sources = RouteSources()
    private var expiry = PairingExpiry()
    private var discovery: DiscoveryState = .stopped
    /// The doctor's findings while nothing is usable (`DoctorService`).
    private var discoveryFindings: [DoctorFinding] = []
    private var gateway: StatusAPI.Gateway?
    /// The latest gateway listener report applied.
    private var gatewayGeneration: UInt64 = 0
    /// Why the gateway's TCP listener, and its Unix socket, are not advertised (nil: no problem).
    private var gatewayProblems: (tcp: String?, socket: String?) = (nil, nil)
    private let prober: any RouteProber
    /// How this machine reaches LAN addresses (the kernel's routing table, or a test's table).
    public nonisolated let paths: any PathLookup
    private let store: StoreExecutor
    private let board: StateBoard
    private let sinks: [any AgentEventSink]
    let logger: Logger
    var clock: AgentClock { board.clock }

    /// Work for `run()`'s task group.
    private enum Job: Sendable {
        case probe(ProbeTask, timeout: Double)
        case wake(after: Double, generation: Int)
    }
    private let jobs: AsyncStream<Job>
    private let jobInput: AsyncStream<Job>.Continuation
    var probing: Set<String> = []
    private var wakeAt: Double?
    private var wakeGeneration = 0
    var stopped = false
    /// When a held gateway request last had every route probed.
    var lastWaitingRefresh = -Double.infinity
    /// Where the agent's use is read from (ConnectionManager+Usage); nil: not known (no gateway).
    var usage: UsageWitness?
    /// Callers waiting for a route's probe to finish (``ensureFreshActive()``).
    var probeWaiters: [String: [CheckedContinuation<Void, Never>]] = [:]

    public init(
        configuration: AgentConfiguration, prober: any RouteProber, paths: any PathLookup = KernelPaths(),
        store: StoreExecutor,
        board: StateBoard, sinks: [any AgentEventSink], logger: Logger
    ) {
        self.paths = paths
        self.configuration = configuration
        self.planner = ConnectionPlanner(
            policy: configuration.policy, seed: UInt64(truncatingIfNeeded: ProcessLimits.processID))
        self.prober = prober
        self.store = store
        self.board = board
        self.sinks = sinks
        self.logger = logger
        (jobs, jobInput) = AsyncStream.makeStream()
    }

    // MARK: - Running

    /// Restores what the store remembers, then probes and decides until `stop()`. At the end,
    /// probes in flight are cancelled and the active route is remembered.
    public func run() async {
        restore(await store.remembered())
        await withDiscardingTaskGroup { group in
            for await job in jobs {
                switch job {
                case .probe(let task, let timeout):
                    group.addTask { [prober] in
                        var report = await prober.probe(
                            task.route, timeout: timeout, full: task.full, connectTimeout: task.connectTimeout,
                            checkAPI: task.checkAPI)
                        if report.timedOut == true, await self.wantsConnectionCheck(task.route.id) {
                            // Timed out while the gateway streams from it: busy, or gone?
                            report.connectionAccepted = await prober.connects(
                                task.route, timeout: ConnectionPlanner.pathReturnConnectTimeout)
                        }
                        await self.probeFinished(task.route.id, report: report, full: task.full)
                    }
                case .wake(let delay, let generation):
                    group.addTask { [clock] in
                        await clock.sleep(seconds: delay)
                        await self.wake(generation)
                    }
                }
            }
            group.cancelAll()
        }
        let lastGood = planner.activeID ?? planner.lastGoodID
        store.write("remember the active endpoint") { try $0.setMeta("last_good_route", lastGood) }
        await store.flush(seconds: 3)
    }

    /// Ends `run()`.
    public func stop() {
        stopped = true
        jobInput.finish()
        for id in Array(probeWaiters.keys) { probeDone(id) }
    }

    /// Remembered routes (last-good first), pairings, configured endpoints and vouched addresses.
    private func restore(_ remembered: Remembered) {
        let t = clock.now()
        var events: [AgentEvent] = [.configured]
        for problem in remembered.problems { logger.error("\(problem)") }
        planner.lastGoodID = remembered.lastGood
        for stored in remembered.routes {
            if PairingExpiry.hasExpired(stored.expiresAt, at: WallTime(clock.realtime())) {
                logger.notice("pairing expired; not probing it", metadata: ["route": "\(stored.route.id)"])
                continue
            }
            var route = stored.route
            if route.source == .mdns { route.source = .remembered }
            if route.source == .manual { continue }  // manual endpoints come from the current config
            let instance = stored.instanceID ?? remembered.stats[route.id]?.instanceID
            events += planned(planner.upsert(route, instanceID: instance, now: t), quiet: true)
        }
        logger.info(
            "Restored \(planner.routes.count == 1 ? "1 route" : "\(planner.routes.count) routes") from the store.",
            metadata: ["routes": "\(planner.routes.count)", "last_good": "\(planner.lastGoodID ?? "none")"])
        for stored in remembered.pairings { events += addPairing(stored.pairing, now: t, quiet: true) }
        events += applyManualEndpoints(configuration.endpoints, now: t)
        // What the tunnels vouched for when last read: the paired server is used on the LAN at
        // once, also while its tunnel is down.
        for vouch in remembered.vouches {
            events += planned(
                planner.applyVouches(
                    for: vouch.tunnelRouteID, advertised: vouch.baseURLs, instanceID: vouch.instanceID, now: t),
                quiet: true)
        }
        pump(events)
    }

    // MARK: - Inputs

    /// Applies a reloaded configuration (SIGHUP). A reload is also a sign of life: whatever was
    /// backing off is probed at once.
    public func reload(_ new: AgentConfiguration) async {
        // The pairings are read first (through the executor's read connection), so the rest of
        // the reload is applied in one step.
        let keysChanged = new.policy.lanKeys != configuration.policy.lanKeys
        let stored = keysChanged ? try? await store.read { try $0.pairings() } : nil
        let t = clock.now()
        configuration = new
        var events = planned(planner.updatePolicy(new.policy, now: t))
        if let stored {
            // `lan_keys` changed: the pairings' LAN routes get (or lose) their keys.
            for pairing in stored.map(\.pairing) { events += addPairing(pairing, now: t, quiet: true) }
        }
        events += applyManualEndpoints(new.endpoints, now: t)
        planner.refreshAll(now: t)
        logger.info(
            "The configuration was reloaded: \(new.endpoints.count == 1 ? "1 endpoint" : "\(new.endpoints.count) endpoints") configured."
        )
        pump(events + [.configured])
    }

    private func applyManualEndpoints(_ endpoints: [ManualEndpoint], now t: Double) -> [AgentEvent] {
        var events: [AgentEvent] = []
        var ids = Set<String>()
        for endpoint in endpoints {
            // Validated when the configuration was read.
            guard let route = try? endpoint.route(lanKeys: planner.policy.lanKeys) else { continue }
            ids.insert(route.id)
            events += planned(planner.upsert(route, now: t))
        }
        for id in sources.setManual(ids) {
            events += planned(
                planner.remove(id, reason: "removed from the configuration", cause: .configRemoved, now: t))
        }
        return events
    }

    /// One merged mDNS event.
    public func discovery(_ event: DiscoveryEvent) {
        let t = clock.now()
        var events: [AgentEvent] = []
        switch event {
        case .added(let server), .updated(let server, _):
            let seen = sources.announce(server)
            if !seen.newlyRefused.isEmpty {
                logger.notice(
                    "ignoring announced addresses the agent never connects to",
                    metadata: [
                        "server": "\(ServerTable.printable(server.name))",
                        "refused":
                            "\(seen.newlyRefused.map { "\(ServerTable.printable($0.address)) (\($0.reason))" }.joined(separator: ", "))",
                    ])
            }
            if seen.floodStarted {
                logger.warning(
                    "more than \(RouteSources.maxAnnounced) servers announced: ignoring new ones until some go away",
                    metadata: ["server": "\(ServerTable.printable(server.name))"])
            }
            if seen.ignored { events.append(.announcementIgnored) }
            guard let route = seen.route else { break }
            if let old = seen.replaces { events += planned(planner.withdraw(old, now: t)) }
            events += planned(planner.upsert(route, now: t))
            let instance = planner.routes[route.id]?.instanceID
            events.append(.serverSeen(route, instanceID: instance))
        case .removed(let server, let reason):
            guard let id = sources.withdraw(server) else { break }
            logger.info(
                "\(ServerTable.printable(server.name)) is no longer announced on the LAN (\(reason == .withdrawn ? "it said goodbye" : "its announcement lapsed")): probing it to confirm.",
                metadata: ["route": "\(id)"])
            events += planned(planner.withdraw(id, now: t))
        case .daemon(let daemon):
            guard DiscoveryState(daemon) != discovery else { break }
            discovery = DiscoveryState(daemon)
            events.append(.discoveryChanged(discovery))
        }
        pump(events)
    }

    /// What the doctor needs: whether any route is usable now, the LAN addresses the user set
    /// up (pairings, configuration), which the doctor looks at, and what the last probe of each
    /// plain-HTTP LAN route found (the doctor probes nothing the agent probes already).
    public func doctorInput() -> (usable: Bool, announced: Int, hosts: [HostPort], known: [String: ProbeReport]) {
        let usable = planner.activeID != nil
        let announced = planner.routes.values.count { $0.route.source == .mdns }
        var hosts: [HostPort] = []
        var known: [String: ProbeReport] = [:]
        for state in planner.sortedRoutes where state.route.via == .lan && state.route.base.isPlainHTTP {
            guard
                let host = try? HostPort.parse(
                    state.route.base.hostPort, field: "route", defaultPort: HostPort.defaultPort)
            else { continue }
            if state.route.source.isSetUp { hosts.append(host) }
            if let report = state.lastReport { known[host.description] = report }
        }
        return (usable, announced, hosts, known)
    }

    /// The doctor's findings (empty: nothing to say, or something is usable).
    public func setDiscoveryFindings(_ findings: [DoctorFinding]) {
        guard findings != discoveryFindings else { return }
        discoveryFindings = findings
        publish([], now: clock.now())
    }

    /// Discovery is off (disabled in the configuration) or has stopped for good.
    public func discoveryEnded(_ state: DiscoveryState) {
        discovery = state
        pump()
    }

    /// The gateway's Unix socket: advertised (`socket`) only once it is bound; `problem` says why
    /// it is not (its path cannot be bound, its bind failed).
    public func setGatewaySocket(_ socket: String?, problem: String?) {
        gatewayProblems.socket = problem
        let current = gateway ?? StatusAPI.Gateway(openAIBaseURL: nil, socket: nil)
        let next = StatusAPI.Gateway(
            openAIBaseURL: current.openAIBaseURL, socket: socket, problem: gatewayProblemText)
        guard next != current || gateway == nil else { return }
        gateway = next
        publish([.configured], now: clock.now())
    }

    /// The gateway's problems in one sentence: its socket's first, then its TCP listener's.
    private var gatewayProblemText: String? {
        let all = [gatewayProblems.socket, gatewayProblems.tcp.map { "not on TCP: \($0)" }].compactMap { $0 }
        return all.isEmpty ? nil : all.joined(separator: "; ")
    }

    /// The TCP listener's state changed: advertised (`url`) only while it serves. Reports are
    /// numbered where they are made (`generation`): one that arrives after a later one is stale
    /// (two listeners report at once, and their calls may reach the actor in either order).
    public func setGatewayListener(url: String?, problem: String?, generation: UInt64 = .max) {
        if generation != .max {
            guard generation > gatewayGeneration else { return }
            gatewayGeneration = generation
        }
        gatewayProblems.tcp = problem
        let current = gateway ?? StatusAPI.Gateway(openAIBaseURL: nil, socket: nil)
        let next = StatusAPI.Gateway(
            openAIBaseURL: url.map { $0 + "/v1" }, socket: current.socket, problem: gatewayProblemText)
        guard next != current else { return }
        gateway = next
        publish([.configured], now: clock.now())
    }

    /// Probes everything now (`POST /v1/refresh`).
    public func refresh() {
        planner.refreshAll(now: clock.now())
        logger.info("A refresh was asked for: every route is probed now.")
        pump()
    }

    // MARK: - Pairings

    /// Imports pairings (already parsed and validated): stored in one transaction, then their
    /// routes are added or updated and probed at once.
    public func importPairings(_ pairings: [Pairing]) async throws -> [PairingImport] {
        let at = clock.realtime()
        let results = try await store.perform { try $0.importPairings(pairings, at: at) }
        let t = clock.now()
        var events: [AgentEvent] = []
        for result in results {
            let pairing = result.stored.pairing
            let newIDs = pairing.routes(lanKeys: planner.policy.lanKeys).map(\.id)
            for old in sources.pairingRoutes[pairing.id] ?? [] where !newIDs.contains(old) {
                events += dropPairingRoute(
                    old, reason: "its pairing was updated without it", cause: .pairingRemoved, now: t)
            }
            events += addPairing(pairing, now: t, quiet: false)
            for id in newIDs { planner.probeNow(id, now: t) }
            events.append(
                .pairing(
                    result.isUpdate ? .updated : .added, id: pairing.id,
                    detail: "\(pairing.format.rawValue): \(pairing.label)", routes: newIDs))
        }
        pump(events)
        return results
    }

    /// Removes a pairing (by id, or by a name only one pairing has) and drops its routes at once.
    public func removePairing(_ idOrName: String) async throws -> StoredPairing? {
        guard let removed = try await store.perform({ try $0.removePairing(idOrName) }) else { return nil }
        let t = clock.now()
        let id = removed.pairing.id
        expiry.remove(id)
        var events: [AgentEvent] = []
        for routeID in sources.removePairing(id) ?? removed.pairing.routes(lanKeys: planner.policy.lanKeys).map(\.id) {
            events += dropPairingRoute(routeID, reason: "its pairing was removed", cause: .pairingRemoved, now: t)
        }
        pump(events + [.pairing(.removed, id: id, detail: removed.pairing.label)])
        return removed
    }

    private func addPairing(_ pairing: Pairing, now t: Double, quiet: Bool) -> [AgentEvent] {
        let expires = pairing.expiresAt.map(Double.init)
        if PairingExpiry.hasExpired(expires, at: WallTime(clock.realtime())) {
            logger.notice("pairing expired; not probing it", metadata: ["pairing": "\(pairing.id)"])
            return []
        }
        let routes = pairing.routes(lanKeys: planner.policy.lanKeys)
        let events = routes.flatMap { planned(planner.upsert($0, now: t), quiet: quiet) }
        sources.setPairing(pairing.id, routes: routes.map(\.id))
        expiry.set(pairing.id, expiresAt: expires)
        return events
    }

    /// Drops a pairing's route; one that mDNS still announces goes back to being an mDNS route.
    private func dropPairingRoute(_ routeID: String, reason: String, cause: Cause, now t: Double) -> [AgentEvent] {
        guard planner.routes[routeID]?.route.source == .pairing else { return [] }
        var events = planned(planner.remove(routeID, reason: reason, cause: cause, now: t))
        if let announced = sources.announcedRoute(routeID) { events += planned(planner.upsert(announced, now: t)) }
        return events
    }

    // MARK: - Probing and publishing

    /// Expires pairings, re-runs selection (unless a probe result just did), starts the probes
    /// that fall due, sets the next wakeup and publishes.
    func pump(_ events: [AgentEvent] = [], reselect: Bool = true) {
        let t = clock.now()
        guard !stopped else { return publish(events, now: t) }
        var events = events
        let added = events.compactMap { if case .routeAdded(let state, _) = $0 { state.id } else { nil } }
        if !added.isEmpty { recordNewPaths(of: added) }
        for id in expiry.takeExpired(at: WallTime(clock.realtime())) {
            for routeID in sources.removePairing(id) ?? [] {
                events += dropPairingRoute(routeID, reason: "its pairing expired", cause: .pairingExpired, now: t)
            }
            events.append(.pairing(.expired, id: id, detail: "expired"))
        }
        if reselect { events += planned(planner.tick(now: t)) }
        readUsage(now: t)
        for task in planner.takeDueProbes(now: t) {
            probing.insert(task.route.id)
            jobInput.yield(.probe(task, timeout: planner.policy.timeout(for: task.route.via)))
        }
        var next = planner.nextWakeup()
        if let expires = expiry.nextDeadline(now: t, wallNow: WallTime(clock.realtime())) {
            next = min(next ?? expires, expires)
        }
        if let next, wakeAt.map({ next < $0 }) ?? true {
            wakeAt = next
            wakeGeneration += 1
            jobInput.yield(.wake(after: max(0, next - t), generation: wakeGeneration))
        }
        publish(events, now: t)
    }

    private func wake(_ generation: Int) {
        guard generation == wakeGeneration else { return }  // superseded by an earlier wakeup
        wakeAt = nil
        pump()
    }

    /// Whether a probe of `routeID` that timed out is to be followed by a connection check.
    private func wantsConnectionCheck(_ routeID: String) -> Bool {
        readUsage(now: clock.now())
        return planner.wantsConnectionCheck(routeID)
    }

    private func probeFinished(_ routeID: String, report: ProbeReport, full: Bool) {
        probing.remove(routeID)
        defer { probeDone(routeID) }
        guard !stopped else { return }
        let knownInstance = planner.routes[routeID]?.instanceID
        let t = clock.now()
        // The gateway's traffic as it is now: a probe that timed out while the server streamed
        // to us says it is busy, not gone.
        readUsage(now: t)
        var events = planned(planner.record(report, for: routeID, full: full, now: t))
        if let state = planner.routes[routeID] {
            if let instance = state.instanceID, instance != knownInstance, state.route.source.isFound {
                // Learned who answers at a found route: remembered with its instance_id.
                events.append(.serverSeen(state.route, instanceID: instance))
            }
            events.append(.probed(state, report: report))
        }
        pump(events, reselect: false)
    }

    func planned(_ events: [PlannerEvent], quiet: Bool = false) -> [AgentEvent] {
        AgentEvent.from(events, of: planner, quiet: quiet)
    }

    /// Hands the new snapshot and the events to every output, then to readers: whoever reads the
    /// board sees a state every output (`endpoint.env`, the watch hub) already has.
    func publish(_ events: [AgentEvent], now t: Double) {
        let events = AgentEvent.coalescingSwitches(events)
        let snapshot = AgentSnapshot(
            planner: planner, discovery: discovery, gateway: gateway, originWall: clock.originWall,
            discoveryFindings: discoveryFindings)
        for sink in sinks { sink.receive(events, snapshot: snapshot, now: t) }
        board.publish(snapshot, events: events)
        releaseWaitersOfInactive()
    }
}
