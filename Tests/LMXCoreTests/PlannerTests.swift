import Testing

@testable import LMXCore

/// Drives a planner like the agent does: routes due at `now` are probed with scripted results,
/// time advances to the next wakeup, and every switch of the active route is recorded.
struct PlannerHarness {
    var planner: ConnectionPlanner
    var now: Double = 0
    var switches: [(at: Double, to: String?, reason: String)] = []
    /// The cause code of each switch, beside `switches`.
    var switchCauses: [Cause] = []
    var events: [PlannerEvent] = []
    /// Scripted results: route id → verdict at a time.
    var script: (String, Double) -> HealthVerdict
    var latency: (String) -> Double = { _ in 0.005 }
    /// Every scripted server reports the paired instance unless a test says otherwise, so the
    /// trust policy treats the LAN routes as the paired server.
    var instance: (String) -> String? = { _ in "home" }
    /// The LAN addresses each tunnel vouches for (its discovery document's `base_urls`). By
    /// default a tunnel vouches for every LAN route the test adds, as the paired server's
    /// tunnel does for its own addresses; trust tests say otherwise.
    var vouch: ((String) -> [String])?
    /// What every server's discovery document says of `auth.inference_key_required`.
    var inferenceKeyRequired: Bool?
    /// HTTP requests sent to each route's server by the probes run (a quick check 1, a full probe 3).
    var requests: [String: Int] = [:]
    /// Whether each scripted failure timed out (else it was refused).
    var timesOut = false
    /// Whether the host of a route whose probe timed out still accepts connections (busy).
    var accepting = false
    /// Whether the server itself answers `/v1/models` at a time (asked while a page that was not
    /// the server's stands on the route), and how often it was asked.
    var apiAnswered: (String, Double) -> Bool = { _, _ in true }
    var apiChecks: [String: Int] = [:]
    private var lanURLs: [String] = []

    /// `inUse`: a client follows the agent (as the tests of failover timing assume: the active
    /// route under its close watch); the tests of idle probing say `false`.
    init(policy: HealthPolicy = HealthPolicy(), inUse: Bool = true, script: @escaping (String, Double) -> HealthVerdict)
    {
        planner = ConnectionPlanner(policy: policy)
        if inUse { planner.setWatchers(1, now: 0) }
        self.script = script
    }

    mutating func absorb(_ new: [PlannerEvent]) {
        events += new
        for case .activeChanged(_, let to, let reason, let cause) in new {
            switches.append((now, to?.id, reason))
            switchCauses.append(cause)
        }
    }

    mutating func add(_ route: Route) {
        absorb(planner.upsert(route, now: now))
        if route.via == .lan, !lanURLs.contains(route.baseURL) { lanURLs.append(route.baseURL) }
        // As after a restart: what the tunnels vouched for is known before any probe.
        for tunnel in planner.routes.values where tunnel.route.via == .wan && tunnel.route.source.isSetUp {
            absorb(
                planner.applyVouches(
                    for: tunnel.id, advertised: advertised(tunnel.id), instanceID: instance(tunnel.id), now: now))
        }
    }

    func advertised(_ tunnelID: String) -> [String] { vouch.map { $0(tunnelID) } ?? lanURLs }

    /// Runs the loop until `end`, probing whatever falls due (probes complete instantly).
    mutating func run(until end: Double) {
        while now <= end {
            // Probes started together complete in order of their latency.
            for task in planner.takeDueProbes(now: now).sorted(by: { latency($0.route.id) < latency($1.route.id) }) {
                let route = task.route
                requests[route.id, default: 0] += task.requests
                let verdict = script(route.id, now)
                let report = ProbeReport(
                    verdict: verdict, latency: latency(route.id), detail: verdict.isAlive ? nil : "scripted",
                    cause: verdict == .down ? (timesOut ? .timedOut : .refused) : Cause(verdict: verdict),
                    instanceID: instance(route.id))
                var reported = report
                reported.inferenceKeyRequired = inferenceKeyRequired
                if !verdict.isAlive, timesOut {
                    reported.timedOut = true
                    if planner.wantsConnectionCheck(route.id) { reported.connectionAccepted = accepting }
                }
                if route.via == .wan, task.full, verdict.isAlive { reported.advertisedBaseURLs = advertised(route.id) }
                if task.checkAPI, verdict.isAlive {
                    apiChecks[route.id, default: 0] += 1
                    reported.apiAnswered = apiAnswered(route.id, now)
                }
                absorb(planner.record(reported, for: route.id, full: task.full, now: now))
            }
            absorb(planner.tick(now: now))
            guard let next = planner.nextWakeup() else { break }
            now = max(next, now + 0.001)
        }
        now = end
    }
}

