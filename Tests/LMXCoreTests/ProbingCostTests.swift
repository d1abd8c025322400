import Testing

@testable import LMXCore

/// Probing proportional to use, and live streams judged by their own connection: the planner on a
/// test clock, its probes counted as the HTTP requests they send.
@Suite struct ProbingCostTests {
    static let home = lan("10.0.0.5")
    static let tunnel = wan("https://studio.example.com")

    /// A LAN server and its tunnel, both answering, settled.
    func settled(_ script: @escaping (String, Double) -> HealthVerdict = { _, _ in .ready }) -> PlannerHarness {
        var h = PlannerHarness(inUse: false, script: script)
        h.add(Self.home)
        h.add(Self.tunnel)
        h.run(until: 15)
        return h
    }

    @Test("idle: the active LAN server gets at most 12 requests a minute, the tunnel standby at most 1")
    func idleCost() {
        var h = settled()
        #expect(h.planner.activeID == Self.home.id)
        #expect(h.planner.isIdle(now: h.now))
        h.requests = [:]
        h.run(until: 15 + 30 * 60)
        let minutes = 30.0
        let active = Double(h.requests[Self.home.id] ?? 0) / minutes
        let standby = Double(h.requests[Self.tunnel.id] ?? 0) / minutes
        #expect(active <= 12 && active >= 4, "active server: \(active) requests a minute")
        #expect(standby <= 1 && standby > 0, "tunnel standby: \(standby) requests a minute")
    }

    @Test(
        "idle: a tunnel standby that goes down (a quick tunnel's stale URL, cloudflared stopped) is asked a couple of times a minute, not every second for the ten minutes of the restart watch"
    )
    func idleStandbyDown() {
        // The tunnel is down from 100 s to 700 s; the LAN server goes at 700 s.
        var h = settled { id, now in
            id == Self.tunnel.id ? (now > 100 && now < 700 ? .tunnelDown : .ready) : (now < 700 ? .ready : .down)
        }
        h.run(until: 100)
        h.requests = [:]
        h.run(until: 699)
        let standby = h.requests[Self.tunnel.id] ?? 0
        #expect(h.planner.activeID == Self.home.id)
        #expect(h.planner.routes[Self.tunnel.id]?.health == .down)
        #expect(standby <= 25, "the tunnel standby, down, was asked \(standby) times in 10 minutes")
        // The LAN server goes (seen at its next idle check): the tunnel, back meanwhile, is asked
        // again at once and taken.
        h.run(until: 740)
        let lost = h.switches.last { $0.to == nil }?.at
        let taken = h.switches.last { $0.to == Self.tunnel.id }?.at
        #expect(h.planner.activeID == Self.tunnel.id, "\(h.switches.map(\.reason))")
        #expect(lost != nil && taken != nil && taken! - lost! < 4, "lost at \(lost ?? 0), tunnel at \(taken ?? 0)")
    }

    @Test(
        "in use (a client follows the changes): the active route is checked every 0.5 s, as the close watch always was")
    func watchedCost() {
        var h = settled()
        h.planner.setWatchers(1, now: h.now)
        h.run(until: h.now + 1)
        h.requests = [:]
        h.run(until: h.now + 60)
        let active = h.requests[Self.home.id] ?? 0
        #expect(active >= 100, "active server: \(active) requests a minute while watched")
        h.planner.setWatchers(0, now: h.now)
        #expect(h.planner.isIdle(now: h.now), "no watcher, no traffic since: idle")
    }

    @Test("while the gateway's traffic flows it is the proof of life: probes fill only the gaps")
    func trafficIsProof() {
        var h = settled()
        // A byte from the server every 0.2 s for 60 s, a request always in flight.
        h.requests = [:]
        let start = h.now
        var t = start
        while t < start + 60 {
            h.planner.noteTraffic(Self.home.id, RouteTraffic(inFlight: 1, heardAt: t), now: t)
            h.run(until: t + 0.2)
            t += 0.2
        }
        let during = h.requests[Self.home.id] ?? 0
        // Full probes every stable interval remain (they learn models and versions); no quick check.
        #expect(during <= 3 * 7, "requests while traffic flowed: \(during)")
        // The traffic stops (the request ended): a gap, filled within active_interval.
        h.planner.noteTraffic(Self.home.id, RouteTraffic(inFlight: 0, heardAt: t), now: t)
        h.requests = [:]
        h.run(until: t + 0.5 + 0.1)
        #expect((h.requests[Self.home.id] ?? 0) >= 1, "a probe within active_interval of the last byte")
    }

