import Synchronization

/// Connections open or being opened to each route, counted across every event loop's pool:
/// `gateway.max_connections_per_route` is one cap for the whole gateway. (Shared out among the
/// loops as `max(1, cap / loops)`, a cap below the number of loops was exceeded: 1 became one
/// per loop.) A connection's slot is taken as it is asked for — the count checked against the cap
/// and raised in one step under the lock (``take(_:cap:)``), so loops racing for a route's last
/// slot never open more than the cap together — and given back when it fails to open or closes;
/// each loop's waiters are then told (``UpstreamPool/waitForRoom(_:_:)``).
final class RouteSlots: Sendable {
    private let counts = Mutex<[UpstreamAddress: Int]>([:])
    private let freed = Mutex<(@Sendable (UpstreamAddress) -> Void)?>(nil)

    init() {}

    /// Connections to `address` open or being opened now.
    func count(_ address: UpstreamAddress) -> Int { counts.withLock { $0[address] ?? 0 } }

    /// One more connection to `address` is being opened, if fewer than `cap` are open or being
    /// opened now: false (nothing taken) when the cap is reached.
    func take(_ address: UpstreamAddress, cap: Int) -> Bool {
        counts.withLock { counts in
            let now = counts[address] ?? 0
            guard now < cap else { return false }
            counts[address] = now + 1
            return true
        }
    }

    /// A connection to `address` failed to open or closed: its slot is free.
    func give(_ address: UpstreamAddress) {
        counts.withLock { counts in
            let left = (counts[address] ?? 1) - 1
            counts[address] = left > 0 ? left : nil
        }
        freed.withLock { $0 }?(address)
    }

    /// Told of every slot given back (the data path wakes each loop's waiters for it).
    func onFree(_ tell: @escaping @Sendable (UpstreamAddress) -> Void) {
        freed.withLock { $0 = tell }
    }
}
