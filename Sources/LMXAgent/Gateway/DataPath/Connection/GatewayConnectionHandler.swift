import LMXCore
import LMXProbe
import LMXSystem
import NIOCore
import NIOHTTP1
import Prometheus

/// One client connection of the gateway, on its event loop: the client's side of it. It reads
/// the client's requests, takes or refuses each with the core's pure rules, and hands one it
/// forwards to an exchange (``UpstreamExchange``), which holds the server's side (routes,
/// connection, retries, the answer as it comes) and writes the answer through this handler
/// (``writeToClient(_:for:)``), with backpressure both ways (neither side is read while the
/// other cannot take more) and one flush per read batch. It keeps the connection's life: the
/// requests read ahead, the client timeout (``sweepDue()``), keep-alive and close.
///
/// Requests come from ``ClientFront`` (read by ``ClientRequestParser``), past SwiftNIO's decoder.
/// A request this handler does not forward (the dashboard, a refusal, a request that names an
/// object on one server, one that must wait for a route, a busy server's handover) is given as
/// the bytes it came as to llhttp (SwiftNIO's decoder, set up between the front and this handler
/// with the general path),
/// whose parts this handler passes to the general path behind it (Hummingbird,
/// ``Gateway/forward``), which answers it with the same rules; so are the connection's bytes
/// from a request the front does not read on. Every answer of the data path is written as bytes
/// past SwiftNIO's encoder, which sees only the general path's answers, to requests llhttp read:
/// the methods it keeps to frame answers to `HEAD` are exactly those. The general path is set up
/// behind this handler when a connection first needs it (a request handed over, a malformed
/// request); until then this handler alone serves the connection, closing it when it is idle and
/// the server stops or the client closed its side.
final class GatewayConnectionHandler: ChannelDuplexHandler, RemovableChannelHandler, SweptConnection {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    let dataPath: GatewayDataPath
    let gateway: Gateway
    let state: GatewayDataPath.LoopState
    /// Whose the connection is, asked of the kernel when first needed.
    let peer: PeerUser
    let overTCP: Bool
    var context: ChannelHandlerContext?
    /// The front's context: the data path's answers are written through it as bytes
    /// (``writeToClient``), past SwiftNIO's HTTP/1 response encoder (between the front and this
    /// handler once the general path is set up).
    var rawOutput: ChannelHandlerContext?
    /// The connection closes by ``lingerThenClose()``: what the client sends is dropped.
    private(set) var lingering = false
    /// Something was written to the client (``writeToClient(_:for:)``) since the last flush.
    var clientUnflushed = false
    /// Sets up the general path behind this handler (once).
    let startGeneralPath: (any Channel) throws -> Void
    var generalPathStarted = false
    /// Closes the connection once the daemon's shutdown grace is over.
    var shutdownTimer: Scheduled<Void>?
    /// How long the client may stay silent (``GatewayConfiguration/clientTimeout``).
    let clientTimeout: TimeAmount
    /// The bytes the connection had read when the idle timer last fired in the middle of a
    /// request with a read asked for: none more by the next firing, and the client has stalled.
    var bytesSeen: Int?
    /// A read is asked of the socket and no bytes have come since (false while reads are held,
    /// here or by the general path).
    var readAsked = false
    /// Bytes of answers' bodies written to the client on this connection so far.
    var answerBytesWritten = 0
    /// The same for the answer, while the client could take no more of it.
    var answerSeen: Int?

    // (Properties that a call the compiler cannot see into changes — `ByteBuffer`'s writes, a
    // collection's growth — are changed through locals moved out of them and back: an access to a
    // class's property that spans such a call is checked at run time, about 70 instructions.)

    /// Parts of the data path's answers written since the last flush (``writeToClient``).
    var gathered = Gathered()
    /// The exchange of the request this handler is forwarding, if any.
    var exchange: UpstreamExchange?
    /// …and its body came chunked: its parts go to llhttp framed again as chunks.
    var replayingChunked = false
    /// Where requests come from, and where bytes for llhttp go.
    var front: ClientFront?
    /// Parts read after the current request (pipelined): handled once it is done (nil: none).
    var queued: CircularBuffer<ClientRequestParser.Part>?
    /// The `.end`s in ``queued``.
    var queuedEnds = 0
    /// Parts llhttp read behind a request the general path is answering (nil: none).
    var llhttpQueue: CircularBuffer<HTTPServerRequestPart>?
    /// The `.end`s in ``llhttpQueue``.
    var llhttpQueuedEnds = 0
    var draining = false
    var readPending = false
    /// The connection's life around its exchanges: what is in progress where, when it closes
    /// (``ClientConnectionState``, the rules; this handler does what they say).
    var life = ClientConnectionState()
    /// `gateway.group`: a user's membership being looked up, or just answered.
    var groupLookup = GroupLookup.none
    /// The exchange in progress, as ``life`` sees it.
    var exchangeNow: ClientConnectionState.Exchange {
        guard let request = exchange?.request else { return .none }
        if request.phase == .finished { return .finished }
        return request.clientEnded ? .answering : .reading
    }
    /// Parts were passed to the general path since the last read batch ended.
    var firedRead = false
    /// The connection's slot in its loop's ``ConnectionSweep`` while it is open.
    var sweepSlot: Int?
    /// When the sweep is next to look at the connection (its client timeout; set as it is added).
    var nextCheck = NIODeadline.distantFuture
    /// When the connection last became idle (no request in progress).
    var idleSince = NIODeadline.now()

