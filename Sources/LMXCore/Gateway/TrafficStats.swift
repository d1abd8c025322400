/// The gateway's traffic per model and path (LAN or tunnel): requests, errors, time to the first
/// byte of the answer (for streams, to the first event: the first token), and streamed events per
/// second (servers send one token per event). Bounded: at most `maxKeys` model and path pairs,
/// the most recently used (a new one takes the place of the one used longest ago, so names
/// nobody uses any more age out, junk among them), the latest `samples` figures of each kind per
/// pair.
public struct TrafficStats: Sendable {
    public struct Key: Sendable, Hashable {
        public let model: String
        public let via: Via
        /// Its hash, taken once: a request's key is looked up in the table and in the
        /// histograms, and hashing the model's text each time cost most of each look-up.
        private let hash: Int

        public init(model: String, via: Via) {
            self.model = model
            self.via = via
            var hasher = Hasher()
            hasher.combine(model)
            hasher.combine(via)
            hash = hasher.finalize()
        }

        public static func == (a: Key, b: Key) -> Bool {
            a.hash == b.hash && a.via == b.via && a.model == b.model
        }

        public func hash(into hasher: inout Hasher) { hasher.combine(hash) }
    }

    struct Entry: Sendable {
        var requests = 0
        var errors = 0
        var streams = 0
        var firstByte = Samples()
        var rate = Samples()
        var last = 0.0
        /// When it was last counted, as ``TrafficStats/recorded`` was then (least recently used first out).
        var used = 0
    }

    /// The latest figures, oldest overwritten first.
    struct Samples: Sendable {
        var values: [Double] = []
        var next = 0

        mutating func add(_ value: Double, keeping limit: Int) {
            guard value.isFinite, value >= 0 else { return }
            if values.count < limit {
                values.append(value)
            } else {
                values[next] = value
                next = (next + 1) % limit
            }
        }

        /// The `q`-quantile (nearest rank) of the kept values.
        func quantile(_ q: Double) -> Double? {
            guard !values.isEmpty else { return nil }
            let sorted = values.sorted()
            let rank = Int((q * Double(sorted.count)).rounded(.up)) - 1
            return sorted[min(max(rank, 0), sorted.count - 1)]
        }
    }

    public static let unnamed = "(no model)"
    let maxKeys: Int
    let samples: Int
    private var entries: [Key: Entry] = [:]
    /// Answers and ends of streams counted since the table was made (whichever key): changes
    /// whenever the gateway has answered anything (the daemon's ``HeapReturn`` watches it).
    public private(set) var recorded = 0
    /// Keys that gave their place to newer ones since ``takeEvicted()`` was last called (their
    /// Prometheus series are let go of with them).
    private var evicted: [Key] = []

    public init(maxKeys: Int = 64, samples: Int = 256) {
        self.maxKeys = max(maxKeys, 1)
        self.samples = max(samples, 1)
    }

    /// The key of `model` (bounded, printable) before the bound on keys (``update(key:_:)``
    /// gives it a place). The same key labels the Prometheus series, so they are
    /// bounded alike.
    public static func named(model: String?, via: Via) -> Key {
        let name =
            model.flatMap { OutsideInput.label($0, maxBytes: 128) }.flatMap { $0.isEmpty ? nil : $0 } ?? Self.unnamed
        return Key(model: name, via: via)
    }

    /// A request answered with `status` (`answered` false: no server answered it; the gateway
    /// did), its first byte `firstByte` seconds after it came (nil: not taken, as for streams,
    /// whose first event is the figure).
    /// Returns the key it was counted under.
    @discardableResult
    public mutating func answered(
        model: String?, via: Via, status: Int, firstByte: Double?, answered: Bool = true, now: Double
    ) -> Key {
        self.answered(
            key: Self.named(model: model, via: via), status: status, firstByte: firstByte, answered: answered, now: now)
    }

    /// As ``answered(model:via:status:firstByte:answered:now:)``, under a key ``named(model:via:)``
    /// made or one this table returned (it keeps every key it counted under).
    @discardableResult
    public mutating func answered(key: Key, status: Int, firstByte: Double?, answered: Bool = true, now: Double) -> Key
    {
        countAnswer(key: key, status: status, firstByte: firstByte, answered: answered, now: now)
        return key
    }

