/// One request's exchange with a server, as the gateway's data path forwards it: a value that
/// takes the events of the exchange (a part of the client's body, its end, a connection made or
/// failed, the answer's head, its end, the server gone) and says what to do (keep the part, send
/// it, connect, answer the client, finish). No I/O: the channel handler that drives it does what
/// it says (the pattern of async-http-client's `HTTPRequestStateMachine`).
///
/// Every exchange ends through ``Action/finish(upstream:client:)``, once: what becomes of the
/// server's connection (back to the pool only when the whole request went and the answer ended
/// whole, as nginx's upstream keep-alive) and of the client's (the next request, the rest of the
/// body read and dropped, or closed).
public struct GatewayExchange: Sendable {
    public enum Phase: Sendable, Hashable {
        /// Reading the body ahead (up to the read-ahead) before the request is decided.
        case collecting
        /// No route is usable: held until one is, or the hold ends.
        case waiting
        /// A connection to route ``GatewayExchange/attempt`` is being made or taken.
        case connecting
        /// The request went (its head, and its body as it comes); no answer yet.
        case forwarding
        /// The answer's head went to the client; its body follows.
        case answering
        /// The answer ended before the client's body: the rest is read and dropped.
        case answered
        /// Refused before anything was sent: the body is read and dropped, then the refusal answers.
        case refusing
        case finished
    }

    /// What becomes of the server's connection when the exchange finishes.
    public enum UpstreamFate: Sendable, Hashable {
        /// Back to the pool: the server read the whole request and answered it whole.
        case pool
        /// Closed (never reused: the server may be mid-request or mid-answer).
        case close
        /// There is none (never connected, or already gone).
        case none
    }

    /// What becomes of the client's connection when the exchange finishes.
    public enum ClientFate: Sendable, Hashable {
        /// The next request (or the connection closes if this one asked to).
        case next
        /// The answer is done but the body is still coming: read and dropped, then the next.
        case readRest
        /// Closed: the client cannot be answered cleanly any more.
        case close
        /// It is gone already.
        case gone
    }

    public enum Action: Sendable, Hashable {
        /// Nothing to do.
        case none
        /// Keep the body part; `thenDecide`: the read-ahead is over, decide the request now.
        case keep(thenDecide: Bool)
        /// The whole body came while collecting: decide the request now.
        case decide
        /// Send the body part on to the server.
        case send
        /// The part comes after the answer ended: dropped.
        case drop
        /// End the body at the server; write what was held of the answer.
        case sendEnd
        /// Close the connection in hand (if any) and connect to route `attempt` (a new connection
        /// when `fresh`, else a kept one if there is one).
        case connect(attempt: Int, fresh: Bool)
        /// Pass the answer's head on; `hold`: hold the answer until the client's body has come.
        case passAnswer(hold: Bool)
        /// A stream opened again (``resume()``) answered as it should: its head is dropped, its
        /// events continue the client's stream.
        case continueAnswer
        /// A stream that can be opened again lost its route: it is opened again by its server's
        /// other route (``resume()``).
        case resume
        /// Answer the client with the gateway's own error, then finish.
        case respond(Refusal)
        /// The event stream under the answer was cut: end it with an error event, then finish.
        case streamLost
        /// The exchange is over (see the type's note).
        case finish(upstream: UpstreamFate, client: ClientFate)
    }

    /// Where the exchange stands, with what each stage needs and nothing else: whether a stream
    /// is being opened again exists only until its new answer comes, whether the connection was a
    /// kept one only while the request is out, the kind of answer only while one goes out, the
    /// refusal only while the body is read to be dropped. (``phase`` is its name alone.)
    enum State: Sendable, Hashable {
        case collecting
        /// `resuming`: a stream being opened again (the client already has the answer's head).
        case waiting(resuming: Bool)
        case connecting(resuming: Bool)
        /// `kept`: on a connection kept from an earlier answer (it may have been closing).
        case forwarding(resuming: Bool, kept: Bool)
        case answering(Answer)
        case answered
        /// `closing`: the connection closes after the refusal (a request whose head is not one
        /// to read another after).
        case refusing(Refusal, closing: Bool)
        case finished
    }

