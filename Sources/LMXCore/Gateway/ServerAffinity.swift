/// Objects that live on one server only (`../shared/CONTRACT.md` §8): an agent run, a RAG
/// collection, a stored response. A request naming one must reach the server that made it, by
/// whichever route reaches that server now (LAN or tunnel); another server would answer a 404
/// that looks like "no such run". The gateway learns each object's server from the request or the
/// answer that made it (``ServerAffinity``) and keeps it in a bounded table (``AffinityTable``).
public enum ServerObject: Sendable, Hashable, CustomStringConvertible {
    case agentRun(String)
    case ragCollection(String)
    case response(String)

    public var description: String {
        switch self {
        case .agentRun(let id): "agent run \(id)"
        case .ragCollection(let name): "RAG collection \(name)"
        case .response(let id): "response \(id)"
        }
    }
}

/// Which requests name or make an object that lives on one server.
public enum ServerAffinity {
    /// Ids and names longer than this, or with other characters than these, are not objects the
    /// gateway follows (the request goes where any other would).
    public static let maxIdentifierLength = 256

    /// Whether any of ``named(method:path:body:)``, ``madeByRequest(method:path:body:)`` and
    /// ``answerMakes(method:path:)`` can hold for `path`: false (most requests: chat completions,
    /// models) when it has none of their segments' names anywhere, found in one pass over its
    /// bytes (the checks then need no body).
    public static func mayConcern(path: String) -> Bool {
        var path = path
        return path.withUTF8 { bytes in
            for index in bytes.indices {
                switch bytes[index] {
                case UInt8(ascii: "a"):
                    if word(bytes, at: index, "agents") { return true }
                case UInt8(ascii: "r"):
                    if word(bytes, at: index, "rag") || word(bytes, at: index, "responses")
                        || word(bytes, at: index, "runs")
                    {
                        return true
                    }
                case UInt8(ascii: "i"):
                    if word(bytes, at: index, "ingest") { return true }
                default:
                    break
                }
            }
            return false
        }
    }

    /// `word` is at `index` in `bytes`.
    private static func word(_ bytes: UnsafeBufferPointer<UInt8>, at index: Int, _ word: StaticString) -> Bool {
        word.withUTF8Buffer { word in
            guard bytes.count - index >= word.count else { return false }
            for offset in 0..<word.count where bytes[index + offset] != word[offset] { return false }
            return true
        }
    }

    /// The object a request names, which only the server that made it has: from the path (runs,
    /// collections) or the start of the JSON body (`collection`, `previous_response_id`).
    public static func named(method: String, path: String, body: [UInt8]) -> ServerObject? {
        // Every path below has one of these segments: most requests (chat completions, models)
        // are answered here without splitting the path.
        guard path.containsBytes("agents") || path.containsBytes("rag") || path.containsBytes("responses") else {
            return nil
        }
        let parts = segments(path)
        // /v1/agents/runs/{id}, …/events, …/cancel
        if parts.count >= 4, parts[0] == "v1", parts[1] == "agents", parts[2] == "runs" {
            return identifier(parts[3]).map(ServerObject.agentRun)
        }
        // /v1/rag/collections/{name}[/…]
        if parts.count >= 4, parts[0] == "v1", parts[1] == "rag", parts[2] == "collections" {
            return identifier(parts[3]).map(ServerObject.ragCollection)
        }
        guard method == "POST" else { return nil }
        if parts == ["v1", "rag", "query"] || parts == ["v1", "rag", "context"] {
            return ModelField.string(named: "collection", in: body).flatMap(identifier).map(ServerObject.ragCollection)
        }
        if parts == ["v1", "responses"] {
            return ModelField.string(named: "previous_response_id", in: body).flatMap(identifier)
                .map(ServerObject.response)
        }
        return nil
    }

    /// The object a request makes that the request itself names (a RAG ingest's collection): it
    /// belongs to the server that answers it with success.
    public static func madeByRequest(method: String, path: String, body: [UInt8]) -> ServerObject? {
        guard method == "POST", path.containsBytes("ingest"), segments(path) == ["v1", "rag", "ingest"] else {
            return nil
        }
        return ModelField.string(named: "collection", in: body).flatMap(identifier).map(ServerObject.ragCollection)
    }

    /// Whether the answer to this request names an object it made (a new agent run, a stored
    /// response): its `id` is read from the answer (``madeByAnswer(_:path:)``).
    public static func answerMakes(method: String, path: String) -> Bool {
        guard method == "POST", path.containsBytes("runs") || path.containsBytes("responses") else { return false }
        let parts = segments(path)
        return parts == ["v1", "agents", "runs"] || parts == ["v1", "responses"]
    }

