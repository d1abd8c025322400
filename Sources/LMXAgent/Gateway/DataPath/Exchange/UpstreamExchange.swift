import LMXCore
import NIOCore

/// One forwarded request (``ForwardedRequest``) and its connection to a server, on its client
/// connection's event loop: the generic exchange of nginx's `ngx_http_upstream.c`. It decides the
/// request's routes, connects, sends, reads the answer's head, passes the answer on, holds,
/// retries, resumes a stream by another route and finishes once — each as the core's exchange
/// (``GatewayExchange``, events in, actions out) says, every action performed in one place
/// (``perform(_:_:)``). It speaks to the server through ``UpstreamProtocol`` (HTTP/1.1:
/// ``HTTP1Upstream``) and to the client through its connection's handler
/// (``GatewayConnectionHandler``), which owns the client side: reading requests, writing answers,
/// the connection's life.
final class UpstreamExchange: UpstreamOwner {
    let request: ForwardedRequest
    /// The client side (weak: a connection that went away lets go of its exchange, whose timers
    /// and connects may still be under way).
    private(set) weak var client: GatewayConnectionHandler?
    let gateway: Gateway
    let state: GatewayDataPath.LoopState
    let peer: PeerUser

    /// Where the exchange stands with a server's connection.
    enum Link {
        /// None: not connected yet, or let go of.
        case none
        /// One is being opened (`serial`: which opening; one that completes late is closed).
        case opening(serial: Int)
        /// The connection the request went on (its protocol tells this exchange its events).
        case attached(UpstreamConnection)
    }
    private(set) var link = Link.none
    /// Openings so far (``Link/opening(serial:)``).
    private var openings = 0

    /// What a request held without a connection waits for, with the deadlines of that wait.
    enum Wait {
        case none
        /// A usable route: planned again at each change of the agent's state; the agent asked to
        /// probe at `nudge`; 503 at `until`.
        case route(until: NIODeadline, nudge: NIODeadline)
        /// Room under the route's connection cap; 503 at `until`.
        case room(until: NIODeadline)
        /// A route to a cut stream's server (``StreamContinuation``): not the one it left
        /// (`avoid`, when it cut the stream) before `avoidUntil` while another is usable; the
        /// stream-lost event at `until`.
        case resume(until: NIODeadline, nudge: NIODeadline, avoid: RouteKey?, avoidUntil: NIODeadline)

        /// When the wait ends, if one is under way (a wait that turns into another keeps it).
        var until: NIODeadline? {
            switch self {
            case .none: nil
            case .route(let until, _), .room(let until), .resume(let until, _, _, _): until
            }
        }
    }
    var wait = Wait.none
    /// Times the stream was opened again (``StreamContinuation/maxResumes``).
    var resumes = 0
    /// The route that last cut this exchange's stream, and until when the stream is not moved
    /// back to it because the agent still ranks it first (its probes have not caught up yet).
    var leftFailed: (key: RouteKey, until: NIODeadline)?
    /// The loop tells this exchange of each change of the agent's state (``routesChanged()``).
    private var watching = false

    init(_ request: ForwardedRequest, client: GatewayConnectionHandler) {
        self.request = request
        self.client = client
        gateway = client.gateway
        state = client.state
        peer = client.peer
    }

    /// What came with the event whose action is performed.
    enum Given {
        case nothing
        /// A part of the client's body.
        case bodyPart(ByteBuffer)
        /// The answer's head; `relayed`: its body is an event stream the gateway reads.
        case answerHead(UpstreamAnswerHead, relayed: Bool)
        /// The server's connection ended (`error`: how it failed, if it did; `detail`: in words).
        case upstreamGone(error: (any Error)?, detail: String)
        /// Why a stream is lost.
        case lost(any Error)
    }

    /// Does what the exchange said: the one place its actions are performed.
    func perform(_ action: GatewayExchange.Action, _ given: Given = .nothing) {
        switch action {
        case .none, .drop:
            break
        case .keep(let thenDecide):
            guard case .bodyPart(let part) = given else { return unexpected("a body part to keep, none given") }
            request.add(part)
            request.countStorage(in: gateway.readAhead, for: peer)
            if thenDecide { decide() }
        case .decide:
            decide()
        case .send:
            guard case .bodyPart(let part) = given else { return unexpected("a body part to send, none given") }
            connection?.handler.sendBody(part)
        case .sendEnd:
            if let handler = connection?.handler {
                handler.sendEnd()
                handler.flush()
            }
            releaseHeldAnswer()
        case .connect(let attempt, let fresh):
            detach()?.channel.close(promise: nil)
            request.leaveRoute()
            if attempt > 0 || fresh { gateway.metrics.gatewayRetries.increment() }
            connect(fresh: fresh)
        case .passAnswer:
            guard case .answerHead(let head, let relayed) = given else {
                return unexpected("an answer without its head")
            }
            passAnswer(head, relayed: relayed)
        case .continueAnswer:
            // A stream opened again: the client has its head; the events go on.
            guard case .answerHead(let head, _) = given else { return unexpected("an answer without its head") }
            connection?.keepFor = .seconds(Int64(head.read.keepAlive.seconds))
        case .resume:
            var detail = "a stream was cut mid-answer"
            if case .upstreamGone(_, let why) = given { detail = why }
            resumeStream(routeFailed: true, detail: detail)
        case .respond(let refusal):
            respond(refusal)
        case .streamLost:
            var error: any Error = Gateway.StreamEndedMidEvent()
            if case .lost(let why) = given { error = why }
            if case .upstreamGone(let why?, _) = given { error = why }
            streamLost(error: error)
        case .finish(let upstream, let client):
            finish(upstream: upstream, client: client)
        }
    }

