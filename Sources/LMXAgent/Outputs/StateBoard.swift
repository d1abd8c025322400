import LMXCore
import LMXSystem
import Synchronization

/// Consumes what the manager emits: called on the manager's executor, in order, with the snapshot
/// those events led to (also with no events, when only the state changed), before readers of the
/// board see it. Must return quickly (hand slow work to a task or a queue of its own).
public protocol AgentEventSink: Sendable {
    func receive(_ events: [AgentEvent], snapshot: AgentSnapshot, now: Double)
}

/// The latest snapshot, for readers that must not wait for the manager (the status API, the
/// gateway, the watch hub, systemd's status line), and the agent's clock. Outputs that act on the
/// changes in their own time (the passive-health follower) follow ``updates()``.
public final class StateBoard: Sendable {
    public let clock: AgentClock
    private let current: Mutex<AgentSnapshot>
    private let followers = Mutex<(next: Int, streams: [Int: AsyncStream<Update>.Continuation])>((0, [:]))

    /// What the manager published: the events and the snapshot they led to.
    public struct Update: Sendable {
        public var events: [AgentEvent]
        public var snapshot: AgentSnapshot
    }

    public init(clock: AgentClock = AgentClock(), policy: HealthPolicy = HealthPolicy()) {
        self.clock = clock
        current = Mutex(AgentSnapshot(planner: ConnectionPlanner(policy: policy), originWall: clock.originWall))
    }

    public var snapshot: AgentSnapshot { current.withLock { $0 } }

    public func now() -> Double { clock.now() }

    func publish(_ snapshot: AgentSnapshot, events: [AgentEvent] = []) {
        current.withLock { $0 = snapshot }
        let streams = followers.withLock { Array($0.streams.values) }
        guard !streams.isEmpty else { return }
        let update = Update(events: events, snapshot: snapshot)
        for stream in streams { stream.yield(update) }
    }

    /// Every update from now on, in order (the newest `buffering` kept for a slow reader); ends
    /// when the reader's task is cancelled or it stops iterating.
    public func updates(buffering: Int = 256) -> AsyncStream<Update> {
        let (stream, input) = AsyncStream<Update>.makeStream(bufferingPolicy: .bufferingNewest(buffering))
        let id = followers.withLock { f in
            defer { f.next += 1 }
            f.streams[f.next] = input
            return f.next
        }
        input.onTermination = { [weak self] _ in self?.followers.withLock { _ = $0.streams.removeValue(forKey: id) } }
        return stream
    }
}