func lan(_ host: String, name: String? = nil) -> Route {
    Route(baseURL: "http://\(host):1234", via: .lan, source: .mdns, name: name ?? host, announced: true)
}

func wan(_ url: String, pin: String? = "home") -> Route {
    Route(baseURL: url, via: .wan, source: .pairing, name: "tunnel", pinnedInstance: pin)
}

@Suite("Connection planner")
struct PlannerTests {
    @Test("a single ready LAN server becomes active on its first probe")
    func firstProbeActivates() {
        var h = PlannerHarness { _, _ in .ready }
        h.add(lan("10.0.0.1"))
        h.run(until: 0.5)
        #expect(h.planner.activeID == "lan/10.0.0.1:1234")
        #expect(h.switches.count == 1)
        #expect(h.switches[0].at == 0)
    }

    @Test("LAN ready beats WAN ready, and LAN alive-not-ready beats WAN ready")
    func rankOrder() {
        var h = PlannerHarness { id, _ in id.hasPrefix("lan") ? .aliveNotReady : .ready }
        h.add(wan("https://t.example.com"))
        h.add(lan("10.0.0.1"))
        h.run(until: 1)
        #expect(h.planner.activeID == "lan/10.0.0.1:1234")
    }

    @Test("ready beats not ready among LAN servers")
    func readyBeatsNotReady() {
        var h = PlannerHarness { id, _ in id.contains("10.0.0.1") ? .aliveNotReady : .ready }
        h.add(lan("10.0.0.1"))
        h.add(lan("10.0.0.2"))
        h.run(until: 1)
        #expect(h.planner.activeID == "lan/10.0.0.2:1234")
    }

    @Test("lowest smoothed latency wins among equals when nothing is active yet")
    func latencyBreaksTies() {
        var h = PlannerHarness { _, _ in .ready }
        h.latency = { $0.contains("10.0.0.1") ? 0.200 : 0.002 }
        h.add(lan("10.0.0.1"))
        h.add(lan("10.0.0.2"))
        h.run(until: 1)
        #expect(h.planner.activeID == "lan/10.0.0.2:1234")
    }

    @Test("prefer: the preferred server is moved to among equals; after a failure, only after the stability window")
    func preferUpgrades() {
        var policy = HealthPolicy()
        policy.preferredInstances = ["B:1234"]
        // B is down from 3 s to 8 s; A (faster) stays up.
        var h = PlannerHarness(policy: policy) { id, t in id.contains("10.0.0.2") && t > 3 && t < 8 ? .down : .ready }
        h.instance = { $0.contains("10.0.0.1") ? "A:1234" : "B:1234" }
        h.latency = { $0.contains("10.0.0.1") ? 0.001 : 0.050 }
        h.add(lan("10.0.0.1"))
        h.add(lan("10.0.0.2"))
        h.run(until: 1)
        #expect(h.planner.activeID == "lan/10.0.0.2:1234")
        h.run(until: 7)
        #expect(h.planner.activeID == "lan/10.0.0.1:1234")
        // Back at 8 s: the window (10 s) must pass before B is preferred again.
        h.run(until: 15)
        #expect(h.planner.activeID == "lan/10.0.0.1:1234")
        h.run(until: 22)
        #expect(h.planner.activeID == "lan/10.0.0.2:1234")
        #expect(h.switches.last?.reason.contains("in prefer") == true)
    }