    init(
        dataPath: GatewayDataPath, state: GatewayDataPath.LoopState, peer: PeerUser, overTCP: Bool,
        startGeneralPath: @escaping (any Channel) throws -> Void
    ) {
        self.dataPath = dataPath
        self.gateway = dataPath.gateway
        self.state = state
        self.peer = peer
        self.overTCP = overTCP
        self.startGeneralPath = startGeneralPath
        self.clientTimeout = .milliseconds(Int64(dataPath.gateway.configuration.clientTimeout * 1000))
    }

    /// Nothing in progress on the connection: no request of ours, none handed over.
    var idle: Bool { life.idle(exchangeNow) }

    func closeIfDone() {
        switch life.next(exchangeNow, nothingQueued: nothingQueued) {
        case .none: break
        case .close: closeConnection()
        case .refuseIncompleteBody:
            // The client closed its side before the body's end: the request can never be whole
            // (nginx: "client prematurely closed connection").
            guard let exchange else { return }
            let machine = exchange.request.machine
            exchange.bodyNotWhole(.incomplete(received: machine.received, declared: machine.declaredLength))
        }
    }

    /// Closes the client's connection (noted: not the client's leaving).
    func closeConnection() {
        life.closedByGateway()
        context?.close(promise: nil)
    }

    /// Closes after an answer written while the client may still be sending (a refusal before its
    /// body, a head not read): nginx's lingering close. The output is closed once the answer is
    /// out (a FIN after it), and what the client still sends is read and dropped until it closes
    /// its side, sends nothing for ``lingerQuiet`` (nginx's `lingering_timeout`), or
    /// ``lingerTime`` has passed; then the connection closes. Closed at once with bytes unread,
    /// the kernel would answer them with a reset that can destroy the answer before the client
    /// reads it. What the connection held for requests it will not answer is let go of at once.
    func lingerThenClose() {
        guard let context, !lingering else { return }
        life.closedByGateway()
        lingering = true
        queued = nil
        queuedEnds = 0
        llhttpQueue = nil
        llhttpQueuedEnds = 0
        front?.dropUnread()
        // The times count from when the answer has all gone to the kernel (SwiftNIO shuts the
        // output once what was written is out), not while a large one still waits to be written.
        let outputClosed = context.eventLoop.makePromise(of: Void.self)
        context.close(mode: .output, promise: outputClosed)
        context.read()
        outputClosed.futureResult.assumeIsolated().whenComplete { [self] _ in
            self.lingerCheck(seen: self.front?.bytesRead ?? 0, until: .now() + Self.lingerTime)
        }
    }

    /// Closes the lingering connection once the client has sent nothing for ``lingerQuiet`` (all it
    /// sent was read: the close resets nothing), or at `deadline` — but not while the kernel still
    /// holds answer bytes the client has not taken (a reset then would destroy them: the client
    /// reading slowly, or sending more before it reads); the sweep's `client_timeout` bounds that.
    private func lingerCheck(seen: Int, until deadline: NIODeadline) {
        context?.eventLoop.assumeIsolated().scheduleTask(in: Self.lingerQuiet) { [self] in
            guard let context = self.context else { return }
            let read = self.front?.bytesRead ?? seen
            if read == seen || NIODeadline.now() >= deadline, !self.answerStillLeaving(context.channel) {
                context.close(promise: nil)
            } else {
                self.lingerCheck(seen: read, until: deadline)
            }
        }
    }

    /// Over TCP, the kernel still holds bytes of the answer the client has not acknowledged
    /// (``SocketOwner/sendQueue(local:peer:)``; unknown: no).
    private func answerStillLeaving(_ channel: any Channel) -> Bool {
        guard overTCP, let local = channel.localAddress?.bytesAndPort, let peer = channel.remoteAddress?.bytesAndPort
        else { return false }
        return (SocketOwner.sendQueue(local: local, peer: peer) ?? 0) > 0
    }

    /// How long a lingering close reads and drops what the client still sends (nginx's
    /// `lingering_time` is 30 s with a 5 s `lingering_timeout`; a local client needs far less).
    static let lingerTime = TimeAmount.seconds(2)
    /// How long a lingering close waits for more from a client that has stopped sending.
    static let lingerQuiet = TimeAmount.milliseconds(500)

    /// What the client can take now (an upstream is read only while it can).
    var clientWritable: Bool { context?.channel.isWritable ?? false }