    /// As ``answered(key:status:firstByte:answered:now:)``; whether the table had the key
    /// before (one look-up of it).
    @discardableResult
    public mutating func countAnswer(key: Key, status: Int, firstByte: Double?, answered: Bool = true, now: Double)
        -> Bool
    {
        let samples = samples
        recorded &+= 1
        return update(key: key) { entry in
            entry.requests &+= 1
            if status >= 500 || status == 429 || !answered { entry.errors &+= 1 }
            if let firstByte, status < 400 { entry.firstByte.add(firstByte * 1000, keeping: samples) }
            entry.last = now
        }
    }

    /// Changes the entry of the key ``named(model:via:)`` made (made if there is none, in the
    /// place of the least recently used when the table is full), in place: a copy of the entry would share its sample arrays with the one in
    /// the dictionary, and the first append would copy them whole, on every request. One look-up
    /// of the key when it is known. Returns the key counted under.
    /// Returns whether the key had an entry.
    @discardableResult
    private mutating func update(key: Key, _ change: (inout Entry) -> Void) -> Bool {
        let used = recorded
        if let index = entries.index(forKey: key) {
            change(&entries.values[index])
            entries.values[index].used = used
            return true
        }
        if entries.count >= maxKeys, let oldest = entries.min(by: { $0.value.used < $1.value.used })?.key {
            // Full: the key used longest ago gives its place (one pass over at most maxKeys).
            entries[oldest] = nil
            if evicted.count < maxKeys { evicted.append(oldest) }
        }
        var entry = Entry()
        change(&entry)
        entry.used = used
        entries[key] = entry
        return false
    }

    /// Whether `key` has an entry now (one a caller kept may have given its place since).
    public func contains(_ key: Key) -> Bool { entries.index(forKey: key) != nil }

    /// The keys that gave their place since the last call (at most `maxKeys`; a key evicted twice may be named twice).
    public mutating func takeEvicted() -> [Key] {
        guard !evicted.isEmpty else { return [] }
        defer { evicted = [] }
        return evicted
    }

    /// A streamed answer ended: `events` events over `seconds` from the first to the last, the
    /// first `firstEvent` seconds after the request.
    /// Returns the key it was counted under.
    @discardableResult
    public mutating func streamed(
        model: String?, via: Via, firstEvent: Double?, events: Int, seconds: Double, now: Double
    ) -> Key {
        streamed(
            key: Self.named(model: model, via: via), firstEvent: firstEvent, events: events, seconds: seconds, now: now)
    }

    /// As ``streamed(model:via:firstEvent:events:seconds:now:)``, under a key ``named(model:via:)`` made.
    @discardableResult
    public mutating func streamed(key: Key, firstEvent: Double?, events: Int, seconds: Double, now: Double) -> Key {
        let samples = samples
        recorded &+= 1
        update(key: key) { entry in
            entry.streams &+= 1
            if let firstEvent { entry.firstByte.add(firstEvent * 1000, keeping: samples) }
            if events >= 2, seconds > 0 { entry.rate.add(Double(events - 1) / seconds, keeping: samples) }
            entry.last = now
        }
        return key
    }

    /// The figures, busiest first.
    public func report(iso: (Double) -> String) -> [StatusAPI.ModelTraffic] {
        entries.map { key, entry in
            StatusAPI.ModelTraffic(
                model: key.model, via: key.via, requests: entry.requests, errors: entry.errors, streams: entry.streams,
                firstByteP50MS: entry.firstByte.quantile(0.5), firstByteP95MS: entry.firstByte.quantile(0.95),
                eventsPerSecondP50: entry.rate.quantile(0.5), lastAt: iso(entry.last),
                eventsPerSecondP95: entry.rate.quantile(0.95))
        }
        .sorted { ($0.requests, $1.model, $1.via.rawValue) > ($1.requests, $0.model, $0.via.rawValue) }
    }
}