    /// The answer going out.
    enum Answer: Sendable, Hashable {
        /// The server's: an event stream or not; `held` until the client's body has come.
        case server(stream: Bool, held: Bool)
        /// The gateway's own error (``respond(_:closing:)``); `closing`: the connection closes
        /// after it.
        case gateway(closing: Bool)
    }

    /// The client's body, as far as sending the request again goes.
    public enum Body: Sendable, Hashable {
        /// Coming, held (read ahead or waiting): the request can still go anywhere.
        case coming
        /// Coming, and going on to the server as it comes: the request can never go again.
        case passing
        /// All of it came, held whole: the request can go again.
        case whole
        /// All of it came, and it went on as it came.
        case sent
    }

    private(set) var state = State.collecting
    public let method: String
    /// The body's length as the client declared it (0: none).
    public let declaredLength: Int
    public let maxBodyBytes: Int
    public let readAheadBytes: Int
    /// Body bytes received so far.
    public private(set) var received = 0
    public private(set) var body = Body.coming
    /// Routes planned for it, and the one tried now.
    public private(set) var routes = 0
    public private(set) var attempt = 0
    /// The request went once more on a new connection to the same route (at most once).
    public private(set) var resentOnNewConnection = false
    /// The answer is a stream the gateway may open again on its server's other route
    /// (``StreamContinuation/resumable(method:path:)``), set by the handler.
    public var resumable = false
    /// The server makes the request safe to repeat (it carries an `Idempotency-Key` the server
    /// honours): ``RetryRule`` sends it again after any failure before the answer.
    public var repeatable = false
    /// Each route's server (``routed(servers:)``).
    public private(set) var servers: [String?] = []
    /// A repeatable request that may have reached a server: the route it went on, whose server
    /// alone may have it again.
    public private(set) var pinnedTo: Int?
    /// The last busy answer passed over (status, seconds to wait), answered if no route takes it.
    public private(set) var busy: (status: Int, retryAfter: Int)?

    public init(method: String, declaredLength: Int, maxBodyBytes: Int, readAheadBytes: Int) {
        self.method = method
        self.declaredLength = declaredLength
        self.maxBodyBytes = maxBodyBytes
        self.readAheadBytes = readAheadBytes
    }

    /// A part of the client's body of `size` bytes; `budget` says whether the shared read-ahead
    /// budget takes it (asked only while collecting).
    public mutating func bodyPart(size: Int, budget: () -> Bool) -> Action {
        received += size
        if received > maxBodyBytes, phase != .answered, phase != .finished {
            return bodyNotWhole(.tooLarge(limit: maxBodyBytes))
        }
        switch state {
        case .collecting:
            // The last byte came with this part: its end follows at once, decided then.
            if received == declaredLength { return .keep(thenDecide: false) }
            return .keep(thenDecide: received >= readAheadBytes || !budget())
        case .waiting, .connecting:
            return .keep(thenDecide: false)
        case .forwarding, .answering:
            return .send
        case .answered, .finished, .refusing:
            return .drop
        }
    }

    /// The client's body ended.
    public mutating func bodyEnd() -> Action {
        body = body == .coming ? .whole : .sent
        switch state {
        case .collecting: return .decide
        case .refusing(let refusal, let closing): return respond(refusal, closing: closing)
        case .waiting, .connecting, .finished: return .none
        case .forwarding:
            return .sendEnd
        case .answering(let answer):
            // What was held of the answer goes now (with the end, or at the finish).
            if case .server(let stream, _) = answer { state = .answering(.server(stream: stream, held: false)) }
            return .sendEnd
        case .answered:
            state = .finished
            return .finish(upstream: .none, client: .next)
        }
    }

    /// No route is usable now: the request waits.
    public mutating func hold() { state = .waiting(resuming: resuming) }

    /// Planned: `routes` routes, tried in order.
    public mutating func routed(routes: Int) -> Action {
        routed(servers: Array(repeating: nil, count: routes))
    }

    /// Planned: one route per element, tried in order; each names its server (its instance, nil
    /// when not known). A repeatable request that may have reached a server goes again only to
    /// that server (another never saw its key, and would do it a second time).
    public mutating func routed(servers: [String?]) -> Action {
        self.servers = servers
        routes = servers.count
        attempt = 0
        state = .connecting(resuming: resuming)
        return .connect(attempt: 0, fresh: false)
    }

