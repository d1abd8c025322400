import Foundation
import LMXCore
import LMXStore
import LMXSystem
import Logging
import Synchronization
import Testing

@testable import LMXAgent

/// `ConnectionManager.run()` in process: scripted probe verdicts, a manual clock that moves only
/// when the test says, a real SQLite file. No root, no network, milliseconds per test.
@Suite("The connection manager in process (scripted probes, a manual clock)")
struct ManagerTests {
    /// Verdicts by base URL (down for any other), and the probes asked for.
    final class ScriptedProber: RouteProber {
        private let state = Mutex<(verdicts: [String: ProbeReport], calls: [String: Int])>(([:], [:]))

        func set(_ url: String, _ report: ProbeReport) { state.withLock { $0.verdicts[url] = report } }
        func calls(_ url: String) -> Int { state.withLock { $0.calls[url] ?? 0 } }

        func probe(_ route: Route, timeout: Double, full: Bool) async -> ProbeReport {
            state.withLock { s in
                s.calls[route.baseURL, default: 0] += 1
                return s.verdicts[route.baseURL] ?? ProbeReport(verdict: .down, latency: 0.001, detail: "connection refused")
            }
        }
    }

    static func ready(_ instance: String) -> ProbeReport {
        ProbeReport(verdict: .ready, latency: 0.004, instanceID: instance, version: "1.0", ready: true, modelCount: 1)
    }

    /// A manager with its parts, running.
    struct Rig {
        let manager: ConnectionManager
        let board: StateBoard
        let time: ManualTime
        let prober: ScriptedProber
        let directory: String
        let run: Task<Void, Never>

        init() throws {
            directory = NSTemporaryDirectory() + "lmx-manager-\(UUID().uuidString.prefix(8))"
            var configuration = AgentConfiguration()
            configuration.discovery = false
            let logger = Logger(label: "test")
            let store = try AgentStore.open(path: directory + "/agent.db")
            time = ManualTime()
            board = StateBoard(clock: AgentClock(manual: time), policy: configuration.policy)
            prober = ScriptedProber()
            manager = ConnectionManager(
                configuration: configuration, prober: prober, store: StoreExecutor(store: store, logger: logger), board: board,
                sinks: [], logger: logger)
            let manager = manager
            run = Task { await manager.run() }
        }

        var active: StatusAPI.Active? { board.snapshot.activeEndpoint(now: board.now()) }

        /// Moves the clock in `step`s, letting the manager handle each, until `done` holds: the
        /// clock's seconds it took, or nil past `limit`.
        func advance(until done: () -> Bool, step: Double = 0.05, limit: Double = 30) async -> Double? {
            let start = time.now
            while time.now - start <= limit {
                try? await Task.sleep(for: .milliseconds(1))
                if done() { return time.now - start }
                time.advance(by: step)
            }
            return nil
        }

        func finish() async {
            await manager.stop()
            _ = await run.value
            try? FileManager.default.removeItem(atPath: directory)
        }
    }

    static func pairing(_ extra: String = "", wall: Double) throws -> [Pairing] {
        try PairingParser(now: Int64(wall)).parse("opta-lmx://pair?v=1&name=Studio&url=https%3A%2F%2Ftunnel.example&instance=studio-1" + extra)
    }

    @Test("a pairing imported is probed and becomes the active endpoint, on the manual clock")
    func pairingBecomesActive() async throws {
        let rig = try Rig()
        rig.prober.set("https://tunnel.example", Self.ready("studio-1"))
        let imported = try await rig.manager.importPairings(try Self.pairing(wall: rig.time.wall))
        #expect(imported.count == 1)
        let took = await rig.advance { rig.active != nil }
        #expect(took != nil, "never active")
        #expect(rig.active?.via == .wan && rig.active?.baseURL == "https://tunnel.example")
        #expect(rig.prober.calls("https://tunnel.example") >= 1)
        await rig.finish()
    }

    @Test("an expiring pairing's routes leave at its expiry, read on the wall clock")
    func expiryOnTheWallClock() async throws {
        let rig = try Rig()
        rig.prober.set("https://tunnel.example", Self.ready("studio-1"))
        let expires = Int(rig.time.wall) + 30
        _ = try await rig.manager.importPairings(try Self.pairing("&exp=\(expires)", wall: rig.time.wall))
        #expect(await rig.advance { rig.active != nil } != nil)
        // Still there just before; gone within a step of the date.
        _ = await rig.advance(until: { false }, step: 1, limit: 25)
        #expect(rig.board.snapshot.planner.routes.count == 1)
        let gone = await rig.advance(until: { rig.board.snapshot.planner.routes.isEmpty }, step: 0.5, limit: 10)
        #expect(gone != nil, "the expired pairing's route stayed")
        #expect(rig.active == nil)
        await rig.finish()
    }

    @Test("expiry follows the real-time clock: a correction past the date removes the routes at the next look")
    func expiryFollowsCorrections() async throws {
        let rig = try Rig()
        rig.prober.set("https://tunnel.example", Self.ready("studio-1"))
        let expires = Int(rig.time.wall) + 3_600
        _ = try await rig.manager.importPairings(try Self.pairing("&exp=\(expires)", wall: rig.time.wall))
        #expect(await rig.advance { rig.active != nil } != nil)
        // NTP moves the real-time clock two hours on; the monotonic clock barely moves.
        rig.time.setWall(rig.time.wall + 7_200)
        await rig.manager.refresh()
        let gone = await rig.advance(until: { rig.board.snapshot.planner.routes.isEmpty }, step: 0.01, limit: 1)
        #expect(gone != nil, "a pairing past its date on the wall clock kept its route")
        await rig.finish()
    }

    @Test("a wake makes every verdict stale: each route is probed again before it is trusted")
    func wakeReprobes() async throws {
        let rig = try Rig()
        rig.prober.set("https://tunnel.example", Self.ready("studio-1"))
        _ = try await rig.manager.importPairings(try Self.pairing(wall: rig.time.wall))
        #expect(await rig.advance { rig.active != nil } != nil)
        // Settled into the standby schedule: no probe for a while.
        _ = await rig.advance(until: { false }, step: 0.5, limit: 5)
        let before = rig.prober.calls("https://tunnel.example")
        await rig.manager.woke("test")
        let reprobed = await rig.advance(until: { rig.prober.calls("https://tunnel.example") > before }, step: 0.01, limit: 2)
        #expect(reprobed != nil && reprobed! < 0.5, "probed again \(reprobed.map { "\($0) s" } ?? "never") after the wake")
        #expect(rig.active != nil)
        await rig.finish()
    }
}
