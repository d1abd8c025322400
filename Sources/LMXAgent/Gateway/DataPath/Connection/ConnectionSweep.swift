import NIOCore

/// What the sweep checks: a connection with a time by which it wants to be looked at.
protocol SweptConnection: AnyObject {
    /// When ``sweepDue()`` is next wanted (its client timeout, or the next check of progress).
    var nextCheck: NIODeadline { get }
    /// Called on the loop once `nextCheck` has passed; sets the next one or closes the connection.
    func sweepDue()
}

/// One timer per event loop for its connections' client timeouts, in place of one per connection:
/// every `tick` it asks each connection whose check is due (``SweptConnection``). A connection
/// takes a slot in an array when it opens and gives it back when it closes (no hashing); the
/// timer stops at the first tick that finds none open. A SwiftNIO timer per connection cost a new
/// connection about 5,000 instructions (scheduled, then cancelled at its close, which searches the
/// loop's timers one by one: more with every connection open); checks now come at most one `tick`
/// late.
///
/// Used on its loop only (`@unchecked Sendable`, as the loop's state).
final class ConnectionSweep: @unchecked Sendable {
    let loop: any EventLoop
    let tick: TimeAmount
    private var connections = SlotTable<any SweptConnection>()
    private var timer: Scheduled<Void>?

    /// `timeout`: the client timeout; checks come every eighth of it, at least once a second.
    init(loop: any EventLoop, timeout: TimeAmount) {
        self.loop = loop
        tick = min(.seconds(1), .nanoseconds(max(timeout.nanoseconds / 8, 1_000_000)))
    }

    /// Connections followed.
    var openCount: Int { connections.count }
    /// Slots the table holds (its peak of connections open at once).
    var slotCount: Int { connections.capacity }

    /// Follows `connection` until ``remove(_:)``; returns its slot.
    func add(_ connection: any SweptConnection) -> Int {
        let slot = connections.add(connection)
        if timer == nil { schedule() }
        return slot
    }

    func remove(_ slot: Int) {
        connections.remove(slot)
        // The timer is left to run out (not cancelled: connection after connection would
        // schedule and cancel one each); it is not scheduled again while none is open.
    }

    private func schedule() {
        timer = loop.assumeIsolated().scheduleTask(in: tick) { [self] in
            timer = nil
            sweep()
        }
    }

    /// Asks every connection whose check is due. One that closes gives its slot back at once or
    /// later; either way the rest are still looked at.
    private func sweep() {
        let now = NIODeadline.now()
        var slot = 0
        while slot < connections.capacity {
            if let connection = connections[slot], connection.nextCheck <= now {
                connection.sweepDue()
            }
            slot += 1
        }
        if openCount > 0, timer == nil { schedule() }
    }
}
