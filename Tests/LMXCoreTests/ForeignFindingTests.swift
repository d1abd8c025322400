import Testing

@testable import LMXCore

/// A page that is not the server's (a login page, a tunnel's error page, a portal) found by the
/// gateway on a route whose health paths still answer: the finding decides at once and stands
/// until the server answers its API itself.
@Suite("Foreign findings: a login page marks the route until the server answers its API")
struct ForeignFindingTests {
    static let lanID = "lan/10.0.0.1:1234"
    static let wanID = "wan/https://t.example.com"

    @Test("one login page takes the tunnel at once; health paths that still answer do not bring it back")
    func loginPageSticks() {
        var h = PlannerHarness { _, _ in .ready }
        // Its API is behind the login page until t = 30 (a new Access token).
        h.apiAnswered = { _, t in t >= 30 }
        h.add(wan("https://t.example.com"))
        h.run(until: 5)
        #expect(h.planner.activeID == Self.wanID)
        h.absorb(h.planner.recordForeign(.accessLogin, for: Self.wanID, now: h.now))
        let marked = h.planner.routes[Self.wanID]!
        #expect(marked.health == .down && marked.verdict == .authRejected)
        #expect(marked.lastReport?.cause == .loginPage)
        #expect(h.planner.activeID == nil, "the only route is not handed out while a login page answers for it")
        // Its health paths answer for the next 20 s: every probe asks the API, and the route stays
        // marked with the page's cause.
        h.run(until: 25)
        let still = h.planner.routes[Self.wanID]!
        #expect(still.health == .down && still.verdict == .authRejected && still.foreign == .accessLogin)
        #expect(still.lastReport?.cause == .loginPage && still.lastReport?.detail?.contains("login page") == true)
        #expect((h.apiChecks[Self.wanID] ?? 0) >= 3, "its probes asked /v1/models: \(h.apiChecks)")
        #expect(h.planner.activeID == nil)
        // The server answers its API again: the finding clears, the route comes back through
        // the usual hysteresis, and its probes stop asking.
        h.run(until: 45)
        let back = h.planner.routes[Self.wanID]!
        #expect(back.foreign == nil && back.health == .up && back.verdict == .ready)
        #expect(h.planner.activeID == Self.wanID)
        let asked = h.apiChecks[Self.wanID] ?? 0
        h.run(until: 120)
        #expect(h.apiChecks[Self.wanID] == asked, "no API question once the server answered it")
    }

    @Test("a captive portal on the LAN route sends clients to the tunnel, and the LAN returns once the server answers")
    func portalFailsOver() {
        var h = PlannerHarness { _, _ in .ready }
        h.apiAnswered = { id, t in id != Self.lanID || t >= 20 }
        h.add(wan("https://t.example.com"))
        h.add(lan("10.0.0.1"))
        h.run(until: 5)
        #expect(h.planner.activeID == Self.lanID)
        h.absorb(h.planner.recordForeign(.captivePortal(status: 200), for: Self.lanID, now: h.now))
        #expect(h.planner.activeID == Self.wanID)
        #expect(h.switchCauses.last == .captivePortal)
        h.run(until: 15)
        #expect(h.planner.activeID == Self.wanID)
        #expect(h.planner.routes[Self.lanID]?.lastReport?.cause == .captivePortal)
        h.run(until: 60)
        #expect(h.planner.activeID == Self.lanID, "back on the LAN once its server answers its API")
    }

    @Test("a probe in flight when the page is found is judged with the finding")
    func probeInFlightJudged() {
        var planner = ConnectionPlanner(policy: HealthPolicy())
        planner.setWatchers(1, now: 0)
        _ = planner.upsert(wan("https://t.example.com"), now: 0)
        for task in planner.takeDueProbes(now: 0) {
            _ = planner.record(ProbeReport(verdict: .ready, latency: 0.01), for: task.route.id, full: task.full, now: 0)
        }
        #expect(planner.activeID == Self.wanID)
        let tasks = planner.takeDueProbes(now: 100)
        #expect(tasks.count == 1 && tasks[0].checkAPI == false)
        _ = planner.recordForeign(.tunnelErrorPage(status: 530), for: Self.wanID, now: 100.1)
        #expect(planner.routes[Self.wanID]?.inFlight == true, "the gateway's finding leaves the probe running")
        // The probe started before the finding: its health paths answered, it did not ask the API.
        _ = planner.record(ProbeReport(verdict: .ready, latency: 0.01), for: Self.wanID, full: false, now: 100.2)
        let state = planner.routes[Self.wanID]!
        #expect(state.health == .down && state.verdict == .tunnelDown && state.lastReport?.cause == .edgeError)
        let next = planner.takeDueProbes(now: 200)
        #expect(next.count == 1 && next[0].checkAPI && next[0].requests == (next[0].full ? 4 : 2))
    }
}