    @Test("a preferred instance wins among equals when the active route goes away")
    func preferredInstance() {
        var policy = HealthPolicy()
        policy.preferredInstances = ["B:1234"]
        var h = PlannerHarness(policy: policy) { id, t in id.contains("10.0.0.3") && t > 5 ? .down : .ready }
        h.instance = { $0.contains("10.0.0.1") ? "A:1234" : $0.contains("10.0.0.2") ? "B:1234" : "C:1234" }
        h.latency = { $0.contains("10.0.0.3") ? 0.0001 : $0.contains("10.0.0.1") ? 0.001 : 0.050 }
        h.add(lan("10.0.0.1"))
        h.add(lan("10.0.0.2"))
        h.add(lan("10.0.0.3"))
        h.run(until: 1)
        // An explicit prefer list is followed at once for a server that never failed.
        #expect(h.planner.activeID == "lan/10.0.0.2:1234")
        h.run(until: 10)
        #expect(h.planner.activeID == "lan/10.0.0.2:1234")
    }

    @Test("a new LAN server that never failed replaces the WAN at once")
    func newLANServerReplacesWAN() {
        var h = PlannerHarness { _, _ in .ready }
        h.add(wan("https://t.example.com"))
        h.run(until: 5)
        #expect(h.planner.activeID == "wan/https://t.example.com")
        h.add(lan("10.0.0.1"))
        h.run(until: 5.5)
        #expect(h.planner.activeID == "lan/10.0.0.1:1234")
    }

    @Test("the active route is kept among equals even when another gets faster")
    func staysAmongEquals() {
        var h = PlannerHarness { _, _ in .ready }
        h.add(lan("10.0.0.1"))
        h.run(until: 1)
        h.add(lan("10.0.0.2"))
        h.latency = { $0.contains("10.0.0.2") ? 0.0001 : 0.1 }
        h.run(until: 120)
        #expect(h.planner.activeID == "lan/10.0.0.1:1234")
        #expect(h.switches.count == 1)
    }

    @Test("LAN loss fails over to the WAN standby within a second, and returns after the stability window")
    func lanLossAndReturn() {
        // LAN refuses from t=30 to t=60.
        var h = PlannerHarness { id, t in
            if id.hasPrefix("wan") { return .ready }
            return (30..<60).contains(t) ? .down : .ready
        }
        h.add(wan("https://t.example.com"))
        h.add(lan("10.0.0.1"))
        h.run(until: 29.99)
        #expect(h.planner.activeID == "lan/10.0.0.1:1234")

        h.run(until: 59.99)
        let failover = h.switches.first { $0.to == "wan/https://t.example.com" }
        #expect(failover != nil)
        // Detected at the next quick check (≤ 0.5 s + jitter), confirmed one confirm interval later.
        #expect(failover!.at - 30 <= 0.55 + 0.25 + 0.01)

        // The server comes back and announces itself again.
        h.absorb(h.planner.withdraw("lan/10.0.0.1:1234", now: h.now))
        h.now = 60
        h.add(lan("10.0.0.1"))
        h.run(until: 100)
        let back = h.switches.last!
        #expect(back.to == "lan/10.0.0.1:1234")
        // Not before the LAN route has been healthy for the 10 s window.
        #expect(back.at >= 60 + 10)
        #expect(back.at <= 60 + 10 + 1.5)
        #expect(h.switches.count == 3)
    }

    @Test("a dead LAN route is retried with backoff, and the agent returns once it is healthy for the window")
    func lanReturnWithoutAnnouncement() {
        var h = PlannerHarness { id, t in
            if id.hasPrefix("wan") { return .ready }
            return (30..<60).contains(t) ? .down : .ready
        }
        h.add(wan("https://t.example.com"))
        h.add(lan("10.0.0.1"))
        h.run(until: 200)
        let back = h.switches.last!
        #expect(back.to == "lan/10.0.0.1:1234")
        #expect(back.at >= 70)
        #expect(back.at <= 60 + 60 + 10 + 2)  // at most one maximal backoff late
        #expect(h.switches.count == 3)
    }

