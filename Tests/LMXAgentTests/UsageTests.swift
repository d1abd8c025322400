import LMXCore
import Synchronization
import Testing

@testable import LMXAgent

/// The manager reads the agent's use (the gateway's traffic, watchers) before it decides: a
/// server busy with our stream is not left, and a route is checked before it is handed out.
extension ManagerTests {
    /// What the gateway would report, set by the test.
    final class Traffic: Sendable {
        let seen = Mutex<[String: (inFlight: Int, heardAgo: Double?)]>([:])
        var witness: UsageWitness {
            UsageWitness(traffic: { self.seen.withLock { $0 } }, watchers: { 0 })
        }
    }

    static func timedOut() -> ProbeReport {
        var report = ProbeReport(verdict: .down, latency: 1.5, detail: "timed out")
        report.timedOut = true
        return report
    }

    @Test(
        "busy, not gone: probes that time out while the gateway streams from the server count nothing; once the stream ends they do"
    )
    func busyServerKept() async throws {
        let rig = try Rig()
        let traffic = Traffic()
        await rig.manager.setUsage(traffic.witness)
        rig.prober.set("https://tunnel.example", Self.ready("studio-1"))
        _ = try await rig.manager.importPairings(try Self.pairing(wall: rig.time.wall))
        #expect(await rig.advance { rig.active != nil } != nil)
        let routeID = try #require(rig.board.snapshot.planner.activeID)
        // A stream in flight on the route, quiet (its prefill); its server's health answers too late.
        traffic.seen.withLock { $0[routeID] = (1, nil) }
        rig.prober.set("https://tunnel.example", Self.timedOut())
        let before = rig.prober.calls("https://tunnel.example")
        _ = await rig.advance(until: { false }, step: 0.25, limit: 10)
        #expect(rig.prober.calls("https://tunnel.example") > before + 5, "still probed while in use")
        #expect(rig.active?.baseURL == "https://tunnel.example", "kept while busy")
        #expect(rig.board.snapshot.planner.routes[routeID]?.busyProbes ?? 0 > 0)
        // The stream ended; the server still does not answer in time: now it is gone.
        traffic.seen.withLock { $0[routeID] = (0, 12) }
        let gone = await rig.advance(until: { rig.active == nil }, step: 0.25, limit: 10)
        #expect(gone != nil, "left once nothing proves it alive")
        await rig.finish()
    }

    @Test(
        "never a dead route handed out: the active route not proved within a second is checked first, and a failed check leaves it"
    )
    func freshBeforeHandedOut() async throws {
        let rig = try Rig()
        rig.prober.set("https://tunnel.example", Self.ready("studio-1"))
        _ = try await rig.manager.importPairings(try Self.pairing(wall: rig.time.wall))
        #expect(await rig.advance { rig.active != nil } != nil)
        // Proven just now: handed out without a check.
        var calls = rig.prober.calls("https://tunnel.example")
        await rig.manager.ensureFreshActive()
        #expect(rig.prober.calls("https://tunnel.example") == calls)
        // Idle a while: the check happens, and passes.
        _ = await rig.advance(until: { false }, step: 0.5, limit: 3)
        calls = rig.prober.calls("https://tunnel.example")
        await rig.manager.ensureFreshActive()
        #expect(rig.prober.calls("https://tunnel.example") == calls + 1)
        #expect(rig.active != nil)
        // The server vanished while nobody looked: one failed check and nothing is handed out.
        _ = await rig.advance(until: { false }, step: 0.5, limit: 3)
        rig.prober.set(
            "https://tunnel.example", ProbeReport(verdict: .down, latency: 0.001, detail: "connection refused"))
        await rig.manager.ensureFreshActive()
        #expect(rig.active == nil, "a dead route handed out: \(String(describing: rig.active))")
        await rig.finish()
    }
}
