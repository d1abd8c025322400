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
/// gateway, the watch hub, systemd's status line), and the agent's clock.
public final class StateBoard: Sendable {
    public let clock: AgentClock
    private let current: Mutex<AgentSnapshot>

    public init(clock: AgentClock = AgentClock(), policy: HealthPolicy = HealthPolicy()) {
        self.clock = clock
        current = Mutex(AgentSnapshot(planner: ConnectionPlanner(policy: policy), originWall: clock.originWall))
    }

    public var snapshot: AgentSnapshot { current.withLock { $0 } }

    public func now() -> Double { clock.now() }

    func publish(_ snapshot: AgentSnapshot) {
        current.withLock { $0 = snapshot }
    }
}
