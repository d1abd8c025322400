extension GatewayExchange {
    /// The gateway's own answers to a request it forwards (``GatewayExchange/Refusal/answer``
    /// renders each in one place, in the OpenAI error shape's fields).
    public enum Refusal: Sendable, Hashable {
        /// Every route tried failed before answering (why, in the last one's words).
        case unreachable(detail: String)
        /// Every server tried was busy (its status, 429 or 503, and when to try again).
        case busy(status: Int, retryAfter: Int)
        /// The body passed `gateway.max_request_bytes`.
        case tooLarge(limit: Int)
        /// No byte of the body came for `gateway.client_timeout`.
        case timeout(seconds: Int)
        /// The client closed its side before the body's end.
        case incomplete(received: Int, declared: Int)
        /// No route was usable within `gateway.hold_seconds` (and why, in the agent's words).
        case noEndpoint(holdSeconds: Double, reason: String)
        /// The body names a key the gateway reads twice, or spells it with escapes.
        case ambiguous(key: String)
        /// The object the request names is on a server no route reaches now.
        case serverUnreachable(object: String, server: String, holdSeconds: Double)
        /// Every connection the gateway may open to the route is busy for the whole hold.
        case connectionsFull(limit: Int, holdSeconds: Double)
        /// The request's chunked body broke its framing.
        case malformedBody
        /// The client's `Expect` is not `100-continue`.
        case expectationFailed
        /// Every route tried answered with a page that is not the server's (the last one's).
        case notTheServer(ForeignAnswer)
        /// The plan's own refusal (a model only untrusted servers have, a key the request needs).
        case refused(status: Int, code: String, message: String)

        /// The status, the error's code and message, and `Retry-After` if there is one.
        public var answer: (status: Int, code: String, message: String, retryAfter: Int?) {
            switch self {
            case .unreachable(let detail):
                (
                    502, "upstream_unreachable",
                    "the Opta LMX server could not be reached (\(detail)); the agent is probing it again", nil
                )
            case .busy(let status, let retryAfter):
                (
                    status, "server_busy",
                    "every Opta LMX server with this model is busy; try again in \(retryAfter) s", retryAfter
                )
            case .tooLarge(let limit):
                (
                    413, "request_too_large",
                    "request bodies are limited to \(limit) bytes (gateway.max_request_bytes)", nil
                )
            case .timeout(let seconds):
                (
                    408, "request_timeout",
                    "no byte of the request's body came for \(seconds) s (gateway.client_timeout)", nil
                )
            case .incomplete(let received, let declared):
                (
                    400, "request_body_incomplete",
                    declared < 0
                        ? "the client closed its side of the connection after \(received) bytes of a chunked body, before its last chunk"
                        : "the client closed its side of the connection after \(received) of the body's \(declared) bytes",
                    nil
                )
            case .noEndpoint(let holdSeconds, let reason):
                (503, "no_endpoint", "no Opta LMX server is usable now (waited \(holdSeconds) s): \(reason)", 2)
            case .serverUnreachable(let object, let server, let holdSeconds):
                (
                    503, "server_unreachable",
                    "\(object) is on \(server), which no route reaches now (waited \(holdSeconds) s); it is not sent to another server, which does not have it",
                    2
                )
            case .connectionsFull(let limit, let holdSeconds):
                (
                    503, "connections_full",
                    "all \(limit) connections the gateway may open to the server are busy (gateway.max_connections_per_route), and none came free in \(holdSeconds) s",
                    2
                )
            case .malformedBody:
                (
                    400, "malformed_body",
                    "the request's chunked body is malformed (each chunk: its size in hex, CRLF, the data, CRLF; no chunk extensions)",
                    nil
                )
            case .expectationFailed:
                (
                    417, "expectation_failed",
                    "the gateway meets only \"Expect: 100-continue\"; send the request without the other expectation",
                    nil
                )
            case .notTheServer(let foreign):
                (foreign.answer.status, foreign.answer.code, foreign.answer.message, nil)
            case .refused(let status, let code, let message):
                (status, code, message, status == 503 ? 2 : nil)
            case .ambiguous(let key):
                (
                    400, "ambiguous_body",
                    "the request body names \"\(key)\" more than once (or spells it with escapes); the gateway and the server would read different values: send it once",
                    nil
                )
            }
        }
    }
}
