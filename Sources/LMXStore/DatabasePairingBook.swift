import LMXCore
import LMXSystem

/// Pairings straight in the agent's database, when the agent is not running: used at its next
/// start.
public struct DatabasePairingBook: PairingBook {
    let store: AgentStore
    public let location: String
    let now: Double

    /// - Parameter now: the time to stamp imports with (seconds since 1970).
    public init(store: AgentStore, path: String, now: Double) {
        self.store = store
        self.location = path
        self.now = now
    }

    public var isLive: Bool { false }

    public func list() throws(PairingBookError) -> [PairingSummary] {
        do { return try store.pairings().map(\.summary) } catch {
            throw .unavailable("cannot read \(location): \(error)")
        }
    }

    public func add(_ upload: PairingUpload, parsed: [Pairing]) throws(PairingBookError) -> [PairingImportResult] {
        do {
            return try store.importPairings(parsed, at: now).map {
                PairingImportResult(pairing: $0.stored.summary, updated: $0.isUpdate)
            }
        } catch {
            throw .unavailable("could not save to \(location): \(error)")
        }
    }

    public func remove(_ idOrName: String) throws(PairingBookError) -> PairingSummary {
        let removed: StoredPairing?
        do { removed = try store.removePairing(idOrName) } catch {
            throw .unavailable("cannot change \(location): \(error)")
        }
        guard let removed else { throw .notFound("no pairing \(idOrName); see lmx-pair list") }
        return removed.summary
    }
}

extension DatabasePairingBook {
    /// The book of the database at `path`, opened (created only when `create`); warnings go to
    /// `warn`.
    public static func open(path: String, create: Bool, now: Double, warn: @escaping @Sendable (String) -> Void)
        throws(PairingBookError) -> any PairingBook
    {
        guard create || FileSystem.exists(path) else { return EmptyPairingBook(location: path) }
        do {
            return DatabasePairingBook(store: try AgentStore.open(path: path, log: warn), path: path, now: now)
        } catch {
            throw .unavailable(
                "cannot open the agent's database \(path): \(error); run as root (sudo) or as the agent's user, or pass --db"
            )
        }
    }

    /// No database yet: nothing listed, nothing to remove.
    public static func empty(path: String) -> any PairingBook { EmptyPairingBook(location: path) }
}

private struct EmptyPairingBook: PairingBook {
    let location: String
    var isLive: Bool { false }
    func list() throws(PairingBookError) -> [PairingSummary] { [] }
    func add(_ upload: PairingUpload, parsed: [Pairing]) throws(PairingBookError) -> [PairingImportResult] {
        throw .unavailable("no database at \(location)")
    }
    func remove(_ idOrName: String) throws(PairingBookError) -> PairingSummary {
        throw .notFound("no pairing \(idOrName); see lmx-pair list")
    }
}
