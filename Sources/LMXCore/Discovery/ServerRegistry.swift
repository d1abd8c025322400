/// Merges Avahi's per-interface, per-protocol sightings into servers and turns them into
/// added / updated / removed events. Pure: feed it ``BrowseEvent``s, read ``DiscoveryEvent``s.
public struct ServerRegistry: Sendable {
    private enum Sighting: Sendable {
        case pending
        case resolved(ResolvedRecord)
        case failed
    }

    private struct Entry: Sendable {
        var sightings: [RecordKey: Sighting] = [:]
        /// What consumers were last told about this server, if anything.
        var announced: DiscoveredServer?

        var merged: DiscoveredServer? {
            let records = sightings.values.compactMap { sighting -> ResolvedRecord? in
                if case .resolved(let record) = sighting { return record }
                return nil
            }
            guard let first = records.first else { return nil }
            return DiscoveredServer(id: first.key.instance, records: records)
        }
    }

    private var entries: [ServiceInstanceID: Entry] = [:]

    /// Whether Avahi has reported all-for-now since browsing (re)started.
    public private(set) var allForNow = false
    public private(set) var daemonState: DaemonState?

    public init() {}

    /// Servers announced so far, sorted by instance.
    public var servers: [DiscoveredServer] {
        entries.values.compactMap(\.announced).sorted { $0.id < $1.id }
    }

    /// Sightings still being resolved.
    public var pendingCount: Int {
        entries.values.reduce(0) { count, entry in
            count + entry.sightings.values.filter { if case .pending = $0 { true } else { false } }.count
        }
    }

    /// True once Avahi said all-for-now and every sighting is resolved or failed: a one-shot
    /// listing is complete.
    public var isSettled: Bool { allForNow && pendingCount == 0 }

    public mutating func apply(_ event: BrowseEvent) -> [DiscoveryEvent] {
        switch event {
        case .daemon(let state):
            let previous = daemonState
            daemonState = state
            var events: [DiscoveryEvent] = []
            if state != .running {
                allForNow = false
                if previous == .running || previous == nil { events += dropAll() }
            }
            if previous != state { events.append(.daemon(state)) }
            return events

        case .found(let key):
            var entry = entries[key.instance, default: Entry()]
            if entry.sightings[key] == nil { entry.sightings[key] = .pending }
            entries[key.instance] = entry
            return []

        case .resolved(let record):
            var entry = entries[record.key.instance, default: Entry()]
            entry.sightings[record.key] = .resolved(record)
            return commit(&entry, id: record.key.instance)

        case .resolveFailed(let key, _):
            guard var entry = entries[key.instance], let sighting = entry.sightings[key] else { return [] }
            // A sighting that resolved before keeps its last known data.
            if case .pending = sighting { entry.sightings[key] = .failed }
            return commit(&entry, id: key.instance)

        case .lost(let key):
            guard var entry = entries[key.instance] else { return [] }
            entry.sightings[key] = nil
            return commit(&entry, id: key.instance)

        case .allForNow:
            allForNow = true
            return []
        }
    }

    private mutating func commit(_ entry: inout Entry, id: ServiceInstanceID) -> [DiscoveryEvent] {
        let merged = entry.merged
        var events: [DiscoveryEvent] = []
        switch (entry.announced, merged) {
        case (nil, let new?):
            events.append(.added(new))
        case (let old?, let new?) where old != new:
            let changes = ServerChange.between(old, new)
            if !changes.isEmpty { events.append(.updated(new, changes: changes)) }
        case (let old?, nil):
            events.append(.removed(old, reason: .withdrawn))
        default:
            break
        }
        entry.announced = merged
        entries[id] = entry.sightings.isEmpty ? nil : entry
        return events
    }

    private mutating func dropAll() -> [DiscoveryEvent] {
        let gone = servers
        entries.removeAll()
        return gone.map { .removed($0, reason: .daemonLost) }
    }
}
