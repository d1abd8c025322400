import LMXCore
import LMXProbe
import ServiceLifecycle
import Synchronization

/// Passive health: follows the active server's `/admin/events` when its admin key is known.
/// Model and readiness events reach the manager at once, and silence where a heartbeat was due
/// counts as a failed probe. Reconnects with backoff; each connection starts with a full probe
/// (snapshot), then follows the diffs. When the active route changes, the old stream is left.
/// What to follow is read from the board's updates: the follower needs nothing from the manager
/// but its inputs, and can be made before or after it starts.
public final class PassiveHealthFollower: Service {
    let manager: ConnectionManager
    let prober: Prober
    let board: StateBoard
    private let wanted: AsyncStream<Route?>
    private let wantedInput: AsyncStream<Route?>.Continuation
    private let following = Mutex<Route?>(nil)

    public init(manager: ConnectionManager, prober: Prober, board: StateBoard) {
        self.manager = manager
        self.prober = prober
        self.board = board
        (wanted, wantedInput) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    /// Turns the board's updates into the route to follow (nil: none).
    private func watchBoard() async {
        for await update in board.updates() { receive(update.events) }
        wantedInput.finish()
    }

    func receive(_ events: [AgentEvent]) {
        for event in events {
            switch event {
            case .activeChanged(_, let to, _, _):
                let route = to.flatMap { $0.route.credentials.adminKey == nil ? nil : $0.route }
                let changed = following.withLock { current in
                    defer { current = route }
                    return current?.id != route?.id
                }
                if changed { wantedInput.yield(route) }
            case .machine:
                // The stream may be bound to an address that is gone, or have died in a sleep:
                // open it again.
                if let route = following.withLock({ $0 }) { wantedInput.yield(route) }
            default:
                break
            }
        }
    }

    public func run() async throws {
        await withGracefulShutdownHandler {
            await withDiscardingTaskGroup { group in
                group.addTask { await self.watchBoard() }
                var stopPrevious: AsyncStream<Void>.Continuation?
                for await route in wanted {
                    stopPrevious?.finish()
                    guard let route else { continue }
                    let (stop, stopInput) = AsyncStream<Void>.makeStream()
                    stopPrevious = stopInput
                    group.addTask {
                        // Follows until superseded (its stop stream ends) or the group is cancelled.
                        await withTaskGroup(of: Void.self) { inner in
                            inner.addTask { await self.follow(route) }
                            inner.addTask { for await _ in stop {} }
                            await inner.next()
                            inner.cancelAll()
                        }
                    }
                }
                stopPrevious?.finish()
                group.cancelAll()
            }
        } onGracefulShutdown: { [wantedInput] in
            wantedInput.finish()
        }
    }

    private func follow(_ route: Route) async {
        var backoff = 1.0
        var delivers = false
        while !Task.isCancelled {
            let policy = board.snapshot.planner.policy
            let heard = Atomic<Bool>(false)
            let end = await prober.followEvents(
                route, silence: policy.eventHeartbeatTimeout, connectTimeout: policy.timeout(for: route.via)
            ) { [manager] event in
                heard.store(true, ordering: .relaxed)
                await manager.serverEvent(event, routeID: route.id)
            }
            guard !Task.isCancelled else { return }
            delivers = delivers || heard.load(ordering: .relaxed)
            if case .silent = end, !delivers {
                // Not even a first heartbeat: the path buffers server-sent events (a Cloudflare
                // quick tunnel does). Silence there says nothing of the server: probes alone
                // watch this route until another one is active.
                await manager.eventStreamNeverDelivered(routeID: route.id)
                return
            }
            let pause = await manager.eventStreamEnded(end, routeID: route.id, backoff: backoff)
            try? await Task.sleep(for: .milliseconds(Int64(pause * 1000)))
            backoff = min(backoff * 2, 30)
        }
    }
}