    /// The request went on a connection (`kept`: one kept from an earlier answer). A body that
    /// has not all come goes on as it arrives, and is not kept: the request can never go again.
    public mutating func sent(onKeptConnection kept: Bool) {
        // (Impossible otherwise: a request goes only on the connection its `.connect` asked for.)
        assert(phase == .connecting, "a request sent while \(phase)")
        state = .forwarding(resuming: resuming, kept: kept)
        if body == .coming { body = .passing }
    }

    /// The route failed before any byte of an answer (`certainlyNotSent`: the connection was
    /// never made). One rule (``RetryRule``): nothing goes again without its whole body.
    public mutating func failed(certainlyNotSent: Bool, detail: String) -> Action {
        guard phase == .connecting || phase == .forwarding else { return .none }
        let failure: RetryRule.Failure =
            certainlyNotSent ? .notSent : onKeptConnection ? .keptConnectionClosed : .failedBeforeAnswer
        if repeatable, !certainlyNotSent, pinnedTo == nil { pinnedTo = attempt }
        switch RetryRule.decide(
            failure, method: method, bodyWhole: bodyWhole, attempt: attempt, routes: routes,
            resentOnNewConnection: resentOnNewConnection, repeatable: repeatable)
        {
        case .sameRouteNewConnection:
            resentOnNewConnection = true
            state = .connecting(resuming: resuming)
            return .connect(attempt: attempt, fresh: true)
        case .nextRoute:
            guard let next = nextRoute(after: attempt) else { fallthrough }
            attempt = next
            state = .connecting(resuming: resuming)
            return .connect(attempt: attempt, fresh: false)
        case .answer:
            if resuming {
                // The client already has the answer's head: its stream ends with the event.
                state = .answering(.server(stream: true, held: false))
                return .streamLost
            }
            if let busy { return respond(.busy(status: busy.status, retryAfter: busy.retryAfter)) }
            return respond(.unreachable(detail: detail))
        }
    }

    /// The next route to try after `index`: the next one, or, once the request may have reached
    /// a server (``pinnedTo``), the next of that server's routes (none when its server is not
    /// known).
    private func nextRoute(after index: Int) -> Int? {
        guard index + 1 < routes else { return nil }
        guard let pinned = pinnedTo else { return index + 1 }
        guard pinned < servers.count, let server = servers[pinned] else { return nil }
        return servers.indices.first { $0 > index && servers[$0] == server }
    }

    /// The answer's head came. `busyFor`: the server said it is busy (429, 503) and cools down
    /// for that many seconds; another route takes the request if one is left and the body is
    /// whole, else the answer passes as it is. `foreign`: the answer is not the server's
    /// (``ForeignAnswer``): never passed on; another route takes the request when it may still
    /// be sent (``RetryRule``: one that never reached a server as if not sent), else the client
    /// gets the gateway's error naming the cause.
    public mutating func answerHead(
        busyFor cooldown: Double?, status: Int, stream: Bool, foreign: ForeignAnswer? = nil
    ) -> Action {
        guard case .forwarding(let resuming, _) = state else { return .none }
        if resuming {
            // The client has its head: the new answer continues it, or the stream is lost.
            state = .answering(.server(stream: true, held: false))
            return status == 200 && stream ? .continueAnswer : .streamLost
        }
        if let foreign {
            let reached = foreign.mayHaveReachedServer
            if repeatable, reached, pinnedTo == nil { pinnedTo = attempt }
            switch RetryRule.decide(
                reached ? .failedBeforeAnswer : .notSent, method: method, bodyWhole: bodyWhole, attempt: attempt,
                routes: routes, resentOnNewConnection: resentOnNewConnection, repeatable: repeatable)
            {
            case .nextRoute:
                if let next = nextRoute(after: attempt) {
                    attempt = next
                    state = .connecting(resuming: false)
                    return .connect(attempt: attempt, fresh: false)
                }
            case .sameRouteNewConnection, .answer:
                break  // (the same edge would answer the same page)
            }
            return respond(.notTheServer(foreign))
        }
        if let cooldown,
            RetryRule.decide(
                .busy, method: method, bodyWhole: bodyWhole, attempt: attempt, routes: routes,
                resentOnNewConnection: false) == .nextRoute
        {
            busy = (status, max(1, Int(cooldown.rounded(.up))))
            if let next = nextRoute(after: attempt) {
                attempt = next
                state = .connecting(resuming: false)
                return .connect(attempt: attempt, fresh: false)
            }
        }
        state = .answering(.server(stream: stream, held: !clientEnded))
        return .passAnswer(hold: !clientEnded)
    }