    /// The request creates an agent run (`POST /v1/agents/runs`): safe to repeat with an
    /// `Idempotency-Key`, which the server honours (the same key and body return the run made).
    public static func createsRun(method: String, path: String) -> Bool {
        method == "POST" && path.containsBytes("runs") && segments(path) == ["v1", "agents", "runs"]
    }

    /// Whose `Idempotency-Key` makes a run's creation safe to send again.
    public enum RunKey: Sendable, Hashable {
        /// The client's: one key, not empty, that reaches the server.
        case client
        /// The gateway's own, added: the client sent none, or one that never reaches the server
        /// (it listed the header in `Connection`, which drops it at this hop).
        case added
        /// None: the client's key reaches the server but says nothing it can honour (empty, or
        /// more than one): the request goes once.
        case none
    }

    /// Whose key a run's creation carries (``RunKey``): a request is repeatable only for what the
    /// server will actually receive. `keys`: the values of the client's `Idempotency-Key`
    /// headers; `connectionListed`: the names its `Connection` headers list (lower case).
    public static func runKey(keys: [String], connectionListed: [String]) -> RunKey {
        if keys.isEmpty || connectionListed.contains("idempotency-key") { return .added }
        guard keys.count == 1, !keys[0].trimmingASCIIWhitespace().isEmpty else { return .none }
        return .client
    }

    /// The object a successful JSON answer made: its top-level `id` (or `run_id`).
    public static func madeByAnswer(_ answer: [UInt8], path: String) -> ServerObject? {
        let parts = segments(path)
        let id = (ModelField.string(named: "id", in: answer) ?? ModelField.string(named: "run_id", in: answer))
            .flatMap(identifier)
        guard let id else { return nil }
        return parts == ["v1", "responses"] ? .response(id) : .agentRun(id)
    }

    private static func segments(_ path: String) -> [Substring] {
        path.split(separator: "?", maxSplits: 1).first?.split(separator: "/") ?? []
    }

    /// An id or a name as it may be followed: 1…256 characters of letters, digits and `-_.:`.
    private static func identifier(_ text: some StringProtocol) -> String? {
        guard !text.isEmpty, text.utf8.count <= maxIdentifierLength,
            text.utf8.allSatisfy({ b in
                (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || b == 0x2D
                    || b == 0x5F
                    || b == 0x2E || b == 0x3A
            })
        else { return nil }
        return String(text)
    }
}

/// Which server (by `instance_id`) holds which object, for which local user: at most `capacity`
/// entries, each kept for `lifetime` seconds after it was last used; past the capacity the least
/// recently used goes. Entries are per user (the uid of the client's connection; nil: a peer
/// the kernel named nobody, one user of its own): one user's requests never move where another
/// user's requests for an object of the same name go.
public struct AffinityTable: Sendable {
    public let capacity: Int
    public let lifetime: Double

    struct Key: Hashable {
        var user: UInt32?
        var object: ServerObject
    }

    private var entries: [Key: (instance: String, used: Double)] = [:]

    public init(capacity: Int = 4096, lifetime: Double = 86_400) {
        self.capacity = capacity
        self.lifetime = lifetime
    }

    public var count: Int { entries.count }

    /// Records that `instance` holds `object`, for `user`'s requests.
    public mutating func record(_ object: ServerObject, on instance: String, user: UInt32?, now: Double) {
        entries[Key(user: user, object: object)] = (instance, now)
        guard entries.count > capacity else { return }
        // Over the bound: drop what expired, then the least recently used down to 15/16 (so a
        // steady stream of new objects sorts once per many, not on each).
        entries = entries.filter { now - $0.value.used < lifetime }
        guard entries.count > capacity else { return }
        let keep = capacity - capacity / 16
        let newest = entries.sorted { $0.value.used > $1.value.used }.prefix(keep)
        entries = Dictionary(uniqueKeysWithValues: newest.map { ($0.key, $0.value) })
    }

    /// The server holding `object` for `user`, if known and not expired (its use renews it).
    public mutating func owner(of object: ServerObject, user: UInt32?, now: Double) -> String? {
        let key = Key(user: user, object: object)
        guard let entry = entries[key] else { return nil }
        guard now - entry.used < lifetime else {
            entries[key] = nil
            return nil
        }
        entries[key] = (entry.instance, now)
        return entry.instance
    }
}
