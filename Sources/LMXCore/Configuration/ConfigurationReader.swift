/// Reads one object of the config file: every setting's default is the value its type starts
/// with (written once, where the setting is declared), and every range is checked here, so that
/// every message says the same thing the same way (`must be between 1 and 100`).
struct ConfigurationReader<Key: CodingKey> {
    let container: KeyedDecodingContainer<Key>

    init(_ decoder: any Decoder, keys: Key.Type) throws {
        container = try decoder.container(keyedBy: Key.self)
    }

    /// The value at `key`, or `current` when the key is absent.
    func value<T: Decodable>(_ key: Key, or current: T) throws -> T {
        try container.decodeIfPresent(T.self, forKey: key) ?? current
    }

    /// A value present at `key`, if any.
    func optional<T: Decodable>(_ key: Key) throws -> T? {
        try container.decodeIfPresent(T.self, forKey: key)
    }

    /// A number within `range`, or `current` when absent. `unit`: said in the message (`seconds`).
    func number<T: Decodable & Comparable & CustomStringConvertible>(
        _ key: Key, or current: T, in range: ClosedRange<T>, unit: String = ""
    ) throws -> T {
        let value = try container.decodeIfPresent(T.self, forKey: key) ?? current
        guard range.contains(value) else {
            throw invalid(
                key, "must be between \(range.lowerBound) and \(range.upperBound)\(unit.isEmpty ? "" : " \(unit)")")
        }
        return value
    }

    /// Seconds above 0 and at most `max`, or `current` when absent.
    func seconds(_ key: Key, or current: Double, max: Double) throws -> Double {
        let value = try container.decodeIfPresent(Double.self, forKey: key) ?? current
        guard value > 0, value <= max else {
            throw invalid(key, "must be a number of seconds above 0 and at most \(Int(max))")
        }
        return value
    }

    /// One of a fixed set of words, or `current` when absent.
    func choice<T: RawRepresentable & CaseIterable>(_ key: Key, or current: T) throws -> T where T.RawValue == String {
        guard let raw = try container.decodeIfPresent(String.self, forKey: key) else { return current }
        guard let value = T(rawValue: raw) else {
            throw invalid(key, "must be one of \(T.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        return value
    }

    /// A text value turned into a setting by `parse`, whose error message is the reason.
    func parsed<T>(_ key: Key, or current: T, _ parse: (String) throws(ConfigurationError) -> T) throws -> T {
        guard let text = try container.decodeIfPresent(String.self, forKey: key) else { return current }
        do {
            return try parse(text)
        } catch {
            throw invalid(key, error.message)
        }
    }

    /// A value at `key` that is not acceptable, for `ConfigurationError` to name with its path.
    func invalid(_ key: Key, _ reason: String) -> DecodingError {
        DecodingError.dataCorruptedError(forKey: key, in: container, debugDescription: reason)
    }
}