    @Test("an mDNS withdrawal of the active route re-probes it at once and fails over when confirmed")
    func withdrawalConfirmedByProbe() {
        var gone = false
        var h = PlannerHarness { id, _ in id.hasPrefix("wan") ? .ready : .down }
        h.script = { id, t in id.hasPrefix("wan") || t < 10 ? .ready : .down }
        h.add(wan("https://t.example.com"))
        h.add(lan("10.0.0.1"))
        h.run(until: 10)
        #expect(h.planner.activeID == "lan/10.0.0.1:1234")
        gone = true
        h.absorb(h.planner.withdraw("lan/10.0.0.1:1234", now: 10.0))
        h.run(until: 12)
        #expect(gone)
        let failover = h.switches.last!
        #expect(failover.to == "wan/https://t.example.com")
        #expect(failover.at - 10 <= 0.3)
    }

    @Test("an mDNS withdrawal of a server that still answers changes nothing")
    func withdrawalOfLiveServer() {
        var h = PlannerHarness { _, _ in .ready }
        h.add(wan("https://t.example.com"))
        h.add(lan("10.0.0.1"))
        h.run(until: 5)
        h.absorb(h.planner.withdraw("lan/10.0.0.1:1234", now: 5))
        h.run(until: 6)
        h.add(lan("10.0.0.1"))
        h.run(until: 30)
        #expect(h.planner.activeID == "lan/10.0.0.1:1234")
        #expect(h.switches.count == 1)
    }

    @Test("a server flapping every second for a minute moves the active route at most twice")
    func flappingIsBounded() {
        var h = PlannerHarness { id, t in
            if id.hasPrefix("wan") { return .ready }
            if t < 10 { return .ready }
            return Int(t) % 2 == 0 ? .ready : .down
        }
        h.add(wan("https://t.example.com"))
        h.add(lan("10.0.0.1"))
        h.run(until: 70)
        // Once on the WAN it never returns: the LAN never stays healthy for 10 s.
        #expect(h.switches.count <= 2)
        var flips = 0
        for case .healthChanged(let s, let from, _, _) in h.events where s.id.hasPrefix("lan") && from != nil {
            if (from?.isAlive ?? false) != (s.verdict?.isAlive ?? false) { flips += 1 }
        }
        // Hysteresis: health changes need 3 bad or 2 good probes in a row, never every flap.
        #expect(flips <= 4)
    }

    @Test("two LAN servers: losing the active one moves to the other, not to the WAN")
    func twoLANServers() {
        var h = PlannerHarness { id, t in
            if id.contains("10.0.0.1") { return t < 20 ? .ready : .down }
            return .ready
        }
        h.latency = { $0.contains("10.0.0.1") ? 0.001 : 0.01 }
        h.add(wan("https://t.example.com"))
        h.add(lan("10.0.0.1"))
        h.add(lan("10.0.0.2"))
        h.run(until: 19.9)
        #expect(h.planner.activeID == "lan/10.0.0.1:1234")
        h.run(until: 30)
        #expect(h.planner.activeID == "lan/10.0.0.2:1234")
        #expect(h.switches.count == 2)
    }

    @Test("auth-rejected routes stay listed as auth-rejected, never as down, and are never active")
    func authRejectedShown() {
        var h = PlannerHarness { _, _ in .authRejected }
        h.add(wan("https://t.example.com"))
        h.run(until: 200)
        let state = h.planner.routes["wan/https://t.example.com"]
        #expect(state?.verdict == .authRejected)
        #expect(state?.health == .down)
        #expect(h.planner.activeID == nil)
    }

