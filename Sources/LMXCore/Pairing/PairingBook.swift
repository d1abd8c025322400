/// Where pairings are kept, seen from a command: through the running agent (which probes them
/// at once), or straight in its database (used at its next start). `lmx-pair` says once which.
public protocol PairingBook {
    /// Where the pairings go, for messages ("lmx-agentd", or the database's path).
    var location: String { get }
    /// The agent probes what it is given, so verdicts can be awaited.
    var isLive: Bool { get }
    func list() throws(PairingBookError) -> [PairingSummary]
    /// Adds or updates pairings, all or nothing: the agent is sent the payloads (it validates
    /// them again), the database gets the parsed pairings.
    func add(_ upload: PairingUpload, parsed: [Pairing]) throws(PairingBookError) -> [PairingImportResult]
    /// Removes a pairing by id, or by a name only one pairing has.
    func remove(_ idOrName: String) throws(PairingBookError) -> PairingSummary
}

public enum PairingBookError: Error, Sendable, CustomStringConvertible {
    /// The agent is not running (a book through the agent only): use the database.
    case agentNotRunning(String)
    case notFound(String)
    /// Refused as invalid (a pairing the agent will not take).
    case invalid(String)
    /// The agent or database cannot be used (permissions, a locked or broken database).
    case unavailable(String)

    public var description: String {
        switch self {
        case .agentNotRunning(let m), .notFound(let m), .invalid(let m), .unavailable(let m): m
        }
    }

    /// sysexits: 65 no such or no valid pairing, 69 agent or database unavailable.
    public var exitCode: Int32 {
        switch self {
        case .notFound, .invalid: ExitStatus.invalidInput.rawValue
        case .agentNotRunning, .unavailable: ExitStatus.unavailable.rawValue
        }
    }
}

/// The agent when it runs, else the database: decided at the first operation, then kept.
public final class FallbackPairingBook: PairingBook {
    private let primary: any PairingBook
    private let openFallback: () throws(PairingBookError) -> any PairingBook
    private var chosen: (any PairingBook)?

    public init(primary: any PairingBook, fallback: @escaping () throws(PairingBookError) -> any PairingBook) {
        self.primary = primary
        self.openFallback = fallback
    }

    public var location: String { (chosen ?? primary).location }
    public var isLive: Bool { (chosen ?? primary).isLive }

    private func run<T>(_ body: (any PairingBook) throws(PairingBookError) -> T) throws(PairingBookError) -> T {
        if let chosen { return try body(chosen) }
        do {
            let result = try body(primary)
            chosen = primary
            return result
        } catch .agentNotRunning {
            let fallback = try openFallback()
            chosen = fallback
            return try body(fallback)
        }
    }

    public func list() throws(PairingBookError) -> [PairingSummary] {
        try run { book throws(PairingBookError) in try book.list() }
    }

    public func add(_ upload: PairingUpload, parsed: [Pairing]) throws(PairingBookError) -> [PairingImportResult] {
        try run { book throws(PairingBookError) in try book.add(upload, parsed: parsed) }
    }

    public func remove(_ idOrName: String) throws(PairingBookError) -> PairingSummary {
        try run { book throws(PairingBookError) in try book.remove(idOrName) }
    }
}
