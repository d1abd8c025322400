import Foundation
import LMXCore
import LMXProbe
import LMXStore
import LMXSystem
import Logging

@testable import LMXAgent

/// An agent's parts in this process, on a real SQLite file in a fresh directory: a planner
/// state is published to the board by hand, the manager takes the changing requests.
struct AgentFixture {
    let directory: String
    let agent: Agent
    let store: AgentStore
    let prober: Prober

    init(trust: TrustPolicy = .paired) throws {
        directory = NSTemporaryDirectory() + "lmx-agent-unit-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        var configuration = AgentConfiguration()
        configuration.discovery = false
        configuration.policy.trust = trust
        let logger = Logger(label: "test")
        store = try AgentStore.open(path: directory + "/agent.db")
        let executor = StoreExecutor(store: store, logger: logger)
        let board = StateBoard(policy: configuration.policy)
        let hub = WatchHub(board: board, heartbeat: 15, logger: logger)
        let metrics = AgentMetrics()
        prober = try Prober()
        let manager = ConnectionManager(
            configuration: configuration, prober: prober, store: executor, board: board,
            sinks: [EventRecorder(store: executor), metrics, hub], logger: logger)
        agent = Agent(manager: manager, board: board, watch: hub, store: executor, metrics: metrics)
    }

    /// Publishes a state in which `routes` were probed ready (with `models`) and selected.
    /// `oneServer`: every route reaches the same server (instance-0), as a paired server's LAN
    /// route and tunnel do.
    func publish(
        _ routes: [Route], models: [String] = ["alpha"], keyRequired: Bool = false, trust: TrustPolicy = .lan,
        oneServer: Bool = false
    ) {
        var policy = HealthPolicy()
        policy.trust = trust
        var planner = ConnectionPlanner(policy: policy)
        for (index, route) in routes.enumerated() {
            _ = planner.upsert(route, now: 0)
            for step in 1...4 {
                var report = ProbeReport(
                    verdict: .ready, latency: 0.001 * Double(index + 1),
                    instanceID: "instance-\(oneServer ? 0 : index)",
                    version: "1.0",
                    ready: true, modelCount: models.count, inferenceKeyRequired: keyRequired)
                report.models = models
                _ = planner.record(report, for: route.id, now: Double(step))
            }
        }
        _ = planner.tick(now: 100)
        agent.board.publish(
            AgentSnapshot(planner: planner, discovery: .running, originWall: agent.board.clock.originWall))
    }

    static func lan(_ host: String, port: Int = 1234, source: RouteSource = .mdns) -> Route {
        Route(baseURL: "http://\(host):\(port)", via: .lan, source: source, name: host, announced: source == .mdns)
    }

    /// Runs `body` with a fresh fixture, then shuts its HTTP clients and removes its files.
    static func with(trust: TrustPolicy = .paired, _ body: (AgentFixture) async throws -> Void) async throws {
        let fixture = try AgentFixture(trust: trust)
        do {
            try await body(fixture)
        } catch {
            await fixture.close()
            throw error
        }
        await fixture.close()
    }

    func close() async {
        await prober.shutdown()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

extension Data {
    var text: String { String(decoding: self, as: UTF8.self) }
}