    @Test("overloaded is alive but loses to ready; Retry-After (capped) spares standbys, never the active route")
    func overloaded() {
        var h = PlannerHarness { id, _ in id.contains("10.0.0.1") ? .overloaded : .ready }
        h.add(lan("10.0.0.1"))
        h.add(wan("https://t.example.com"))
        h.run(until: 1)
        #expect(h.planner.activeID == "lan/10.0.0.1:1234")  // LAN alive beats WAN ready
        var state = h.planner.routes["lan/10.0.0.1:1234"]!
        _ = h.planner.takeDueProbes(now: 100)
        h.absorb(
            h.planner.record(
                ProbeReport(verdict: .overloaded, latency: 0.01, retryAfter: 3600), for: state.id, now: 100))
        state = h.planner.routes[state.id]!
        // The active route keeps its liveness checks whatever Retry-After says.
        #expect(state.nextProbeAt <= 100 + HealthPolicy().activeInterval * 1.2)

        // A standby that says Retry-After: 3600 is left alone for at most max_retry_after (60 s).
        h.add(lan("10.0.0.2"))
        h.run(until: 102)
        #expect(h.planner.activeID == "lan/10.0.0.2:1234")
        _ = h.planner.takeDueProbes(now: 200)
        h.absorb(
            h.planner.record(
                ProbeReport(verdict: .overloaded, latency: 0.01, retryAfter: 3600), for: state.id, now: 200))
        let standby = h.planner.routes[state.id]!
        #expect(standby.nextProbeAt >= 260)
        #expect(standby.nextProbeAt <= 260.001)
    }

    @Test("one failure of the active route does not switch; the failover needs it confirmed")
    func singleBlipDoesNotSwitch() {
        var h = PlannerHarness { id, t in
            if id.hasPrefix("wan") { return .ready }
            return (20..<20.2).contains(t) ? .down : .ready
        }
        h.add(wan("https://t.example.com"))
        h.add(lan("10.0.0.1"))
        h.run(until: 19)
        let at = h.planner.routes["lan/10.0.0.1:1234"]!.nextProbeAt
        h.script = { id, t in (id.hasPrefix("lan") && t == at) ? .down : .ready }
        h.run(until: 60)
        #expect(h.planner.activeID == "lan/10.0.0.1:1234")
        #expect(h.switches.count == 1)
    }

    @Test("dead routes back off up to the maximum")
    func backoff() {
        var h = PlannerHarness { _, _ in .down }
        h.planner = ConnectionPlanner(
            policy: {
                var p = HealthPolicy()
                p.jitter = 0
                return p
            }())
        h.add(lan("10.0.0.9"))
        h.run(until: 600)
        let state = h.planner.routes["lan/10.0.0.9:1234"]!
        #expect(state.probeCount < 20)
        #expect(state.nextProbeAt - state.lastProbeAt! == 60)
    }

    @Test("withdrawn mDNS routes that stay down are forgotten; paired ones never")
    func forgetting() {
        var policy = HealthPolicy()
        policy.forgetAfter = 100
        var h = PlannerHarness(policy: policy) { _, _ in .down }
        h.vouch = { _ in [] }
        h.add(lan("10.0.0.9"))
        h.add(wan("https://t.example.com"))
        h.absorb(h.planner.withdraw("lan/10.0.0.9:1234", now: 0))
        h.run(until: 300)
        #expect(h.planner.routes["lan/10.0.0.9:1234"] == nil)
        #expect(h.planner.routes["wan/https://t.example.com"] != nil)
    }

    @Test("probe concurrency is bounded and the last-good route goes first")
    func concurrencyAndLastGood() {
        var policy = HealthPolicy()
        policy.maxConcurrentProbes = 4
        var planner = ConnectionPlanner(policy: policy)
        for i in 1...10 { _ = planner.upsert(lan("10.0.0.\(i)"), now: 0) }
        planner.lastGoodID = "lan/10.0.0.7:1234"
        let first = planner.takeDueProbes(now: 0)
        #expect(first.count == 4)
        #expect(first.first?.route.id == "lan/10.0.0.7:1234")
        #expect(planner.takeDueProbes(now: 0).isEmpty)
    }
}
