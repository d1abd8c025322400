import LMXCore
import Logging
import ServiceLifecycle
import Synchronization

/// `/v1/watch`: numbers the lines, keeps the recent ones for `?since=`, fans them out to every
/// watcher and writes a heartbeat when nothing happens. A watcher whose buffer is full has stopped
/// reading: its stream ends, so it never slows anyone else. As a service it sends the heartbeats
/// and, at shutdown, ends every stream (listed after the status API, so the HTTP server has no
/// endless answer to wait for).
public final class WatchHub: AgentEventSink, Service {
    private struct State {
        var seq: UInt64 = 0
        var recent: [(seq: UInt64, line: [UInt8])] = []
        var watchers: [UInt64: AsyncStream<[UInt8]>.Continuation] = [:]
        var nextID: UInt64 = 0
        /// The state the numbered lines lead to (a new watcher's snapshot).
        var latest: AgentSnapshot?
    }
    private let state = Mutex(State())
    private let board: StateBoard
    private let logger: Logger
    private let heartbeat: Mutex<Double>
    let recentLimit = 1024
    let watcherBuffer = 4096

    public init(board: StateBoard, heartbeat: Double, logger: Logger) {
        self.board = board
        self.heartbeat = Mutex(heartbeat)
        self.logger = logger
    }

    /// Seconds between heartbeats (`watch_heartbeat`, changed on reload).
    public func setHeartbeat(_ seconds: Double) { heartbeat.withLock { $0 = seconds } }

    public var seq: UInt64 { state.withLock { $0.seq } }
    public var watcherCount: Int { state.withLock { $0.watchers.count } }

    public func receive(_ events: [AgentEvent], snapshot: AgentSnapshot, now: Double) {
        let lines = events.compactMap { $0.watchLine(in: snapshot, now: now) }
        let dropped = state.withLock { s in
            s.latest = snapshot
            return lines.reduce(0) { $0 + Self.number($1, in: &s, keeping: recentLimit) }
        }
        if dropped > 0 { logger.notice("dropped a watch client that stopped reading") }
    }

    /// Numbers a line, keeps it for `?since=` and sends it: the watchers dropped.
    private static func number(_ line: StatusAPI.WatchLine, in s: inout State, keeping limit: Int) -> Int {
        s.seq += 1
        var line = line
        line.seq = s.seq
        let bytes = encode(line)
        s.recent.append((s.seq, bytes))
        if s.recent.count > limit { s.recent.removeFirst(s.recent.count - limit) }
        return send(bytes, to: &s.watchers)
    }

    private static func send(_ bytes: [UInt8], to watchers: inout [UInt64: AsyncStream<[UInt8]>.Continuation]) -> Int {
        var dropped = 0
        for (id, watcher) in watchers {
            if case .dropped = watcher.yield(bytes) {
                watcher.finish()
                watchers[id] = nil
                dropped += 1
            }
        }
        return dropped
    }

    static func encode(_ line: StatusAPI.WatchLine) -> [UInt8] {
        var bytes = (try? StatusAPI.encoder.encode(line)).map { Array($0) } ?? Array(#"{"type":"error"}"#.utf8)
        bytes.append(0x0A)
        return bytes
    }

    /// Subscribes: the lines to send first (the missed lines when `since` is recent enough, else
    /// a snapshot) and the stream of later lines.
    ///
    /// The snapshot (the large part) is built and encoded after the hub's lock is released: the
    /// watcher is registered and the state it stands for captured under the lock, so every line
    /// numbered after it arrives through the stream, and nobody waits on one watcher's snapshot.
    public func watch(since: UInt64?) -> (first: [[UInt8]], stream: AsyncStream<[UInt8]>, id: UInt64) {
        let (stream, continuation) = AsyncStream<[UInt8]>.makeStream(bufferingPolicy: .bufferingOldest(watcherBuffer))
        let now = board.now()
        let (id, missed, seq, latest): (UInt64, [[UInt8]]?, UInt64, AgentSnapshot?) = state.withLock { s in
            s.nextID += 1
            s.watchers[s.nextID] = continuation
            if let since, since <= s.seq, since + 1 >= (s.recent.first?.seq ?? s.seq + 1) || since == s.seq {
                return (s.nextID, s.recent.filter { $0.seq > since }.map(\.line), s.seq, nil)
            }
            return (s.nextID, nil, s.seq, s.latest)
        }
        if let missed { return (missed, stream, id) }
        let snapshot = latest ?? board.snapshot
        let status = snapshot.status(seq: seq, now: now)
        return (
            [Self.encode(StatusAPI.WatchLine(type: .snapshot, seq: seq, at: snapshot.iso(now), status: status))],
            stream, id
        )
    }

    public func unwatch(_ id: UInt64) {
        state.withLock { $0.watchers.removeValue(forKey: id) }?.finish()
    }

    /// Ends every watch stream (the daemon is stopping).
    public func closeAll() {
        let all = state.withLock { s in
            defer { s.watchers.removeAll() }
            return Array(s.watchers.values)
        }
        for watcher in all { watcher.finish() }
    }

    public func run() async throws {
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                try await Task.sleep(for: .milliseconds(Int64(self.heartbeat.withLock { $0 } * 1000)))
                // Nobody watching: no line to make (an idle daemon does as little as it can).
                if self.state.withLock({ $0.watchers.isEmpty }) { continue }
                let at = self.board.snapshot.iso(self.board.now())
                self.state.withLock { s in
                    _ = Self.send(
                        Self.encode(StatusAPI.WatchLine(type: .heartbeat, seq: s.seq, at: at)), to: &s.watchers)
                }
            }
        }
        closeAll()
    }
}
