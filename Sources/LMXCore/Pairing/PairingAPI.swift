/// `POST /v1/pairings`: payloads as text (codes already read from images by `lmx-pair`).
public struct PairingUpload: Codable, Sendable {
    public struct Payload: Codable, Sendable {
        public var text: String
        /// The format it was first read from, when the text is a re-encoding (kept for display).
        public var format: PairingFormat?

        public init(text: String, format: PairingFormat? = nil) {
            self.text = text
            self.format = format
        }
    }

    public var payloads: [Payload]
    public var allowInsecure: Bool?

    enum CodingKeys: String, CodingKey {
        case payloads
        case allowInsecure = "allow_insecure"
    }

    public init(payloads: [Payload], allowInsecure: Bool) {
        self.payloads = payloads
        self.allowInsecure = allowInsecure
    }
}

/// One imported pairing in the answer to `POST /v1/pairings`.
public struct PairingImportResult: Codable, Sendable {
    public var pairing: PairingSummary
    public var updated: Bool

    public init(pairing: PairingSummary, updated: Bool) {
        self.pairing = pairing
        self.updated = updated
    }
}

extension PairingUpload {
    /// The largest upload accepted: an address book and some room.
    public static let maxBytes = PairingParser.maxAddressBookBytes + 64 * 1024

    /// Why an upload was refused, naming the payload.
    public struct Refusal: Error, Sendable, CustomStringConvertible {
        public var description: String
    }

    /// Parses and validates every payload again (the socket is an interface of its own): all or
    /// nothing.
    public func pairings(now: Int64) throws(Refusal) -> [Pairing] {
        let parser = PairingParser(allowInsecure: allowInsecure ?? false, now: now)
        var pairings: [Pairing] = []
        for (index, payload) in payloads.enumerated() {
            do {
                var parsed = try parser.parse(payload.text)
                if let format = payload.format {
                    for i in parsed.indices { parsed[i].format = format }
                }
                pairings += parsed
            } catch {
                throw Refusal(description: "payload \(index + 1): \(error)")
            }
        }
        guard !pairings.isEmpty else { throw Refusal(description: "no payloads") }
        return pairings
    }
}
