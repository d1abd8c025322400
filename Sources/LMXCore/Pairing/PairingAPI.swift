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

    enum CodingKeys: String, CodingKey { case payloads, allowInsecure = "allow_insecure" }

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

