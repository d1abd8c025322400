/// A gateway client connection's life around its exchanges (``GatewayExchange``): which requests
/// are in progress and where (the data path's one exchange, requests handed to the general path,
/// llhttp in the middle of one), whether the next request waits its turn, when the connection
/// closes (the daemon stops, the client ended its side), and whether a connection that ended had
/// its client leave while an answer was awaited. A value: the channel handler tells it what
/// happened and does what it says; its rules are tested without a channel.
public struct ClientConnectionState: Sendable {
    /// The data path's exchange in progress, as these rules see it.
    public enum Exchange: Sendable, Hashable {
        case none
        /// Its body is still coming.
        case reading
        /// Its body has all come: its answer is awaited (or going out).
        case answering
        /// Its answer has ended (its body may still be coming, read and dropped).
        case finished
    }

    /// Requests handed to the general path whose answers have not ended.
    public private(set) var handedOver = 0
    /// llhttp is in the middle of a request (its parts go to the general path as they come).
    public private(set) var passing = false
    /// The rest of a request handed over goes to llhttp as it arrives.
    public private(set) var replaying = false
    /// llhttp reads the rest of the connection: nothing more is forwarded by the data path.
    public private(set) var llhttpOnly = false
    /// The daemon stops or the client ended its side: the connection closes once idle.
    public private(set) var closeWhenIdle = false
    /// The client ended its side: a body that has not ended can never end.
    public private(set) var inputClosed = false
    /// The gateway is closing the connection (a close it did not make is the client's).
    public private(set) var closing = false

    public init() {}

    /// What to do after a change.
    public enum Action: Sendable, Hashable {
        case none
        /// Close the connection.
        case close
        /// The body in progress can never end (the client ended its side first): refuse it.
        case refuseIncompleteBody
    }

    /// Nothing in progress: no exchange, nothing handed over or passing to llhttp.
    public func idle(_ exchange: Exchange) -> Bool {
        (exchange == .none) && handedOver == 0 && !passing && !replaying
    }

    /// Something is in progress (the client timeout then watches the request, not idleness).
    public func busy(_ exchange: Exchange) -> Bool { exchange != .none || handedOver > 0 || passing }

    /// A request is in the middle of its body (ours, or one llhttp reads).
    public func midRequest(_ exchange: Exchange) -> Bool { exchange == .reading || passing || replaying }

    /// A request handed over has all come and waits for its answer there: the requests after it
    /// wait their turn. (Not once llhttp reads the connection by itself, nor while it is in the
    /// middle of a request: its bytes go to it as they come.)
    public func waitsForGeneralPath(_ exchange: Exchange) -> Bool {
        exchange == .none && handedOver > 0 && !replaying && !passing && !llhttpOnly
    }

    /// A part of the next request is queued rather than handled now: parts already wait, or the
    /// request before it waits for its answer (ours, or the general path's).
    public func queues(_ exchange: Exchange, alreadyQueued: Bool) -> Bool {
        alreadyQueued || exchange == .answering || exchange == .finished || waitsForGeneralPath(exchange)
    }

    /// A new request may be decided here (nothing is handed over or mid-request at llhttp).
    public var takesRequests: Bool { handedOver == 0 && !passing && !llhttpOnly }

    /// After any change: whether to close, or refuse a body that cannot end.
    /// `nothingQueued`: no request waits (queued, or held back unread).
    public func next(_ exchange: Exchange, nothingQueued: Bool) -> Action {
        if inputClosed, nothingQueued, exchange == .reading { return .refuseIncompleteBody }
        if closeWhenIdle, idle(exchange), nothingQueued { return .close }
        return .none
    }

    // MARK: Events

    /// The daemon stops (`quiesce`) or the client ended its side. Returns whether the general
    /// path should hear of it (it answers a request now; it would close the connection, or its
    /// output, at once if it had none, cutting an answer of the data path's).
    public mutating func stop(quiesce: Bool) -> Bool {
        closeWhenIdle = true
        if !quiesce { inputClosed = true }
        return handedOver > 0 || passing
    }

    /// llhttp read a request's head (for the general path).
    public mutating func generalPathHead() {
        handedOver += 1
        passing = true
    }

    /// llhttp read a request's end.
    public mutating func generalPathEnd() { passing = false }

    /// The general path's answer to a request ended; returns whether the connection is now idle.
    public mutating func generalPathAnswered(_ exchange: Exchange) -> Bool {
        handedOver = max(0, handedOver - 1)
        return idle(exchange)
    }

    /// A request was handed to llhttp (its head and the body so far); `ended`: all of it.
    public mutating func handedToLLHTTP(ended: Bool) { replaying = !ended }

    /// The rest of a handed-over request went to llhttp.
    public mutating func replayEnded() { replaying = false }

    /// llhttp reads the connection from here on.
    public mutating func llhttpTakesRest() { llhttpOnly = true }

    /// The gateway closes the connection.
    public mutating func closedByGateway() { closing = true }

    /// The connection ended without the gateway closing it: true when an answer was awaited
    /// (an exchange whose body had all come, or a request handed over) — its client left.
    /// Counted once.
    public mutating func ended(_ exchange: Exchange) -> Bool {
        guard !closing else { return false }
        guard exchange == .answering || handedOver > 0 else { return false }
        closing = true
        return true
    }
}
