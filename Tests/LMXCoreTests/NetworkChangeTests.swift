import Testing

@testable import LMXCore

/// This machine moving between networks and sleeping (ConnectionPlanner+Network), as opposed to
/// servers failing.
@Suite("Planner: this machine's network and sleep")
struct NetworkChangeTests {
    static let lanID = "lan/10.0.0.1:1234"
    static let wanID = "wan/https://t.example.com"
    static let home = RoutePath.reachable("on-link on lan0 from 10.0.0.14", onLink: true)
    static let away = RoutePath.reachable("routed via lan0 from 192.168.77.14", onLink: false)

    /// LAN active, tunnel standby, the LAN route's path recorded.
    func atHome(lanUp: @escaping (Double) -> Bool = { _ in true }) -> PlannerHarness {
        var h = PlannerHarness { id, t in id.hasPrefix("wan") || lanUp(t) ? .ready : .down }
        h.add(wan("https://t.example.com"))
        h.add(lan("10.0.0.1"))
        h.absorb(h.planner.applyPaths([Self.lanID: Self.home], now: h.now))
        h.run(until: 20)
        #expect(h.planner.activeID == Self.lanID)
        return h
    }

    @Test("leaving the LAN's subnet: the tunnel is active at once, before any probe or timeout")
    func leaveFailsOverAtOnce() {
        var h = atHome()
        h.absorb(h.planner.applyPaths([Self.lanID: Self.away], now: h.now))
        #expect(h.planner.activeID == Self.wanID)
        #expect(h.switches.last?.at == 20)
        #expect(h.switches.last?.reason.contains("this machine's network changed") == true)
        let lan = h.planner.routes[Self.lanID]!
        #expect(
            h.planner.explain(lan, now: h.now).hasPrefix("not reachable from this machine now: no longer on a network"))
        #expect(lan.nextProbeAt == h.now, "probed at once")
    }

    @Test("a link without carrier, or no route at all: out at once")
    func unreachableOutAtOnce() {
        var h = atHome()
        h.absorb(h.planner.applyPaths([Self.lanID: .unreachable("lan0 has no carrier", cause: .linkLost)], now: h.now))
        #expect(h.planner.activeID == Self.wanID)
        #expect(
            h.planner.explain(h.planner.routes[Self.lanID]!, now: h.now)
                == "not reachable from this machine now: lan0 has no carrier")
    }

    @Test("coming home: back on the LAN as soon as its probe answers, no stability window")
    func homeWithoutWindow() {
        // Away from t=20 to t=60: the LAN server cannot be reached (probes fail), then home.
        var h = atHome { t in !(20..<60).contains(t) }
        h.absorb(h.planner.applyPaths([Self.lanID: Self.away], now: h.now))
        h.run(until: 60)
        #expect(h.planner.activeID == Self.wanID)
        #expect(h.planner.routes[Self.lanID]!.health == .down, "failed for the whole trip")
        h.absorb(h.planner.applyPaths([Self.lanID: Self.home], now: h.now))
        #expect(h.planner.activeID == Self.wanID, "not before a probe got through")
        h.run(until: 61)
        #expect(h.planner.activeID == Self.lanID)
        let back = h.switches.last!
        #expect(back.at - 60 < 0.01, "at its first probe: \(back.at)")
        #expect(back.reason.contains("reachable again from this machine"))
    }

    @Test(
        "coming home with the link back after the address: probes connect quickly and follow each other at once until one gets through, then as usual"
    )
    func homeLinkLast() {
        // Away from t=20; the address and route of home at t=60, the link only at t=61.3.
        var h = atHome { t in !(20..<61.3).contains(t) }
        h.absorb(
            h.planner.applyPaths(
                [Self.lanID: .unreachable("lan0 has no address on 10.0.0.0/24", cause: .addressLost)], now: h.now))
        h.run(until: 60)
        #expect(h.planner.activeID == Self.wanID)
        #expect(h.planner.routes[Self.lanID]!.pathBackAt == nil)
        h.absorb(h.planner.applyPaths([Self.lanID: Self.home], now: h.now))
        #expect(h.planner.routes[Self.lanID]!.pathBackAt == 60)
        var tasks: [ProbeTask] = []
        // Probe by probe, as the manager would: each failed one is followed by the next at once.
        while h.now < 61.3 {
            let due = h.planner.takeDueProbes(now: h.now).filter { $0.route.id == Self.lanID }
            tasks += due
            for task in due {
                // The probe gives up on its connection after the quick timeout.
                h.now += task.connectTimeout ?? 1.5
                let report = ProbeReport(verdict: .down, latency: 0.25, detail: "connection timed out")
                h.absorb(h.planner.record(report, for: task.route.id, full: task.full, now: h.now))
            }
            h.now = max(h.now, h.planner.routes[Self.lanID]!.nextProbeAt)
        }
        #expect(tasks.count >= 5, "\(tasks.count) probes in 1.3 s")
        #expect(tasks.allSatisfy { $0.connectTimeout == ConnectionPlanner.pathReturnConnectTimeout })
        h.run(until: h.now + 0.5)
        let back = h.switches.last!
        #expect(back.to == Self.lanID && back.at - 61.3 < 0.3, "back at \(back.at)")
        #expect(h.planner.routes[Self.lanID]!.pathBackAt == nil, "a probe got through: as usual from now")
        #expect(h.planner.takeDueProbes(now: h.now + 1).allSatisfy { $0.connectTimeout == nil })
    }

    @Test("a way back that stays dark: after the window, probes back off as before")
    func pathBackWindowEnds() {
        var h = atHome { t in t < 20 }
        h.absorb(h.planner.applyPaths([Self.lanID: .unreachable("lan0 has no carrier", cause: .linkLost)], now: h.now))
        h.run(until: 60)
        let before = h.planner.routes[Self.lanID]!.failureCount
        h.absorb(h.planner.applyPaths([Self.lanID: Self.home], now: h.now))
        h.run(until: 60 + ConnectionPlanner.pathReturnWindow + 1)
        let lan = h.planner.routes[Self.lanID]!
        #expect(lan.nextProbeAt - h.now > 0.5, "backing off again: next at \(lan.nextProbeAt), now \(h.now)")
        // Refused at once (the harness's probes take 5 ms): one attempt per quick connect timeout.
        let attempts = lan.failureCount - before
        #expect(attempts >= 30 && attempts <= 45, "\(attempts) probes in the window")
    }

    @Test(
        "a stream's fate as the agent's state changes: stays on the best route; lost when its path goes; moved when its server is best reached by another route"
    )
    func streamFates() {
        var h = atHome { t in !(20..<60).contains(t) }
        func fate(_ route: String) -> StreamContinuation.Fate {
            AgentSnapshot(planner: h.planner, discovery: .running, originWall: 0)
                .streamFate(routeID: route, instance: "home", clientHasKey: false)
        }
        #expect(fate(Self.lanID) == .stay)
        #expect(fate(Self.wanID) == .moved, "a stream on the tunnel while the LAN is best")
        h.absorb(h.planner.applyPaths([Self.lanID: Self.away], now: h.now))
        #expect(fate(Self.lanID) == .lost(pathGone: true))
        #expect(fate(Self.wanID) == .stay)
        #expect(fate("lan/10.9.9.9:1234") == .lost(pathGone: true), "a route the agent no longer has")
        h.run(until: 60)
        h.absorb(h.planner.applyPaths([Self.lanID: Self.home], now: h.now))
        h.run(until: 61)
        #expect(h.planner.activeID == Self.lanID)
        #expect(fate(Self.wanID) == .moved)
    }

    @Test("a server that fails by itself still waits out the stability window when it returns")
    func serverFailureKeepsWindow() {
        var h = atHome { t in !(30..<40).contains(t) }
        h.run(until: 60)
        let back = h.switches.last!
        #expect(back.to == Self.lanID)
        #expect(back.at >= 40 + 10, "window kept: \(back.at)")
    }

    @Test("a path that changed but still exists: kept, probed now, and one failed probe is enough")
    func suspectDecidedByOneProbe() {
        var h = atHome { t in t < 20 }
        let other = RoutePath.reachable("on-link on wlan0 from 10.0.0.15", onLink: true)
        h.absorb(h.planner.applyPaths([Self.lanID: other], now: h.now))
        #expect(h.planner.activeID == Self.lanID, "still usable until its probe says otherwise")
        #expect(h.planner.routes[Self.lanID]!.suspect)
        h.run(until: 20.001)
        #expect(h.planner.routes[Self.lanID]!.health == .down, "down on one failure, not three")
        #expect(h.planner.activeID == Self.wanID)
    }

    @Test("a route seen for the first time only records its path")
    func firstPathIsBaseline() {
        var h = atHome()
        h.add(lan("10.0.0.2"))
        let events = h.planner.applyPaths(["lan/10.0.0.2:1234": Self.away], now: h.now)
        #expect(h.planner.routes["lan/10.0.0.2:1234"]!.offNetwork == nil)
        #expect(!events.contains { if case .activeChanged = $0 { true } else { false } })
    }

    @Test("after a wake: no request goes to a route before it answered again; a failure then is decisive and local")
    func wakeMakesEverythingStale() {
        var h = atHome { t in t < 20 || t >= 25 }
        #expect(h.planner.routes.values.allSatisfy { !$0.stale })
        h.absorb(h.planner.woke(now: h.now))
        #expect(h.planner.routes.values.allSatisfy { $0.stale && $0.nextProbeAt == h.now })
        let snapshot = AgentSnapshot(planner: h.planner, originWall: 0)
        guard case .forward(let held) = snapshot.gatewayPlan(limit: 3) else {
            Issue.record("refused")
            return
        }
        #expect(held.isEmpty, "the gateway holds")
        // The LAN server does not answer its first probe after the wake: down at once.
        h.run(until: 20.001)
        #expect(h.planner.routes[Self.lanID]!.health == .down)
        #expect(h.planner.activeID == Self.wanID)
        guard case .forward(let targets) = AgentSnapshot(planner: h.planner, originWall: 0).gatewayPlan(limit: 3) else {
            return
        }
        #expect(targets.map(\.routeID) == [Self.wanID])
        // It answers again at t=25: back without the window.
        h.run(until: 27)
        #expect(h.planner.activeID == Self.lanID)
        #expect(h.switches.last!.at < 26.5)
    }

    @Test("a probe in flight across the sleep: its answer is dropped, the route probed again")
    func probeAcrossSleepDropped() {
        var h = atHome()
        h.planner.refreshAll(now: h.now)
        let tasks = h.planner.takeDueProbes(now: h.now)
        #expect(tasks.contains { $0.route.id == Self.lanID })
        _ = h.planner.woke(now: h.now + 1)
        let events = h.planner.record(
            ProbeReport(verdict: .down, latency: 0, detail: "timed out"), for: Self.lanID, now: h.now + 2)
        #expect(events.isEmpty)
        let lan = h.planner.routes[Self.lanID]!
        #expect(lan.stale && lan.health == .up && lan.nextProbeAt == h.now + 2 && !lan.inFlight)
    }

    @Test("a route's condition is one value: each probe moves it the one way the network rules say")
    func conditionTransitions() {
        let off = RouteCondition.offNetwork("lan0 has no carrier", cause: .linkLost)
        // (before, probe good?) → after
        let table: [(RouteCondition, Bool, RouteCondition)] = [
            (.normal, true, .normal), (.normal, false, .normal),
            (.suspect, true, .normal), (.suspect, false, .localLoss),
            (off, false, off), (off, true, .returning),
            (.localLoss, false, .localLoss), (.localLoss, true, .returning),
            (.returning, true, .returning), (.returning, false, .normal),
            (.stale(since: 5, was: .normal), true, .normal), (.stale(since: 5, was: .normal), false, .localLoss),
            (.stale(since: 5, was: off), true, .returning), (.stale(since: 5, was: off), false, off),
            (.stale(since: 5, was: .returning), true, .returning),
        ]
        for (before, good, after) in table {
            #expect(before.afterProbe(good: good) == after, "\(before) after a \(good ? "good" : "failed") probe")
        }
        // Leaving the network while stale keeps the wake's staleness over the new base.
        let stale = RouteCondition.stale(since: 5, was: .normal)
        #expect(stale.replacingBase(with: off) == .stale(since: 5, was: off))
        #expect(stale.replacingBase(with: off).offNetwork == "lan0 has no carrier")
        #expect(RouteCondition.suspect.decidesAlone && stale.decidesAlone && !off.decidesAlone)
    }
}
