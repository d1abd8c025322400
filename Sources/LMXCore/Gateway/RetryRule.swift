/// When the gateway sends a request again, and where: one rule for every way an attempt can fail
/// before any byte of its answer reached the client, modelled on nginx's `proxy_next_upstream`
/// (which failure, which method, whether the body can still be sent whole, which attempt).
///
/// A request goes again only with its whole body: one whose body was passed on as it came (it
/// was longer than the read-ahead) can never be sent twice, whatever the method — sending its
/// head again with nothing after it would make the server read the next request on that
/// connection as the body.
public enum RetryRule {
    /// How an attempt failed (nothing of its answer reached the client).
    public enum Failure: Sendable, Hashable {
        /// No connection was made (refused, no route, connect timeout, name resolution): the
        /// server certainly never saw the request.
        case notSent
        /// A connection kept from an earlier answer closed before any byte of this answer: most
        /// likely the server closed it idle just as the request went, which says nothing of the
        /// route; the request may or may not have arrived.
        case keptConnectionClosed
        /// The request was sent (or may have been) and the connection failed before an answer.
        case failedBeforeAnswer
        /// The server answered 429 or 503 (busy): it did not act on the request.
        case busy
    }

    /// What to do next.
    public enum Decision: Sendable, Hashable {
        /// The same route again, on a new connection (once per request at most).
        case sameRouteNewConnection
        /// The next route in the plan.
        case nextRoute
        /// No other attempt: the client gets the gateway's 502, or the busy server's own answer.
        case answer
    }

    /// The next step after `failure` of attempt `attempt` (0-based) of `routes` planned.
    /// - Parameters:
    ///   - bodyWhole: the gateway still holds the whole body (it all came within the read-ahead),
    ///     or there is none.
    ///   - resentOnNewConnection: this request was already sent again on a new connection after a
    ///     kept one closed.
    public static func decide(
        _ failure: Failure, method: String, bodyWhole: Bool, attempt: Int, routes: Int,
        resentOnNewConnection: Bool, repeatable: Bool = false
    ) -> Decision {
        guard bodyWhole else { return .answer }
        let another = attempt + 1 < routes
        // A request the server itself makes safe to repeat (an `Idempotency-Key` it honours: the
        // same key and body return what the first made) goes again like an idempotent one, and
        // after any failure once more on a new connection to the same route first.
        let idempotent = isIdempotent(method) || repeatable
        switch failure {
        case .notSent, .busy:
            return another ? .nextRoute : .answer
        case .keptConnectionClosed:
            // As browsers and Go's HTTP client do: a request safe to send twice goes again at once
            // on a new connection to the same route; others may have arrived, and are not.
            guard idempotent else { return .answer }
            if !resentOnNewConnection { return .sameRouteNewConnection }
            return another ? .nextRoute : .answer
        case .failedBeforeAnswer:
            if repeatable, !resentOnNewConnection { return .sameRouteNewConnection }
            return idempotent && another ? .nextRoute : .answer
        }
    }

    /// Safe to send twice (RFC 9110 §9.2.2).
    public static func isIdempotent(_ method: String) -> Bool {
        switch method {
        case "GET", "HEAD", "OPTIONS", "PUT", "DELETE": true
        default: false
        }
    }
}
