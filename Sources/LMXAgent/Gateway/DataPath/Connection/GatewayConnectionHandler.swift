import LMXCore
import LMXProbe
import LMXSystem
import NIOCore
import NIOHTTP1
import Prometheus

/// One client connection of the gateway, on its event loop: decides each request with the core's
/// pure rules against the loop's copy of the agent's state, forwards it to a connection of the
/// loop's own pool and passes the answer back as it comes, with backpressure both ways (neither
/// side is read while the other cannot take more) and one flush per read batch.
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
    /// The request this handler is forwarding, if any.
    var request: ForwardedRequest?
    /// …and its body came chunked: its parts go to llhttp framed again as chunks.
    var replayingChunked = false
    /// Where requests come from, and where bytes for llhttp go.
    var front: ClientFront?
    /// Parts read after the current request (pipelined): handled once it is done (nil: none).
    var queued: CircularBuffer<ClientRequestParser.Part>?
    var draining = false
    var readPending = false
    /// The connection's life around its exchanges: what is in progress where, when it closes
    /// (``ClientConnectionState``, the rules; this handler does what they say).
    var life = ClientConnectionState()
    /// `gateway.group`: a user's membership being looked up, or just answered.
    var groupLookup = GroupLookup.none
    /// The exchange in progress, as ``life`` sees it.
    var exchangeNow: ClientConnectionState.Exchange {
        guard let request else { return .none }
        if request.phase == .finished { return .finished }
        return request.clientEnded ? .answering : .reading
    }
    /// The loop tells this handler of each change of the agent's state (``watchState()``).
    var watchesState = false
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

    /// The general path behind this handler, set up if it was not; false (and the connection
    /// closed) if it could not be.
    func ensureGeneralPath() -> Bool {
        if generalPathStarted { return true }
        guard let context else { return false }
        do {
            try startGeneralPath(context.channel)
            generalPathStarted = true
            return true
        } catch {
            gateway.logger.error(
                "gateway: could not set up a connection's general path", metadata: ["error": "\(error)"])
            closeConnection()
            return false
        }
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
            guard let request else { return }
            bodyNotWhole(
                request,
                .incomplete(received: request.exchange.received, declared: request.exchange.declaredLength))
        }
    }

    /// Closes the client's connection (noted: not the client's leaving).
    func closeConnection() {
        life.closedByGateway()
        context?.close(promise: nil)
    }

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
        // The connection failed (a client's reset), or a malformed request: the general path
        // answers 400 and closes the connection.
        if error is IOError { countIfClientLeft() }
        abandon()
        if ensureGeneralPath() { context.fireErrorCaught(error) }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        let stopping = event is ChannelShouldQuiesceEvent
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
        if context.channel.isWritable { request?.upstream?.handler.resumeReads() }
        context.fireChannelWritabilityChanged()
    }

    func read(context: ChannelHandlerContext) {
        if holdsReads {
            readPending = true
        } else {
            readAsked = true
            context.read()
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        request?.upstream?.handler.flush()
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

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if let rawOutput { withGathered { $0.write(to: rawOutput) } }  // (empty: answers are flushed as they end)
        // The general path's answers pass through; when the last one ends, the next request is ours.
        if case .end = unwrapOutboundIn(data), life.handedOver > 0 {
            let nowIdle = life.generalPathAnswered(exchangeNow)
            context.write(data, promise: promise)
            if life.handedOver == 0, llhttpQueue != nil || front?.holdsForLLHTTP == true {
                // The request llhttp read next, its turn now (after this write returned to the
                // general path's handlers, as below).
                context.eventLoop.assumeIsolated().execute { [self] in
                    guard self.context != nil else { return }
                    self.releaseLLHTTPQueue()
                    self.closeIfDone()
                }
            }
            if nowIdle {
                idleSince = .now()
                if life.closeWhenIdle { context.flush() }
                // The requests read after it, their turn now: once this write has returned to
                // the general path's handlers (their state moves on after it).
                if !nothingQueued {
                    context.eventLoop.assumeIsolated().execute { [self] in
                        guard self.context != nil else { return }
                        self.drainQueue()
                        self.closeIfDone()
                    }
                }
                closeIfDone()
            }
            return
        }
        context.write(data, promise: promise)
    }

    /// The bytes the connection holds beyond its socket's receive buffers, as stored: the body
    /// read ahead (with its buffer's room to grow), the answer held until an upload ends, an
    /// unfinished event, parts read ahead and queued (a head as its bytes, a parsed head of
    /// llhttp's at an estimate of its `HTTPRequestHead`), bytes waiting for either reader, and
    /// what is gathered for the next flush. Bounded (docs/gateway.md, "Bytes held"): the
    /// generated pipeline test checks it after every step.
    var bytesHeld: Int {
        var total = gathered.capacity + (front?.bytesWaiting ?? 0)
        if let request {
            total += request.parts.reduce(0) { $0 + $1.readableBytes } + request.slack + request.heldStorage
            total += request.relay?.bytesHeld ?? 0
            total += request.madeAnswer?.capacity ?? 0
        }
        for part in queued ?? [] {
            switch part {
            case .head(let head, _): total += head.raw.readableBytes
            case .body(let bytes), .other(let bytes): total += bytes.readableBytes
            case .end, .malformed: break
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
        guard let request, !request.clientEnded else { return false }
        if request.phase == .connecting || request.phase == .waiting { return true }
        if let upstream = request.upstream, !upstream.channel.isWritable { return true }
        return false
    }

    func resumeReadsIfHeld() {
        guard readPending, !holdsReads, let context else { return }
        readPending = false
        readAsked = true
        context.read()
    }

    /// Parts of requests llhttp read: all go to the general path, one request at a time. A
    /// request parsed behind one the general path has not answered yet waits here
    /// (``llhttpQueue``), and the front gives llhttp no more bytes meanwhile
    /// (``ClientFront/feedLLHTTP(_:)``): pipelined requests behind a head llhttp reads cost what
    /// one slice of bytes parses into, not a parsed request each for a whole read.
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = unwrapInboundIn(data)
        guard ensureGeneralPath() else { return }
        if llhttpQueue != nil || (life.handedOver > 0 && Self.isHead(part)) {
            var queue = llhttpQueue.take() ?? []
            queue.append(part)
            if case .end = part { llhttpQueuedEnds += 1 }
            llhttpQueue = queue
            return
        }
        toGeneralPath(part, context: context)
    }

    static func isHead(_ part: HTTPServerRequestPart) -> Bool {
        if case .head = part { return true }
        return false
    }

    /// A part of a request llhttp read, passed to the general path.
    func toGeneralPath(_ part: HTTPServerRequestPart, context: ChannelHandlerContext) {
        switch part {
        case .head:
            life.generalPathHead()
            gateway.metrics.gatewayHandedOver.increment()
        case .body: break
        case .end: life.generalPathEnd()
        }
        firedRead = true
        context.fireChannelRead(wrapInboundOut(part))
    }

    /// Parts llhttp read behind a request the general path is answering (nil: none).
    var llhttpQueue: CircularBuffer<HTTPServerRequestPart>?
    /// The `.end`s in ``llhttpQueue``.
    var llhttpQueuedEnds = 0
    /// llhttp is given no more bytes: it read a whole request ahead, or many parts of one.
    var llhttpQueueFull: Bool { llhttpQueuedEnds > 0 || (llhttpQueue?.count ?? 0) >= Self.maxLLHTTPQueued }
    static let maxLLHTTPQueued = 64

    /// The general path answered: the requests llhttp read after, their turn now, one at a time;
    /// then llhttp is given the bytes the front held for it.
    func releaseLLHTTPQueue() {
        guard let context else { return }
        while life.handedOver == 0 || !(llhttpQueue.map { Self.isHead($0.first!) } ?? true),
            var queue = llhttpQueue.take()
        {
            let part = queue.removeFirst()
            if case .end = part { llhttpQueuedEnds -= 1 }
            if !queue.isEmpty { llhttpQueue = queue }
            toGeneralPath(part, context: context)
        }
        endReadBatchIfFired()
        front?.feedLLHTTP(nil)
        endReadBatchIfFired()
        resumeReadsIfHeld()
    }

    /// A request handed over to the general path has all come and waits for its answer there.
    var waitsForGeneralPath: Bool { life.waitsForGeneralPath(exchangeNow) }

    /// Parts of requests read ahead, waiting their turn, hold one whole request: the front reads
    /// no more of the connection's bytes until the handler gets to it (a flood of pipelined
    /// requests costs one read's bytes, not a parsed request each).
    var queueFull: Bool { queuedEnds > 0 }
    /// The `.end`s in ``queued``.
    var queuedEnds = 0

    /// A part of a request, from the front: handled now, or queued while the request before it
    /// waits for its answer (ours, or one handed over to the general path).
    func receive(_ part: ClientRequestParser.Part) {
        if waitsForGroup || life.queues(exchangeNow, alreadyQueued: queued != nil) {
            var parts = queued.take() ?? []
            parts.append(part)
            if case .end = part { queuedEnds += 1 }
            queued = parts
            return
        }
        handle(part)
    }

    func handle(_ part: ClientRequestParser.Part) {
        guard context != nil else { return }
        if case .other(let bytes) = part {
            // The front reads no more of this connection: llhttp does, for the general path.
            life.llhttpTakesRest()
            if ensureGeneralPath() { front?.feedLLHTTP(bytes) }
            endReadBatchIfFired()
            return
        }
        if life.replaying {
            switch part {
            case .body(let bytes): front?.toLLHTTP(replayingChunked ? HTTP1Bytes.chunkFramed(bytes) : bytes)
            case .end:
                if replayingChunked { front?.toLLHTTP(HTTP1Bytes.lastChunk) }
                life.replayEnded()
            case .malformed: closeConnection()  // (llhttp is mid-body: nothing can follow)
            case .head, .other: break  // not before the end
            }
            endReadBatchIfFired()
            return
        }
        if let request {
            requestPart(part, of: request)
            return
        }
        guard case .head(let head, let length) = part else {
            // Parts of a request already abandoned (its answer ended before its body).
            return
        }
        let taken = life.takesRequests ? takes(head, length: length) : .generalPath
        let path: String
        let mayConcern: Bool
        switch taken {
        case .generalPath:
            handOver(raw: head.raw, parts: [], ended: false, chunked: length == ClientRequestParser.chunked)
            return
        case .lookUpGroup(let uid, let gate):
            lookUpGroup(part, uid: uid, gate: gate)
            return
        case .refuse(let refusedPath, let refusal):
            // The body (within the limit) is read and dropped, then the refusal answers it; one
            // too large is answered at once, and the connection closes. So is a body the client
            // holds back until it hears `100 Continue` (`Expect: 100-continue`): it would wait
            // for a word while the gateway waits for its body (RFC 9110 §10.1.1: a final status
            // instead of 100, and the body need not be read).
            let request = ForwardedRequest(
                head: head, path: refusedPath, declaredLength: length, mayConcern: false,
                configuration: gateway.configuration)
            self.request = request
            gateway.metrics.gatewayRefused.increment()
            let atOnce =
                length > gateway.configuration.maxRequestBytes
                || (length != 0 && Self.expectation(head) == .continue100)
            return run(request.exchange.refuse(refusal, atOnce: atOnce), for: request)
        case .forward(let forwardedPath, let concern):
            path = forwardedPath
            mayConcern = concern
        }
        request = ForwardedRequest(
            head: head, path: path, declaredLength: length, mayConcern: mayConcern,
            configuration: gateway.configuration)
        // `Expect: 100-continue`: the client waits for a word before it sends its body (curl: a
        // second, for bodies past 1 MiB); the gateway reads it, so it says so now, as nginx does
        // (the server is never asked: `Expect` does not travel upstream). Any other expectation
        // is one the gateway cannot meet: 417 (RFC 9110).
        switch Self.expectation(head) {
        case .none: break
        case .continue100: if length != 0 { sendContinue() }
        case .unmet:
            if let request { run(request.exchange.respond(.expectationFailed), for: request) }
        }
    }

    /// `100 Continue`, written to the client at once (no answer of the connection is in
    /// progress: a request is taken only once the one before it has been answered).
    func sendContinue() {
        guard let rawOutput else { return }
        flushToClient()
        rawOutput.writeAndFlush(NIOAny(ByteBuffer(bytes: Self.continueLine)), promise: nil)
    }

    static let continueLine = Array("HTTP/1.1 100 Continue\r\n\r\n".utf8)

    /// Handles the queued parts, in order, until a request waits for its answer; then has the
    /// front parse the bytes it held back, up to one more request.
    func drainQueue() {
        guard !draining else { return }
        draining = true
        defer { draining = false }
        while true {
            while request?.clientEnded != true, !waitsForGeneralPath, !waitsForGroup, var parts = queued.take() {
                let part = parts.removeFirst()
                if case .end = part { queuedEnds -= 1 }
                if !parts.isEmpty { queued = parts }
                handle(part)
            }
            guard !queueFull, !waitsForGroup, let front, front.holdsUnread, context != nil else { break }
            front.readHeld()
        }
        endReadBatchIfFired()
        resumeReadsIfHeld()
    }

    /// Answer and request both ended: the connection takes the next request.
    func finished(_ request: ForwardedRequest) {
        guard self.request === request else { return }
        self.request = nil
        if !request.keepAlive {
            closeConnection()
            return
        }
        idleSince = .now()
        drainQueue()
        closeIfDone()
    }

    /// The client went away (or the handler left): the upstream connection is closed, not reused.
    func abandon() {
        guard let request else { return }
        self.request = nil
        if case .none = request.exchange.clientGone() { return }
        end(request, upstream: .close, client: .gone)
    }
}
