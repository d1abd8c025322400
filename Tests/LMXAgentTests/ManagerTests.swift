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

        func probe(_ route: Route, timeout: Double, full: Bool, connectTimeout: Double?, checkAPI: Bool) async
            -> ProbeReport
        {
            state.withLock { s in
                s.calls[route.baseURL, default: 0] += 1
                return s.verdicts[route.baseURL]
                    ?? ProbeReport(verdict: .down, latency: 0.001, detail: "connection refused")
            }
        }

        /// Whether the servers' hosts accept connections (busy, not gone); a test sets it.
        let accepting = Atomic<Bool>(true)
        func connects(_ route: Route, timeout: Double) async -> Bool { accepting.load(ordering: .relaxed) }
    }

    /// Paths by address, set by the test: what the kernel's routing table would say.
    final class TablePaths: PathLookup {
        private let table = Mutex<[String: LocalPath]>([:])

        func set(_ host: String, _ path: LocalPath?) { table.withLock { $0[host] = path } }

        func network() -> MachineNetwork {
            MachineNetwork(usable: Set(table.withLock { $0.map { "\($0.value.interface) \($0.value.source)" } }))
        }

        func path(to host: String, in network: MachineNetwork) -> Result<LocalPath, SystemError> {
            // The state handed over, not the table now: what the manager was told is what counts.
            guard let path = table.withLock({ $0[host] }), network.usable.contains("\(path.interface) \(path.source)")
            else {
                return .failure(SystemError("no route to \(host)", code: 101))
            }
            return .success(path)
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
        let paths: TablePaths
        let directory: String
        let run: Task<Void, Never>

        init(_ configure: (inout AgentConfiguration) -> Void = { _ in }) throws {
            directory = NSTemporaryDirectory() + "lmx-manager-\(UUID().uuidString.prefix(8))"
            var configuration = AgentConfiguration()
            configuration.discovery = false
            configure(&configuration)
            let logger = Logger(label: "test")
            let store = try AgentStore.open(path: directory + "/agent.db")
            time = ManualTime()
            board = StateBoard(clock: AgentClock(manual: time), policy: configuration.policy)
            prober = ScriptedProber()
            paths = TablePaths()
            manager = ConnectionManager(
                configuration: configuration, prober: prober, paths: paths,
                store: StoreExecutor(store: store, logger: logger),
                board: board, sinks: [], logger: logger)
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
        try PairingParser(now: Int64(wall)).parse(
            "opta-lmx://pair?v=1&name=Studio&url=https%3A%2F%2Ftunnel.example&instance=studio-1" + extra)
    }

    @Test("durations read as seconds, from a nanosecond to a day")
    func durationSeconds() {
        #expect(Duration.seconds(1).seconds == 1)
        #expect(Duration.milliseconds(250).seconds == 0.25)
        #expect(Duration.seconds(86_400).seconds == 86_400)
        #expect(Duration.zero.seconds == 0 && Duration.milliseconds(-1500).seconds == -1.5)
        for (duration, expected) in [
            (Duration.nanoseconds(1), 1e-9), (.microseconds(77), 77e-6), (.nanoseconds(123_456_789), 0.123456789),
            (.seconds(3600) + .nanoseconds(1), 3600.000000001),
        ] {
            #expect(abs(duration.seconds - expected) <= expected * 1e-15, "\(duration)")
        }
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
        let reprobed = await rig.advance(
            until: { rig.prober.calls("https://tunnel.example") > before }, step: 0.01, limit: 2)
        #expect(
            reprobed != nil && reprobed! < 0.5, "probed again \(reprobed.map { "\($0) s" } ?? "never") after the wake")
        #expect(rig.active != nil)
        await rig.finish()
    }

    /// An mDNS sighting of server `name` at `address`.
    static func announced(_ name: String, _ address: String, port: UInt16 = 1234) -> DiscoveredServer {
        let id = ServiceInstanceID(name: name, type: "_opta-lmx._tcp", domain: "local")
        let key = RecordKey(instance: id, interface: NetworkInterface(index: 2, name: "lan0"), ipProtocol: .ipv4)
        return DiscoveredServer(
            id: id,
            records: [
                ResolvedRecord(
                    key: key, hostName: "\(name).local", address: address, port: port, txt: TXTRecord(strings: []))
            ])
    }

    @Test("a reload that changes lan_keys re-keys the pairings' LAN routes")
    func reloadRekeysLANRoutes() async throws {
        let rig = try Rig()
        let pairing = try Self.pairing("&key=admin-secret&lan=10.0.0.5:1234", wall: rig.time.wall)
        _ = try await rig.manager.importPairings(pairing)
        func lanKey() -> String?? {
            rig.board.snapshot.planner.routes.values.first { $0.route.via == .lan }.map {
                $0.route.credentials.adminKey
            }
        }
        #expect(lanKey() == .some("admin-secret"), "the paired LAN address gets the server's keys by default")
        var never = AgentConfiguration()
        never.discovery = false
        never.policy.lanKeys = .never
        await rig.manager.reload(never)
        #expect(lanKey() == .some(nil), "lan_keys: never keeps the keys off the LAN route")
        var vouched = never
        vouched.policy.lanKeys = .vouched
        await rig.manager.reload(vouched)
        #expect(lanKey() == .some("admin-secret"))
        await rig.finish()
    }

    @Test(
        "a network change handed over as a delta: a LAN route this machine left is out at once, and back when the path is"
    )
    func networkDelta() async throws {
        let rig = try Rig()
        let path = LocalPath(interface: "lan0", source: "10.0.0.2", onLink: true, running: true)
        rig.paths.set("10.0.0.7", path)
        rig.prober.set("http://10.0.0.7:1234", Self.ready("studio-1"))
        await rig.manager.discovery(.added(Self.announced("Studio", "10.0.0.7")))
        #expect(await rig.advance { rig.active?.via == .lan } != nil, "the announced server never became active")
        let before = rig.paths.network()
        rig.paths.set("10.0.0.7", nil)
        let relevant = await rig.manager.networkChanged(
            NetworkChange(old: before, new: rig.paths.network(), linkOrAddressUp: false))
        #expect(relevant)
        #expect(rig.active == nil, "the route stayed active after this machine left its network")
        // Back on the network: the first good probe brings it back.
        let away = rig.paths.network()
        rig.paths.set("10.0.0.7", path)
        await rig.manager.networkChanged(NetworkChange(old: away, new: rig.paths.network(), linkOrAddressUp: true))
        let back = await rig.advance(until: { rig.active?.via == .lan }, step: 0.01, limit: 5)
        #expect(back != nil && back! <= 1, "home again after \(back.map { "\($0) s" } ?? "never")")
        // Nothing the agent uses changed: not relevant.
        let same = rig.paths.network()
        #expect(await rig.manager.networkChanged(NetworkChange(old: same, new: same, linkOrAddressUp: false)) == false)
        await rig.finish()
    }

    @Test(
        "churn is bounded: servers announced and withdrawn past the bound leave at most the bound's routes, the newest kept"
    )
    func churnBounded() async throws {
        // The bound lowered from 2,048 to 64: the same code, eight times past it, in milliseconds.
        let rig = try Rig { $0.policy.maxFoundRoutes = 64 }
        for n in 0..<512 {
            let address = "10.1.\(n / 250).\(n % 250 + 1)"
            let server = Self.announced("churn-\(n)", address)
            await rig.manager.discovery(.added(server))
            await rig.manager.discovery(.removed(server, reason: .withdrawn))
        }
        let routes = rig.board.snapshot.planner.routes.count
        #expect(routes <= 64, "\(routes) routes kept")
        #expect(routes >= 56, "the bound forgot more than it needed to: \(routes)")
        #expect(
            rig.board.snapshot.planner.routes["lan/10.1.2.12:1234"] != nil, "the newest withdrawn server was forgotten")
        #expect(rig.board.snapshot.planner.routes["lan/10.1.0.1:1234"] == nil, "the oldest withdrawn server was kept")
        await rig.finish()
    }
}