    @Test(
        "busy, not gone: health that times out while the gateway streams from the server counts nothing; without traffic the same probes fail over"
    )
    func busyNotGone() {
        var slow = false
        var h = settled { id, _ in slow && id == Self.home.id ? .down : .ready }
        h.timesOut = true
        h.accepting = true  // its host still accepts connections: busy
        h.planner.noteUse(now: h.now)
        slow = true
        // A chat stream in flight on the route (quiet: its prefill).
        let t0 = h.now
        h.planner.noteTraffic(Self.home.id, RouteTraffic(inFlight: 1, heardAt: t0), now: t0)
        h.run(until: t0 + 10)
        #expect(h.planner.activeID == Self.home.id, "still active while busy")
        #expect(h.switches.count == 1, "only the first choice: \(h.switches)")
        let state = h.planner.routes[Self.home.id]!
        #expect(state.health == .up && state.badStreak == 0 && state.busyProbes > 0)
        // The stream ended and its server still does not answer: now the probes count.
        h.planner.noteTraffic(Self.home.id, RouteTraffic(inFlight: 0, heardAt: t0), now: h.now)
        h.run(until: h.now + 10)
        #expect(h.planner.activeID == Self.tunnel.id, "failed over once nothing proves the server alive")
    }

    @Test(
        "a black hole is not busy: probes that time out while a quiet stream is on the route, its host accepting no connection, fail over"
    )
    func blackHoleWhileStreaming() {
        var cut = false
        var h = settled { id, _ in cut && id == Self.home.id ? .down : .ready }
        h.timesOut = true
        h.accepting = false
        h.planner.noteUse(now: h.now)
        h.planner.noteTraffic(Self.home.id, RouteTraffic(inFlight: 1, heardAt: h.now), now: h.now)
        cut = true
        h.run(until: h.now + 5)
        #expect(h.planner.activeID == Self.tunnel.id)
        #expect(h.planner.routes[Self.home.id]!.busyProbes == 0)
    }

    @Test("a refused probe is an answer: the server is gone even while a request of the gateway is on it")
    func refusedWhileStreaming() {
        var gone = false
        var h = settled { id, _ in gone && id == Self.home.id ? .down : .ready }
        h.planner.noteUse(now: h.now)
        gone = true
        h.planner.noteTraffic(Self.home.id, RouteTraffic(inFlight: 1, heardAt: h.now), now: h.now)
        h.run(until: h.now + 5)
        #expect(h.planner.activeID == Self.tunnel.id)
    }

    @Test(
        "never a dead route handed out: an idle route's last proof older than 1 s is checked with a quick connection, and its failure alone moves to the standby"
    )
    func freshCheck() {
        var gone = false
        var h = settled { id, _ in gone && id == Self.home.id ? .down : .ready }
        // Proven just now: handed out as it is.
        let proof = h.planner.routes[Self.home.id]!.lastProofAt!
        let early = h.planner.checkFresh(Self.home.id, now: proof + 0.5)
        #expect(!early)
        // Idle for 8 s; the server vanished meanwhile.
        gone = true
        let asked = proof + 8
        h.now = asked
        let due = h.planner.checkFresh(Self.home.id, now: asked)
        #expect(due)
        let tasks = h.planner.takeDueProbes(now: asked)
        let check = tasks.first { $0.route.id == Self.home.id }
        #expect(check?.connectTimeout == ConnectionPlanner.pathReturnConnectTimeout)
        h.absorb(
            h.planner.record(
                ProbeReport(verdict: .down, latency: 0.25, detail: "timed out"), for: Self.home.id, now: asked + 0.25))
        #expect(h.planner.activeID == Self.tunnel.id, "one failed check is enough")
        // A check that passes changes nothing.
        let standbyDue = h.planner.checkFresh(Self.tunnel.id, now: asked + 0.3)
        #expect(standbyDue)
        _ = h.planner.takeDueProbes(now: asked + 0.3)
        h.absorb(
            h.planner.record(
                ProbeReport(verdict: .ready, latency: 0.02, instanceID: "home"), for: Self.tunnel.id, now: asked + 0.32)
        )
        #expect(h.planner.activeID == Self.tunnel.id)
        #expect(h.planner.routes[Self.tunnel.id]!.freshCheck == false)
    }

    @Test(
        "the check before a tunnel is handed out waits for a resent SYN (2 s): 250 ms is a LAN's SYN, not a phone's way to Cloudflare, and one failed check decides alone"
    )
    func freshCheckOfTunnel() {
        var h = settled { id, _ in id == Self.home.id ? .down : .ready }
        #expect(h.planner.activeID == Self.tunnel.id)
        let asked = h.planner.routes[Self.tunnel.id]!.lastProofAt! + 8
        h.now = asked
        let due = h.planner.checkFresh(Self.tunnel.id, now: asked)
        #expect(due)
        let check = h.planner.takeDueProbes(now: asked).first { $0.route.id == Self.tunnel.id }
        #expect(check != nil)
        #expect(
            check?.connectTimeout == ConnectionPlanner.freshTunnelConnectTimeout,
            "the tunnel's check connects within \(check?.connectTimeout ?? 0) s")
        #expect(ConnectionPlanner.freshTunnelConnectTimeout > 1, "a SYN sent again after 1 s is waited for")
    }

    @Test("a request after an idle time puts the active route back under its close watch at once")
    func useTightens() {
        var h = settled()
        h.run(until: 200)
        let next = h.planner.routes[Self.home.id]!.nextProbeAt
        #expect(next - h.now > 1, "idle: next check \(next - h.now) s away")
        h.planner.noteUse(now: h.now)
        #expect(h.planner.routes[Self.home.id]!.nextProbeAt <= h.now + HealthPolicy().activeInterval)
    }
}
