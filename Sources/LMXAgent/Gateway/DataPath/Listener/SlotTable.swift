/// Values kept in the slots of an array: one is added into a free slot (or a new one at the end)
/// and removed by its slot, in constant time, with no hashing. The array's length is the peak of
/// values held at once. (The listening sockets' connections, ``ListenerGate``; the loops'
/// connections, ``ConnectionSweep``.)
struct SlotTable<Element> {
    private var slots: [Element?] = []
    private var free: [Int] = []
    /// Values held.
    private(set) var count = 0

    /// Slots the table has (the peak of values held at once).
    var capacity: Int { slots.count }

    /// Adds `element`; returns its slot.
    mutating func add(_ element: Element) -> Int {
        count += 1
        if let empty = free.popLast() {
            slots[empty] = element
            return empty
        }
        slots.append(element)
        return slots.count - 1
    }

    /// Removes the value in `slot`, if one is there (removing twice does nothing).
    @discardableResult
    mutating func remove(_ slot: Int) -> Element? {
        guard slots.indices.contains(slot), let element = slots[slot] else { return nil }
        slots[slot] = nil
        free.append(slot)
        count -= 1
        return element
    }

    /// The value in `slot`, if any.
    subscript(slot: Int) -> Element? { slots.indices.contains(slot) ? slots[slot] : nil }

    /// The values held, as they are now.
    var elements: [Element] { slots.compactMap { $0 } }
}