    /// The answer held grew past what is held: it goes as it comes.
    public mutating func answerReleased() {
        if case .answering(.server(let stream, held: true)) = state {
            state = .answering(.server(stream: stream, held: false))
        }
    }

    /// The answer ended whole (`reusable`: the server's connection may take another request).
    public mutating func answerEnd(reusable: Bool) -> Action {
        guard phase == .answering else { return .none }
        if clientEnded {
            state = .finished
            return .finish(upstream: reusable ? .pool : .close, client: .next)
        }
        // The server answered without the whole body: its connection is never reused (it would
        // read the next request as the rest), and the rest of the body is read and dropped.
        state = .answered
        return .finish(upstream: .close, client: .readRest)
    }

    /// The server's connection closed or failed (`error`: how, if it failed).
    public mutating func upstreamClosed(detail: String) -> Action {
        switch state {
        case .connecting, .forwarding:
            return failed(certainlyNotSent: false, detail: detail)
        case .answering(.server(stream: true, _)):
            return resumable ? .resume : .streamLost
        case .answering:
            // An answer cut in the middle: the client gets what came, then sees its connection
            // close, as from the server.
            state = .finished
            return .finish(upstream: .none, client: .close)
        case .collecting, .waiting, .answered, .finished, .refusing:
            return .none
        }
    }

    /// The stream is opened again by its server's other route: the request waits for one
    /// (``routed(servers:)`` then connects), its answer's head already with the client.
    public mutating func resume() {
        guard isStream, resumable else { return }
        state = .waiting(resuming: true)
    }

    /// No route to the stream's server came within the hold: it ends with the error event.
    public mutating func resumeFailed() -> Action {
        guard resuming else { return .none }
        state = .answering(.server(stream: true, held: false))
        return .streamLost
    }

    /// The stream's error event was written: the exchange ends.
    public mutating func streamEnded() -> Action {
        guard phase == .answering else { return .none }
        if clientEnded {
            state = .finished
            return .finish(upstream: .close, client: .next)
        }
        state = .answered
        return .finish(upstream: .close, client: .readRest)
    }

    /// The body will not reach the server whole (`why`: too large, stalled, cut): the server's
    /// connection is closed; the client is answered unless its answer has begun to go out.
    public mutating func bodyNotWhole(_ why: Refusal) -> Action {
        switch state {
        case .answering where !holdsAnswer:
            state = .finished
            return .finish(upstream: .close, client: .close)
        case .answered, .finished:
            return .none
        default:
            return respond(why)
        }
    }

    /// The request is refused before anything is sent: at once (`atOnce`: its body will not be
    /// read, and the connection closes after the answer), or once its body has been read and
    /// dropped (the connection then takes the next request).
    public mutating func refuse(_ refusal: Refusal, atOnce: Bool, closing: Bool = false) -> Action {
        if atOnce || clientEnded { return respond(refusal, closing: closing) }
        state = .refusing(refusal, closing: closing)
        return .none
    }

    /// Answers with the gateway's own error (and finishes once it is written: ``responded()``);
    /// `closing`: the client's connection closes after it, whatever the client asked.
    public mutating func respond(_ refusal: Refusal, closing: Bool = false) -> Action {
        state = .answering(.gateway(closing: closing))
        return .respond(refusal)
    }

    /// The gateway's own answer was written: the server's connection (if any) is closed; a
    /// client whose body has not all come cannot send another request cleanly, nor one whose
    /// refusal closes.
    public mutating func responded() -> Action {
        // (Writing the answer may have closed the connection, and that finished the exchange
        // already: it finishes once.)
        guard case .answering(.gateway(let closing)) = state else { return .none }
        state = .finished
        return .finish(upstream: .close, client: clientEnded && !closing ? .next : .close)
    }

    /// The client's connection went away: everything is let go.
    public mutating func clientGone() -> Action {
        guard phase != .finished else { return .none }
        state = .finished
        return .finish(upstream: .close, client: .gone)
    }
}
