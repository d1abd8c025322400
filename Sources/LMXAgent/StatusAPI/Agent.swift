import LMXCore
import LMXStore

/// What the status API and the gateway reach: the manager for changes, the board for reading
/// (no wait on the manager), the watch hub, the store for history, metrics.
public struct Agent: Sendable {
    public let manager: ConnectionManager
    public let board: StateBoard
    public let watch: WatchHub
    public let store: StoreExecutor
    public let metrics: AgentMetrics
    /// What went through the gateway, per model.
    public let traffic: GatewayTraffic
    /// The history's recorder (nil in tests that keep none): its minute under way is part of
    /// `/v1/history`'s answer.
    public let recorder: HistoryRecorder?
    /// Large answers being built per user, on the status socket and the dashboard together.
    let largeAnswers = LargeAnswerGate(perUser: 4)

    public init(
        manager: ConnectionManager, board: StateBoard, watch: WatchHub, store: StoreExecutor, metrics: AgentMetrics,
        traffic: GatewayTraffic? = nil, history: HistoryRecorder? = nil
    ) {
        self.traffic = traffic ?? GatewayTraffic(metrics: metrics, history: history)
        self.recorder = history
        self.manager = manager
        self.board = board
        self.watch = watch
        self.store = store
        self.metrics = metrics
    }

    /// `/metrics`: states sampled now (the pairings' expiry read from the store), then every counter.
    public func metricsText() async -> String {
        if let stored = try? await store.read({ try $0.pairings() }) {
            metrics.setPairingExpiries(
                stored.compactMap { entry in
                    entry.pairing.expiresAt.map { (entry.pairing.name ?? entry.pairing.id, Double($0)) }
                })
        }
        return metrics.render(board.snapshot, store: store, watchers: watch.watcherCount)
    }

    /// Every pairing with what the agent knows of its routes (no secrets).
    /// The latest events of the history (oldest first), each with its sentence; none when the
    /// database cannot be read.
    public func events(limit: Int) async -> [StatusAPI.Event] {
        let events = (try? await store.read { try $0.recentEvents(limit: limit) }) ?? []
        let snapshot = board.snapshot
        return events.map(snapshot.told)
    }

    /// `/v1/history`: the window's rows read off the caller's thread, with the minute under way
    /// (not written yet), made into the answer.
    public func history(_ query: History.Query) async throws -> StatusAPI.History {
        let rows: (transitions: [HistoryTransition], probes: [ProbeFigures], traffic: [TrafficFigures])
        do {
            rows = try await store.read { try $0.historyRows(since: query.since, until: query.until) }
        } catch {
            throw HistoryReadError(description: AgentStore.explain(error, path: store.path))
        }
        let pending = recorder?.pending() ?? (probes: [], traffic: [])
        return History.build(
            query, transitions: rows.transitions, probes: rows.probes + pending.probes,
            traffic: rows.traffic + pending.traffic)
    }

    public func pairingSummaries() async throws -> [PairingSummary] {
        let stored = try await store.read { try $0.pairings() }
        let snapshot = board.snapshot
        return stored.map { snapshot.summary(of: $0.pairing, stored: $0.summary) }
    }
}

/// The history could not be read: the sentence says why and what to do.
public struct HistoryReadError: Error, CustomStringConvertible {
    public var description: String
}
