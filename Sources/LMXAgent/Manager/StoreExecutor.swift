import Dispatch
import LMXStore
import LMXSystem
import Logging
import Synchronization

/// Runs the store's work off the connection manager: every write is queued and performed, in
/// order, on a serial dispatch queue of its own; reads run beside it, on the store's read connection
/// (not Swift's cooperative pool, which blocking SQLite calls would starve). A database held locked by another process (a backup, `sqlite3`
/// left in a transaction) then delays only the writes: the manager keeps deciding and the socket
/// keeps answering from memory. A write that meets the lock (each try waits SQLite's 5 s busy
/// timeout) is tried again, in order, for up to `lockedRetries` tries (about two minutes) before it
/// is given up and counted; droppable writes are not retried while others wait behind them. The
/// queue is bounded; past the bound the newest droppable writes (probe statistics, sightings)
/// are skipped and counted, never events or pairings.
public final class StoreExecutor: Sendable {
    private let store: AgentStore
    private let queue = DispatchQueue(label: "lmx.store-writer")
    private let logger: Logger
    private struct State {
        var pending = 0
        var droppable = 0
        var dropped = 0
        var failing = false
    }
    private let state = Box(State())
    /// Writes waiting at most; past it droppable ones are skipped.
    let limit: Int
    /// Tries of a write that meets another process's lock (each waits up to 5 s).
    let lockedRetries = 24

    public init(store: AgentStore, logger: Logger, limit: Int = 10_000) {
        self.store = store
        self.logger = logger
        self.limit = limit
    }

    /// The database's file.
    public var path: String { store.path }

    /// Writes waiting to be performed.
    public var pending: Int { state.withLock { $0.pending } }
    /// Droppable writes skipped because the queue was full.
    public var dropped: Int { state.withLock { $0.dropped } }

    /// Queues a write. `droppable`: may be skipped when the queue is full (statistics that the
    /// next probe rewrites anyway).
    public func write(_ what: String, droppable: Bool = false, _ body: @escaping @Sendable (AgentStore) throws -> Void)
    {
        let skip: Bool = state.withLock { s in
            if droppable && s.pending >= limit {
                s.dropped += 1
                return true
            }
            s.pending += 1
            return false
        }
        guard !skip else { return }
        let retries = lockedRetries
        queue.async { [store, logger, state] in
            defer { state.withLock { $0.pending -= 1 } }
            do {
                var attempt = 1
                while true {
                    do {
                        try body(store)
                        break
                    } catch  where AgentStore.isLocked(error) && attempt < retries {
                        // Held by another process: the next writes wait behind this one (order
                        // is kept), unless it is a statistic and others are waiting.
                        if droppable && state.withLock({ $0.pending > 1 }) { throw error }
                        Self.failing(state, logger, what: what, error, path: store.path)
                        attempt += 1
                        SystemClock.sleep(seconds: 0.2)
                    }
                }
                let recovered = state.withLock { s in
                    defer { s.failing = false }
                    return s.failing
                }
                if recovered { logger.notice("the database accepts writes again") }
            } catch {
                state.withLock { $0.dropped += 1 }
                Self.failing(state, logger, what: what, error, path: store.path)
            }
        }
    }

    /// Says that writes fail: one line per episode, not one per write, while the database stays
    /// locked (or broken).
    private static func failing(
        _ state: Box<State>, _ logger: Logger, what: String, _ error: any Error, path: String
    ) {
        let first = state.withLock { s in
            defer { s.failing = true }
            return !s.failing
        }
        guard first else { return }
        if AgentStore.isLocked(error) {
            logger.warning(
                "the database is locked by another process: writes wait and are tried again (probe statistics may be skipped meanwhile)"
            )
        } else {
            logger.warning("could not \(what); carrying on from memory: \(AgentStore.explain(error, path: path))")
        }
    }

    /// Runs `body` after every write queued so far, off the caller's thread, and returns its
    /// result (pairing imports and removals, whose answer depends on the database).
    public func perform<T: Sendable>(_ body: @escaping @Sendable (AgentStore) throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            queue.async { [store] in
                continuation.resume(with: Result { try body(store) })
            }
        }
    }

    /// A read off the caller's thread (it waits for nothing queued: WAL readers do not block).
    public func read<T: Sendable>(_ body: @escaping @Sendable (AgentStore) throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            DispatchQueue.global().async { [store] in
                continuation.resume(with: Result { try body(store) })
            }
        }
    }

    /// Waits until the queued writes are done, at most `seconds` (the daemon is stopping).
    public func flush(seconds: Double) async {
        let done = Box(false)
        queue.async { done.withLock { $0 = true } }
        let deadline = ContinuousClock.now + .milliseconds(Int64(seconds * 1000))
        while !done.withLock({ $0 }), ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(10))
        }
    }
}

/// What the store remembers for the manager's start: read once, through the executor's read
/// connection, before the manager decides anything.
struct Remembered: Sendable {
    var lastGood: String?
    var routes: [StoredRoute] = []
    var stats: [String: ProbeStats] = [:]
    var pairings: [StoredPairing] = []
    var vouches: [StoredVouch] = []
    /// What could not be read, for the log.
    var problems: [String] = []
}

extension StoreExecutor {
    func remembered() async -> Remembered {
        let result = try? await read { store -> Remembered in
            var remembered = Remembered()
            do {
                remembered.stats = try store.stats()
                remembered.lastGood = try store.meta("last_good_route")
                remembered.routes = try store.routes()
                remembered.pairings = try store.pairings()
            } catch {
                remembered.problems.append("could not read the store: \(error)")
            }
            do {
                remembered.vouches = try store.vouches()
            } catch {
                remembered.problems.append("could not read the tunnels' vouched addresses from the store: \(error)")
            }
            return remembered
        }
        return result ?? Remembered(problems: ["could not read the store"])
    }
}

/// A mutex-guarded value that closures can capture.
private final class Box<Value: Sendable>: Sendable {
    private let value: Mutex<Value>
    init(_ initial: Value) { value = Mutex(initial) }
    func withLock<R>(_ body: (inout sending Value) throws -> sending R) rethrows -> sending R {
        try value.withLock(body)
    }
}