    /// An event the exchange's rules say cannot happen here: stops a debug build; a release
    /// build does nothing with it.
    func unexpected(_ what: @autoclosure () -> String) {
        assertionFailure("UpstreamExchange: \(what())")
    }

    /// The one way an exchange ends: its counts given back, the server's connection pooled or
    /// closed, then the client's connection told (on to its next request, reading the rest of
    /// the body, or closed).
    func finish(upstream fate: GatewayExchange.UpstreamFate, client fateOfClient: GatewayExchange.ClientFate) {
        request.releaseCounts()
        unwatchState()
        wait = .none
        if let connection = detach() {
            if fate == .pool { state.pool.release(connection) } else { connection.channel.close(promise: nil) }
        }
        if fateOfClient == .next { releaseHeldAnswer() }
        client?.exchangeFinished(self, client: fateOfClient)
    }

    /// The connection in hand, if any.
    var connection: UpstreamConnection? {
        if case .attached(let connection) = link { return connection }
        return nil
    }

    /// A connection is being opened: its serial (``Link/opening(serial:)``).
    func beginOpening() -> Int {
        if case .attached = link { unexpected("a connection opened while one is in hand") }
        openings += 1
        link = .opening(serial: openings)
        return openings
    }

    /// The request goes on `connection`: this exchange hears of its events.
    func attach(_ connection: UpstreamConnection) {
        if case .attached = link { unexpected("a second connection taken while one is in hand") }
        link = .attached(connection)
        connection.handler.owner = self
    }

    /// The request's server connection, no longer its (nor telling this exchange of its events).
    func detach() -> UpstreamConnection? {
        let held = connection
        held?.handler.owner = nil
        link = .none
        return held
    }

    /// This exchange is its client connection's current one, and the connection is open.
    var current: Bool { client?.exchange === self && client?.context != nil }

    /// Told of each change of the agent's state (``routesChanged()``) while the request waits
    /// for a route or streams an answer.
    func watchState() {
        guard !watching else { return }
        watching = true
        state.watchStreams(self)
    }

    func unwatchState() {
        guard watching else { return }
        watching = false
        state.unwatchStreams(self)
    }

    // MARK: The client's side of it

    /// A part of the client's request after its head: an event of the exchange.
    func receive(_ part: ClientRequestParser.Part) {
        switch part {
        case .head, .other, .headTooLarge:
            return  // not after a head without its end
        case .malformed:
            bodyNotWhole(.malformedBody)
        case .body(let chunk):
            let size = chunk.readableBytes
            let action = request.machine.bodyPart(size: size) {
                request.reservation(from: gateway.readAhead, for: peer).take(size)
            }
            perform(action, .bodyPart(chunk))
        case .end:
            perform(request.machine.bodyEnd())
        }
    }

    /// The request's body will not reach the server whole (too large, cut, stalled).
    func bodyNotWhole(_ refusal: GatewayExchange.Refusal) {
        if case .tooLarge = refusal { gateway.metrics.gatewayRefused.increment() }
        perform(request.machine.bodyNotWhole(refusal))
    }

    /// The client's connection went away (or its handler left): everything is let go, the
    /// server's connection closed, not reused.
    func clientGone() {
        perform(request.machine.clientGone())
    }

    /// Reads from the client wait while a connection is being made or the request waits, and
    /// while the server cannot take more of the body.
    var holdsClientReads: Bool {
        guard !request.clientEnded else { return false }
        if request.phase == .connecting || request.phase == .waiting { return true }
        if let connection, !connection.channel.isWritable { return true }
        return false
    }

    /// The client can take more of the answer.
    func clientBecameWritable() { connection?.handler.resumeReads() }

    /// The client's read batch ended: what it brought of the body goes to the server.
    func clientReadComplete() { connection?.handler.flush() }

    /// The bytes the exchange holds (``GatewayConnectionHandler/bytesHeld``): the body read
    /// ahead with its buffer's room to grow, the answer held until an upload ends, an unfinished
    /// event, an answer read for the object it makes.
    var bytesHeld: Int {
        var total = request.parts.reduce(0) { $0 + $1.readableBytes } + request.slack + request.held.storage
        total += request.relay?.bytesHeld ?? 0
        total += request.madeAnswer?.capacity ?? 0
        return total
    }

    // MARK: The server's side (UpstreamOwner)

    var clientWritable: Bool { client?.clientWritable ?? false }

    func upstreamReadComplete() { client?.flushToClient() }

    func upstreamWritable() { client?.resumeReadsIfHeld() }
}