    // MARK: Channel events

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        rawOutput = front?.context
        checkAgain()
        sweepSlot = state.sweep.add(self)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        leaveSweep()
        shutdownTimer?.cancel()
        abandon()
        self.context = nil
        rawOutput = nil
        front = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        countIfClientLeft()
        leaveSweep()
        shutdownTimer?.cancel()
        abandon()
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A request llhttp could not read, with nothing else in progress: the gateway's own 400.
        if let error = error as? HTTPParserError, refuseUnreadable(error) { return }
        // The connection failed (a client's reset), or a request llhttp could not read in the
        // middle of the general path's: it answers 400 and closes the connection.
        if error is IOError { countIfClientLeft() }
        abandon()
        if ensureGeneralPath() { context.fireErrorCaught(error) }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        let stopping = event is ChannelShouldQuiesceEvent
        if lingering, (event as? ChannelEvent) == .inputClosed {
            // The client closed its side: nothing more to drop.
            context.close(promise: nil)
            return
        }
        if stopping || (event as? ChannelEvent) == .inputClosed {
            // The server stops, or the client closed its side: what is in progress finishes,
            // then the connection closes. Hummingbird's handlers hear of it only while they
            // answer a request (they would close the connection, or its output, at once if
            // they had none, cutting an answer of the data path's).
            let tellGeneralPath = life.stop(quiesce: stopping)
            if stopping, shutdownTimer == nil {
                // What is in progress gets the grace, not more: the daemon always stops.
                shutdownTimer = context.eventLoop.assumeIsolated().scheduleTask(in: GatewayChildChannel.shutdownGrace) {
                    [self] in
                    self.closeConnection()
                }
            }
            if generalPathStarted, tellGeneralPath { context.fireUserInboundEventTriggered(event) }
            closeIfDone()
            if !stopping { cutIfClientLeft(lookAgain: true) }
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { exchange?.clientBecameWritable() }
        context.fireChannelWritabilityChanged()
    }

    func read(context: ChannelHandlerContext) {
        if lingering {
            context.read()
        } else if holdsReads {
            readPending = true
        } else {
            readAsked = true
            context.read()
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        exchange?.clientReadComplete()
        // The general path hears of a read batch only when it was given something in it.
        if firedRead {
            firedRead = false
            context.fireChannelReadComplete()
        }
    }

    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        if mode == .all { life.closedByGateway() }
        context.close(mode: mode, promise: promise)
    }

    /// The bytes the connection holds beyond its socket's receive buffers, as stored: the body
    /// read ahead (with its buffer's room to grow), the answer held until an upload ends, an
    /// unfinished event, parts read ahead and queued (a head as its bytes, a parsed head of
    /// llhttp's at an estimate of its `HTTPRequestHead`), bytes waiting for either reader, and
    /// what is gathered for the next flush. Bounded (docs/gateway.md, "Bytes held"): the
    /// generated pipeline test checks it after every step.
    var bytesHeld: Int {
        var total = gathered.capacity + (front?.bytesWaiting ?? 0) + (exchange?.bytesHeld ?? 0)
        for part in queued ?? [] {
            switch part {
            case .head(let head, _): total += head.raw.readableBytes
            case .body(let bytes), .other(let bytes): total += bytes.readableBytes
            case .end, .malformed, .headTooLarge: break
            }
        }
        for part in llhttpQueue ?? [] {
            switch part {
            case .head(let head):
                total += Self.parsedHeadCost + head.headers.reduce(0) { $0 + $1.name.utf8.count + $1.value.utf8.count }
            case .body(let bytes): total += bytes.readableBytes
            case .end: break
            }
        }
        return total
    }

    /// What a parsed `HTTPRequestHead` takes beyond its texts (its storage, headers array).
    static let parsedHeadCost = 256

    /// No request waits: none queued here, no bytes held back by the front.
    var nothingQueued: Bool {
        queued == nil && front?.holdsUnread != true && llhttpQueue == nil && front?.holdsForLLHTTP != true
    }

    /// Reads wait while parts are queued or bytes wait to be parsed, while a connection is being
    /// made, and while the upstream cannot take more of the body.
    var holdsReads: Bool {
        if !nothingQueued { return true }
        return exchange?.holdsClientReads ?? false
    }

    func resumeReadsIfHeld() {
        guard readPending, !holdsReads, let context else { return }
        readPending = false
        readAsked = true
        context.read()
    }

    /// The exchange finished (``UpstreamExchange/finish(upstream:client:)``): what becomes of
    /// the client's connection.
    func exchangeFinished(_ exchange: UpstreamExchange, client fate: GatewayExchange.ClientFate) {
        switch fate {
        case .next:
            // Answer and request both ended: the connection takes the next request.
            guard self.exchange === exchange else { return }
            self.exchange = nil
            if !exchange.request.keepAlive {
                closeConnection()
                return
            }
            idleSince = .now()
            drainQueue()
            closeIfDone()
        case .readRest:
            resumeReadsIfHeld()  // the rest of the body is read and dropped
        case .close:
            // (The client may still be sending: its body, or requests behind it. A lingering
            // close lets it read the answer rather than a reset, as nginx's.)
            if self.exchange === exchange { self.exchange = nil }
            lingerThenClose()
        case .gone:
            if self.exchange === exchange { self.exchange = nil }
        }
    }

    /// The client went away (or the handler left): the upstream connection is closed, not reused.
    func abandon() {
        guard let exchange else { return }
        self.exchange = nil
        exchange.clientGone()
    }
}
