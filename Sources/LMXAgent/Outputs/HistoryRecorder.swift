import LMXCore
import LMXStore
import LMXSystem
import ServiceLifecycle
import Synchronization

/// Keeps the history (``HistoryTransition``, ``ProbeFigures``, ``TrafficFigures``) from what the
/// agent already publishes: each snapshot's routes and each probe (``HistoryTracker`` decides
/// what changed), and the gateway's answers (``GatewayTraffic`` hands them over). Nothing here decides or waits: changes of state are
/// queued on the store executor as they happen, the minutes' figures once a minute (``flush(now:)``),
/// and every ten minutes the history is held to its bound (``HistoryRetention``).
public final class HistoryRecorder: AgentEventSink, Service {
    private let store: StoreExecutor
    private let board: StateBoard
    let retention: HistoryRetention

    private struct State {
        var tracker = HistoryTracker()
        var lastTrim = 0.0
    }
    private let state = Mutex(State())

    public init(store: StoreExecutor, board: StateBoard, retention: HistoryRetention = HistoryRetention()) {
        self.store = store
        self.board = board
        self.retention = retention
    }

    public func receive(_ events: [AgentEvent], snapshot: AgentSnapshot, now: Double) {
        let transitions = state.withLock {
            $0.tracker.receive(events, snapshot: snapshot, at: snapshot.originWall + now)
        }
        guard !transitions.isEmpty else { return }
        // In order and not droppable, like the events: a ribbon must not miss a switch.
        store.write("record the routes' history") {
            try $0.appendHistory(transitions: transitions, probes: [], traffic: [], heartbeat: nil)
        }
    }

    /// The gateway answered (see ``HistoryMinutes/answered(model:via:at:status:answered:firstToken:)``).
    func answered(model: String, via: Via, status: Int, answered: Bool, firstToken: Double?) {
        let at = SystemClock.realtime()
        state.withLock {
            $0.tracker.minutes.answered(
                model: model, via: via, at: at, status: status, answered: answered, firstToken: firstToken)
        }
    }

    /// A stream through the gateway ended.
    func streamed(model: String, via: Via, firstToken: Double?, events: Int, seconds: Double) {
        let at = SystemClock.realtime()
        state.withLock {
            $0.tracker.minutes.streamed(
                model: model, via: via, at: at, firstToken: firstToken, events: events, seconds: seconds)
        }
    }

    /// The figures not written yet (the minute under way), for `/v1/history`.
    public func pending() -> (probes: [ProbeFigures], traffic: [TrafficFigures]) {
        state.withLock { $0.tracker.minutes.figures() }
    }

    /// Queues the figures of the minutes that are over (all of them when `final`), with a sign of
    /// life; every ten minutes, the trim that holds the history to its bound.
    public func flush(now: Double, final: Bool = false) {
        let (figures, trim) = state.withLock { s in
            let figures = s.tracker.minutes.take(before: final ? .infinity : History.align(now, 60))
            let trim = now - s.lastTrim >= 600
            if trim { s.lastTrim = now }
            return (figures, trim)
        }
        let retention = retention
        store.write("record the history's figures", droppable: true) {
            try $0.appendHistory(transitions: [], probes: figures.probes, traffic: figures.traffic, heartbeat: now)
        }
        if trim {
            store.write("hold the history to its bound", droppable: true) {
                try $0.trimHistory(now: now, retention: retention)
            }
        }
    }

    public func run() async throws {
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                // A second past each minute: the minute just over is complete.
                let wall = self.board.clock.wall(self.board.now())
                let wait = History.align(wall, 60) + 61 - wall
                try await Task.sleep(for: .milliseconds(Int64(wait * 1000)))
                self.flush(now: self.board.clock.wall(self.board.now()))
            }
        }
        flush(now: board.clock.wall(board.now()), final: true)
        await store.flush(seconds: 2)
    }
}
