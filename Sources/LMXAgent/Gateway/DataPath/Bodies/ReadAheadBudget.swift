import Synchronization

/// Bytes of request bodies read ahead by all requests together, at most: a flood of slow or large
/// bodies costs at most this much memory, then requests stream at once. Shared fairly: one local
/// user holds at most a quarter of it, so another user's requests still find room.
final class ReadAheadBudget: Sendable {
    private struct State {
        var left: Int
        var byUser: [UInt32: Int] = [:]
    }
    private let state: Mutex<State>
    /// The most one user may hold.
    let perUser: Int

    init(bytes: Int) {
        state = Mutex(State(left: bytes))
        perUser = max(bytes / 4, 1)
    }

    var available: Int { state.withLock { $0.left } }

    /// What one request holds; given back when it is released.
    final class Reservation: Sendable {
        let budget: ReadAheadBudget
        let user: UInt32
        private let held = Mutex(0)

        init(_ budget: ReadAheadBudget, user: UInt32) {
            self.budget = budget
            self.user = user
        }

        /// Takes `bytes` more; false (taking none) when the budget, or this user's share of it,
        /// has no room.
        func take(_ bytes: Int) -> Bool {
            let taken = budget.state.withLock { s in
                let mine = s.byUser[user, default: 0]
                guard s.left >= bytes, mine + bytes <= budget.perUser else { return false }
                s.left -= bytes
                s.byUser[user] = mine + bytes
                return true
            }
            if taken { held.withLock { $0 += bytes } }
            return taken
        }

        /// What it holds of the budget now.
        var bytes: Int { held.withLock { $0 } }

        /// Counts `bytes` more (or, negative, fewer) that are already held: a coalesced body's
        /// room to grow, at most the body's own bytes. They may take the budget past its bound by
        /// that much, and leave less room for what comes next.
        func hold(_ bytes: Int) {
            guard bytes != 0 else { return }
            budget.state.withLock { s in
                s.left -= bytes
                s.byUser[user, default: 0] += bytes
            }
            held.withLock { $0 += bytes }
        }

        deinit {
            let bytes = held.withLock { $0 }
            guard bytes > 0 else { return }
            budget.state.withLock { s in
                s.left += bytes
                let mine = s.byUser[user, default: bytes] - bytes
                s.byUser[user] = mine > 0 ? mine : nil
            }
        }
    }

    /// A reservation for `uid` (nil: a peer the kernel did not name, counted as one user).
    func reservation(for uid: UInt32?) -> Reservation { Reservation(self, user: uid ?? UInt32.max) }
}
