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

    private let dataPath: GatewayDataPath
    private let gateway: Gateway
    private let state: GatewayDataPath.LoopState
    /// Whose the connection is, asked of the kernel when first needed.
    private let peer: PeerUser
    private let overTCP: Bool
    private var context: ChannelHandlerContext?
    /// The front's context: the data path's answers are written through it as bytes
    /// (``writeToClient``), past SwiftNIO's HTTP/1 response encoder (between the front and this
    /// handler once the general path is set up).
    private var rawOutput: ChannelHandlerContext?
    /// Something was written to the client (``writeToClient(_:for:)``) since the last flush.
    private var clientUnflushed = false
    /// Sets up the general path behind this handler (once).
    private let startGeneralPath: (any Channel) throws -> Void
    private var generalPathStarted = false
    /// The server is stopping or the client closed its side: the connection closes once idle.
    private var closeWhenIdle = false
    /// The client closed its side: a request whose body has not ended can never end.
    private var inputClosed = false
    /// Closes the connection once the daemon's shutdown grace is over.
    private var shutdownTimer: Scheduled<Void>?
    /// How long the client may stay silent (``GatewayConfiguration/clientTimeout``).
    private let clientTimeout: TimeAmount
    /// The bytes the connection had read when the idle timer last fired in the middle of a
    /// request with a read asked for: none more by the next firing, and the client has stalled.
    private var bytesSeen: Int?
    /// A read is asked of the socket and no bytes have come since (false while reads are held,
    /// here or by the general path).
    var readAsked = false
    /// Bytes of answers' bodies written to the client on this connection so far.
    private var answerBytesWritten = 0
    /// The same for the answer, while the client could take no more of it.
    private var answerSeen: Int?

    // (Properties that a call the compiler cannot see into changes — `ByteBuffer`'s writes, a
    // collection's growth — are changed through locals moved out of them and back: an access to a
    // class's property that spans such a call is checked at run time, about 70 instructions.)

    /// Parts of the data path's answers written since the last flush (``writeToClient``).
    private var gathered = Gathered()
    /// The request this handler is forwarding, if any.
    private var request: ForwardedRequest?
    /// llhttp is in the middle of a request (its parts go to the general path as they come).
    private var passing = false
    /// The rest of a request handed over goes to llhttp as it arrives.
    private var replaying = false
    /// The front left the rest of the connection to llhttp: nothing more is forwarded here.
    private var llhttpOnly = false
    /// Where requests come from, and where bytes for llhttp go.
    var front: ClientFront?
    /// Requests handed over whose answer has not ended.
    private var handedOver = 0
    /// Parts read after the current request (pipelined): handled once it is done (nil: none).
    private var queued: CircularBuffer<ClientRequestParser.Part>?
    private var draining = false
    private var readPending = false
    /// The gateway closed the connection (this handler, or one behind it on the general path):
    /// a close it did not make while an answer was awaited is the client's (``countIfClientLeft()``).
    private var closing = false
    /// Parts were passed to the general path since the last read batch ended.
    private var firedRead = false
    /// The connection's slot in its loop's ``ConnectionSweep`` while it is open.
    private var sweepSlot: Int?
    /// When the sweep is next to look at the connection (its client timeout; set as it is added).
    private(set) var nextCheck = NIODeadline.distantFuture
    /// When the connection last became idle (no request in progress).
    private var idleSince = NIODeadline.now()

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
    private func ensureGeneralPath() -> Bool {
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
    private var idle: Bool { request == nil && handedOver == 0 && !passing && !replaying }

    private func closeIfDone() {
        if inputClosed, nothingQueued, let request, !request.clientEnded {
            // The client closed its side before the body's end: the request can never be whole
            // (nginx: "client prematurely closed connection").
            return bodyNotWhole(
                request, status: 400, code: "request_body_incomplete",
                message:
                    "the client closed its side of the connection after \(request.received) of the body's \(request.declaredLength) bytes"
            )
        }
        if closeWhenIdle, idle, nothingQueued { closeConnection() }
    }

    /// The client closed its side while a request of ours waits for (or streams) its answer. A
    /// client that has closed its whole connection (an SDK's timeout, Ctrl-C, a process that
    /// ended) and one that has only ended its side (`shutdown(SHUT_WR)`, still reading) look the
    /// same on the connection until something is written to it. On a Unix socket the kernel
    /// tells them apart (a whole close hangs the connection up, and SwiftNIO closes it); on a TCP
    /// connection from this machine the client's own socket does, in the kernel's tables: one
    /// its process has closed is held by no file. A client that has left has its request cut at
    /// the server, which stops working on it (nginx cuts it on either close); one that only
    /// ended its side gets its answer. The client's socket is looked at again a moment later
    /// when it seemed held: its FIN can come before its process has quite let go of it.
    private func cutIfClientLeft(lookAgain: Bool) {
        // A request of ours whose body has all come, or one handed over to the general path
        // (closing the connection cancels its task, and with it the request to the server).
        let awaited = request.map(\.clientEnded) ?? (handedOver > 0)
        guard awaited, overTCP, let channel = context?.channel,
            let local = channel.localAddress?.bytesAndPort, let remote = channel.remoteAddress?.bytesAndPort
        else { return }
        switch SocketOwner.peerSocket(peer: remote, local: local) {
        case .closed:
            break
        case .absent where SocketOwner.isLoopback(remote.address):
            break  // a loopback peer's socket is on this machine: gone
        case .held where lookAgain:
            let current = request
            context?.eventLoop.assumeIsolated().scheduleTask(in: .milliseconds(100)) { [self] in
                if self.request === current { self.cutIfClientLeft(lookAgain: false) }
            }
            return
        case .held, .absent, .unknown:
            return
        }
        gateway.metrics.gatewayClientsLeft.increment()
        gateway.logger.info(
            "gateway: a client closed its connection before its answer ended; the request to the server is cut")
        closeConnection()
    }

    /// Closes the client's connection (noted: not the client's leaving).
    private func closeConnection() {
        closing = true
        context?.close(promise: nil)
    }

    /// The connection ended, or failed, without the gateway closing it: if an answer was awaited
    /// (a request of ours whose body had all come, or one handed over), its client left — a Unix
    /// socket's client hung up, a TCP client reset its connection. Counted as
    /// ``cutIfClientLeft(lookAgain:)`` counts a TCP client's close (the request to the server is cut
    /// as the connection goes: ``abandon()``).
    private func countIfClientLeft() {
        guard !closing else { return }
        let awaited = (request.map { $0.clientEnded && $0.phase != .done } ?? false) || handedOver > 0
        guard awaited else { return }
        closing = true
        gateway.metrics.gatewayClientsLeft.increment()
        gateway.logger.info(
            "gateway: a client's connection ended before its answer did; the request to the server is cut")
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
            closeWhenIdle = true
            if !stopping {
                inputClosed = true
            } else if shutdownTimer == nil {
                // What is in progress gets the grace, not more: the daemon always stops.
                shutdownTimer = context.eventLoop.assumeIsolated().scheduleTask(in: GatewayChildChannel.shutdownGrace) {
                    [self] in
                    self.closeConnection()
                }
            }
            if generalPathStarted, handedOver > 0 || passing { context.fireUserInboundEventTriggered(event) }
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
        if mode == .all { closing = true }
        context.close(mode: mode, promise: promise)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if let rawOutput { withGathered { $0.write(to: rawOutput) } }  // (empty: answers are flushed as they end)
        // The general path's answers pass through; when the last one ends, the next request is ours.
        if case .end = unwrapOutboundIn(data), handedOver > 0 {
            handedOver -= 1
            context.write(data, promise: promise)
            if idle {
                idleSince = .now()
                if closeWhenIdle { context.flush() }
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

    /// No request waits: none queued here, no bytes held back by the front.
    private var nothingQueued: Bool { queued == nil && front?.holdsUnread != true }

    /// Reads wait while parts are queued or bytes wait to be parsed, while a connection is being
    /// made, and while the upstream cannot take more of the body.
    private var holdsReads: Bool {
        if !nothingQueued { return true }
        guard let request, !request.clientEnded else { return false }
        if request.phase == .connecting || request.phase == .waiting { return true }
        if let upstream = request.upstream, !upstream.channel.isWritable { return true }
        return false
    }

    private func resumeReadsIfHeld() {
        guard readPending, !holdsReads, let context else { return }
        readPending = false
        readAsked = true
        context.read()
    }

    /// Parts of requests llhttp read: all go to the general path.
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = unwrapInboundIn(data)
        guard ensureGeneralPath() else { return }
        switch part {
        case .head:
            handedOver += 1
            gateway.metrics.gatewayHandedOver.increment()
            passing = true
        case .body: break
        case .end: passing = false
        }
        firedRead = true
        context.fireChannelRead(data)
    }

    /// A request handed over to the general path has all come and waits for its answer there:
    /// the requests after it wait their turn here. (Not once llhttp reads the connection by
    /// itself, nor while it is in the middle of a request: its bytes go to it as they come.)
    private var waitsForGeneralPath: Bool {
        request == nil && handedOver > 0 && !replaying && !passing && !llhttpOnly
    }

    /// Parts of requests read ahead, waiting their turn, hold one whole request: the front reads
    /// no more of the connection's bytes until the handler gets to it (a flood of pipelined
    /// requests costs one read's bytes, not a parsed request each).
    var queueFull: Bool { queuedEnds > 0 }
    /// The `.end`s in ``queued``.
    private var queuedEnds = 0

    /// A part of a request, from the front: handled now, or queued while the request before it
    /// waits for its answer (ours, or one handed over to the general path).
    func receive(_ part: ClientRequestParser.Part) {
        if queued != nil || (request?.clientEnded == true) || waitsForGeneralPath {
            var parts = queued.take() ?? []
            parts.append(part)
            if case .end = part { queuedEnds += 1 }
            queued = parts
            return
        }
        handle(part)
    }

    private func handle(_ part: ClientRequestParser.Part) {
        guard context != nil else { return }
        if case .other(let bytes) = part {
            // The front reads no more of this connection: llhttp does, for the general path.
            llhttpOnly = true
            if ensureGeneralPath() { front?.toLLHTTP(bytes) }
            endReadBatchIfFired()
            return
        }
        if replaying {
            switch part {
            case .body(let bytes): front?.toLLHTTP(bytes)
            case .end: replaying = false
            case .head, .other: break  // not before the end
            }
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
        guard handedOver == 0, !passing, let (path, mayConcern) = takes(head, length: length) else {
            handOver(raw: head.raw, parts: [], ended: false)
            return
        }
        request = ForwardedRequest(head: head, path: path, declaredLength: length, mayConcern: mayConcern)
        // The client waits for a word before it sends its body (curl: a second, for bodies past
        // 1 MiB): the gateway reads it, so it says so now. (The server is never asked: `Expect`
        // does not travel upstream.)
        if length > 0, head.contains(.expect) { sendContinue() }
    }

    /// `100 Continue`, written to the client at once (no answer of the connection is in
    /// progress: a request is taken only once the one before it has been answered).
    private func sendContinue() {
        guard let rawOutput else { return }
        flushToClient()
        rawOutput.writeAndFlush(NIOAny(ByteBuffer(bytes: Self.continueLine)), promise: nil)
    }

    private static let continueLine = Array("HTTP/1.1 100 Continue\r\n\r\n".utf8)

    /// Handles the queued parts, in order, until a request waits for its answer; then has the
    /// front parse the bytes it held back, up to one more request.
    private func drainQueue() {
        guard !draining else { return }
        draining = true
        defer { draining = false }
        while true {
            while request?.clientEnded != true, !waitsForGeneralPath, var parts = queued.take() {
                let part = parts.removeFirst()
                if case .end = part { queuedEnds -= 1 }
                if !parts.isEmpty { queued = parts }
                handle(part)
            }
            guard !queueFull, let front, front.holdsUnread, context != nil else { break }
            front.readHeld()
        }
        endReadBatchIfFired()
        resumeReadsIfHeld()
    }

    // MARK: Deciding

    /// The requests this handler forwards itself: plain `/v1/` requests with nothing that needs
    /// the general path's waits or checks (`length`: the body's, as the front read it). Its path
    /// (the target without the query) when it is one; nil for the others. (No path under `/v1/`
    /// is the dashboard's: ``DashboardPolicy/resource(path:)``.)
    private func takes(_ head: ClientHead, length: Int) -> (path: String, mayConcern: Bool)? {
        guard !llhttpOnly, gateway.groupGate == nil, let path = Self.plainV1Path(head.uri) else { return nil }
        // (Most paths can concern no object: told in one pass, and the request keeps the answer.)
        let mayConcern = ServerAffinity.mayConcern(path: path)
        guard !mayConcern || !ServerAffinity.answerMakes(method: head.method.rawValue, path: path) else { return nil }
        // `Expect: 100-continue` (one, from an HTTP/1.1 client) is answered here as the request is
        // taken (``sendContinue()``), as nginx does; any other expectation goes to the general path.
        if head.contains(.expect) {
            guard head.minor == 1, head.all("expect").count == 1,
                head.first(.expect)?.lowercased() == "100-continue"
            else { return nil }
        }
        // (The rules read a few headers by name, all of them known ones: when none but Host came,
        // as from API clients, they are not looked for one by one.)
        let header: (String) -> String? = head.contains(anyOf: Self.refusalHeaderBits) ? head.first : { _ in nil }
        if GatewayPolicy.refusal(
            method: head.method.rawValue, path: path, authority: head.first(.host), header: header,
            adminEnabled: gateway.configuration.admin, overTCP: overTCP,
            localhostIsOurs: gateway.listeners.localhostIsOurs) != nil
        {
            return nil
        }
        return length <= gateway.configuration.maxRequestBytes ? (path, mayConcern) : nil
    }

    /// The headers the policy reads (``GatewayPolicy/refusalHeaders``) but Host, which it is
    /// given, as the head's bits.
    /// (Should the policy read a header that is not a known one, every request looks them up.)
    static let refusalHeaderBits = ClientHead.bits(of: GatewayPolicy.refusalHeaders.subtracting(["host"])) ?? .max

    /// The path (the target without its query) of a `/v1/` target with no percent-encoding,
    /// fragment or dot-dot anywhere (those go to the general path, which reads them as the policy
    /// does); nil for any other target. One pass over the bytes (walking `String.UTF8View` cost
    /// about 30 instructions a byte).
    static func plainV1Path(_ uri: String) -> String? {
        var uri = uri
        // Where the path ends (the query's `?`, or the end); nil: not a plain `/v1/` target.
        let end = uri.withUTF8 { bytes -> Int? in
            guard bytes.count >= 4, bytes[0] == UInt8(ascii: "/"), bytes[1] == UInt8(ascii: "v"),
                bytes[2] == UInt8(ascii: "1"), bytes[3] == UInt8(ascii: "/")
            else { return nil }
            var previousDot = false
            var query: Int?
            for index in bytes.indices {
                let byte = bytes[index]
                if byte == UInt8(ascii: "%") || byte == UInt8(ascii: "#") { return nil }
                let dot = byte == UInt8(ascii: ".")
                if dot, previousDot { return nil }
                previousDot = dot
                if byte == UInt8(ascii: "?"), query == nil { query = index }
            }
            return query ?? bytes.count
        }
        guard let end else { return nil }
        return end == uri.utf8.count ? uri : String(decoding: uri.utf8.prefix(end), as: UTF8.self)
    }

    private func requestPart(_ part: ClientRequestParser.Part, of request: ForwardedRequest) {
        switch part {
        case .head, .other:
            return  // not after a head without its end
        case .body(let chunk):
            request.received += chunk.readableBytes
            if request.received > gateway.configuration.maxRequestBytes {
                tooLarge(request)
                return
            }
            switch request.phase {
            case .collecting:
                request.add(chunk)
                // The body's last byte came with this part: its end follows at once, and the
                // request is decided then; nothing waits to be read ahead.
                if request.received == request.declaredLength { break }
                if request.received >= gateway.configuration.readAheadBytes
                    || !request.reservation(from: gateway.readAhead, for: peer).take(chunk.readableBytes)
                {
                    decide(request)
                }
            case .connecting, .waiting:
                request.add(chunk)
            case .forwarding:
                request.upstream?.handler.sendBody(chunk)
            case .done:
                break  // the answer ended before the body: the rest is read and dropped
            }
        case .end:
            request.clientEnded = true
            switch request.phase {
            case .collecting: decide(request)
            case .connecting, .waiting: break
            case .forwarding:
                request.upstream?.handler.sendEnd()
                request.upstream?.handler.flush()
                releaseHeldAnswer(request)
            case .done:
                releaseHeldAnswer(request)
                finished(request)
            }
        }
    }

    private func decide(_ request: ForwardedRequest) {
        let method = request.head.method.rawValue
        let path = request.path
        // The body so far, as one array: only when the model is not in its first part alone (a
        // prefix with the whole field reads as the whole body does), or the path may name an
        // object whose field is read from the body.
        var joined: [UInt8]?
        func body() -> [UInt8] {
            if let joined { return joined }
            var bytes: [UInt8] = []
            bytes.reserveCapacity(request.received)
            for chunk in request.parts { bytes.append(contentsOf: chunk.readableBytesView) }
            joined = bytes
            return bytes
        }
        var model: String?
        if method == "POST", let first = request.parts.first {
            // A key the gateway reads, named twice or spelled with escapes, would be read
            // differently by the server (JSONBodyKeys): refused, never guessed.
            let ambiguous =
                request.parts.count == 1
                ? first.withUnsafeReadableBytes { JSONBodyKeys.ambiguous(in: $0) } : JSONBodyKeys.ambiguous(in: body())
            if let ambiguous {
                gateway.metrics.gatewayRefused.increment()
                return respond(
                    request, status: 400, code: "ambiguous_body",
                    message: Gateway.ambiguousBodyMessage(key: ambiguous))
            }
            model = first.withUnsafeReadableBytes { ModelField.find(in: $0) }
            if model == nil, request.parts.count > 1 { model = ModelField.find(in: body()) }
        }
        let mayConcern = request.mayConcern
        if mayConcern, ServerAffinity.named(method: method, path: path, body: method == "POST" ? body() : []) != nil {
            return handOver(request)
        }
        request.model = model
        // (GatewayPolicy.clientKeyHeaders, looked up as literals.)
        request.clientHasKey = request.head.contains(.authorization) || request.head.contains(.xAPIKey)
        if mayConcern {
            request.madeByRequest = ServerAffinity.madeByRequest(
                method: method, path: path, body: method == "POST" ? body() : [])
        }
        route(request)
    }

    /// Plans the request's routes and sends it to the first; while no route is usable it is
    /// held (``hold(_:)``) and planned again. A refusal of the plan's (a model only untrusted
    /// servers have, a key the request needs) is worded by the general path.
    private func route(_ request: ForwardedRequest) {
        let plan = state.plan(
            model: request.model, clientHasKey: request.clientHasKey, limit: gateway.configuration.attempts)
        guard case .forward(let routes) = plan else { return handOver(request) }
        if routes.isEmpty { return hold(request) }
        var targets = gateway.load.order(routes)
        if !request.clientEnded { targets = Array(targets.prefix(1)) }
        // Only routes the data path connects to, while the loop has connections to spare, and
        // whose keys can be written as they are (upstream heads are not checked again: the
        // client's headers were parsed as headers, the rest is ours).
        guard let first = targets.first, let address = state.address(first.baseURL),
            state.pool.openCount(address) < dataPath.connectionsPerLoop,
            targets.allSatisfy({ $0.credentials.isHeaderSafe })
        else { return handOver(request) }
        request.targets = targets
        request.countInFlight(gateway.metrics.gatewayInFlight)
        gateway.metrics.gatewayRequests.increment()
        attempt(request, index: 0, address: address)
    }

    /// No route is usable (mid-failover, just after a wake): the request waits up to
    /// `gateway.hold_seconds` for one, planned again every 25 ms on the loop's copy of the
    /// agent's state, while the agent probes every endpoint (asked at once, then each second);
    /// then 503 with why. Reads from the client wait meanwhile; a client that leaves drops it.
    private func hold(_ request: ForwardedRequest) {
        guard let context else { return }
        let now = NIODeadline.now()
        if request.phase != .waiting {
            request.phase = .waiting
            request.heldUntil = now + .milliseconds(Int64(gateway.configuration.holdSeconds * 1000))
            request.nextNudge = now
        }
        guard now < request.heldUntil else {
            gateway.metrics.gatewayFailures.increment()
            return respond(
                request, status: 503, code: "no_endpoint",
                message: Gateway.noEndpointMessage(
                    holdSeconds: gateway.configuration.holdSeconds, reason: state.snapshot.noActiveReason),
                retryAfter: 2)
        }
        if now >= request.nextNudge {
            request.nextNudge = now + .seconds(1)
            let manager = gateway.agent.manager
            Task { await manager.gatewayWaiting() }
        }
        context.eventLoop.assumeIsolated().scheduleTask(in: .milliseconds(25)) { [self] in
            guard self.request === request, request.phase == .waiting else { return }
            self.route(request)
        }
    }

    /// The request goes to the general path as it came: its bytes (head, the body so far) to
    /// llhttp, the rest as it arrives; then the requests read after it.
    private func handOver(_ request: ForwardedRequest) {
        self.request = nil
        handOver(raw: request.head.raw, parts: request.parts, ended: request.clientEnded)
        drainQueue()
    }

    private func handOver(raw: ByteBuffer, parts: [ByteBuffer], ended: Bool) {
        guard let front, ensureGeneralPath() else { return }
        // llhttp reads it (its parts come back through channelRead, to the general path).
        front.toLLHTTP(raw)
        for part in parts { front.toLLHTTP(part) }
        replaying = !ended
        endReadBatchIfFired()
    }

    /// The general path's handlers deliver what they were given when a read batch ends: parts
    /// given to them outside a read of the client's (a queued request handled once the one before
    /// it ended, a busy server's handover during its answer) get an end of their own.
    private func endReadBatchIfFired() {
        guard firedRead, let context else { return }
        firedRead = false
        context.fireChannelReadComplete()
    }

    // MARK: Forwarding

    /// Sends the request to route `index` (at `known`, when its address was just read), over a
    /// kept connection unless `fresh`.
    private func attempt(
        _ request: ForwardedRequest, index: Int, fresh: Bool = false, address known: UpstreamAddress? = nil
    ) {
        guard self.request === request, index < request.targets.count else { return }
        let target = request.targets[index]
        request.onKeptConnection = false
        guard let address = known ?? state.address(target.baseURL) else {
            return failed(request, index: index, detail: "the route's address is not usable here", error: nil)
        }
        if index > 0 { gateway.metrics.gatewayRetries.increment() }
        request.attempt = index
        request.countOnRoute(state.routeCount(target.routeKey, in: gateway.load))
        request.phase = .connecting
        if !fresh, let connection = state.pool.takeIdle(address) {
            request.onKeptConnection = true
            return send(request, over: connection, target: target)
        }
        let timeout =
            target.via == .lan ? gateway.configuration.connectTimeout : max(gateway.configuration.connectTimeout, 8)
        let pool = state.pool
        pool.connect(address, timeout: .milliseconds(Int64(timeout * 1000))).assumeIsolated().whenComplete {
            [self] result in
            switch result {
            case .success(let channel):
                guard self.request === request, let connection = try? pool.adopt(channel, address: address) else {
                    channel.close(promise: nil)
                    return
                }
                self.gateway.metrics.gatewayUpstreamConnections[target.via]?.increment()
                self.send(request, over: connection, target: target)
            case .failure(let error):
                guard self.request === request else { return }
                let failure = Prober.classify(error)
                self.failed(request, index: index, detail: failure.detail, error: error, certainlyNotSent: true)
            }
        }
    }

    private func send(_ request: ForwardedRequest, over connection: UpstreamConnection, target: GatewayTarget) {
        request.upstream = connection
        request.phase = .forwarding
        connection.handler.owner = self
        // The request's head written straight into bytes: the names are the client's (read as
        // tokens, their values as visible ASCII by ``ClientRequestParser``), the route's (checked
        // by `isHeaderSafe` before the request was taken) and ours.
        let handler = connection.handler
        // Which of the client's headers go on (``GatewayPolicy/upstreamHeaders``), decided on their
        // names' bytes; the kept lines are copied from the client's bytes.
        // (The route's rule for `/v1/` paths, made once, when it applies: nearly always.)
        let listed =
            request.head.contains(.connection)
            ? GatewayPolicy.connectionListed(request.head.all("connection")) ?? [] : []
        let rule =
            listed.isEmpty && !Credentials.isOpen(path: request.path)
            ? target.inferenceRule
            : GatewayPolicy.UpstreamHeaderRule(
                connectionListed: listed, credentials: target.credentials, path: request.path)
        // The body's framing: its length when known (all of it read, or declared), else chunked.
        let length: Int? =
            request.clientEnded
            ? (request.received > 0 || !Self.bodilessMethod(request.head.method) ? request.received : nil)
            : (request.declaredLength > 0 ? request.declaredLength : nil)
        let chunked = !request.clientEnded && length == nil
        // (Room for a small body too: its parts are gathered after the head, in the same buffer.)
        let body = request.received <= HTTP1Bytes.gatherLimit ? request.received : 0
        let bytes = HeadLines.make(
            context?.channel.allocator ?? ByteBufferAllocator(), estimate: request.head.raw.readableBytes + 512 + body
        ) { out in
            out.add(request.head.method.rawValue)
            out.add(" ")
            out.add(request.head.uri)
            out.add(" HTTP/1.1\r\nHost: ")
            out.add(connection.address.authority)
            out.add("\r\n")
            out.clientHeaders(request.head, keeping: rule, userAgent: Gateway.userAgent)
            if let length {
                out.add("Content-Length: ")
                out.add(decimal: length)
                out.add("\r\n")
            } else if chunked {
                out.add("Transfer-Encoding: chunked\r\n")
            }
            out.add("\r\n")
        }
        // (Let go of here: the body parts that follow are added to the same buffer, which must be
        // held by nothing else, or the first of them copies it.)
        handler.sendHead(consume bytes, toHEAD: request.head.method == .HEAD, chunkedBody: chunked)
        for part in request.parts { handler.sendBody(part) }
        if request.clientEnded {
            handler.sendEnd()
        } else {
            // Sent on as it arrives: nothing of it is kept, and the request can never go again.
            request.parts = []
            request.bodyPassedOn = true
        }
        handler.flush()
        resumeReadsIfHeld()
    }

    /// Methods whose requests carry no body unless they say so (no `Content-Length: 0` added).
    static func bodilessMethod(_ method: HTTPMethod) -> Bool {
        switch method {
        case .GET, .HEAD, .OPTIONS, .DELETE: true
        default: false
        }
    }

    /// The route failed before any byte of an answer: the next one if the request certainly
    /// did not arrive (or may safely arrive twice) and its body is whole; else 502.
    private func failed(
        _ request: ForwardedRequest, index: Int, detail: String, error: (any Error)?, certainlyNotSent: Bool = false
    ) {
        let target = request.targets[index]
        request.leaveRoute()
        if let upstream = request.upstream {
            upstream.handler.owner = nil
            upstream.channel.close(promise: nil)
            request.upstream = nil
        }
        // One rule (RetryRule): a kept connection that ended with no answer most likely closed
        // idle as the request went, which says nothing about the route: a request safe to send
        // twice goes again at once on a new connection to the same route, once. Nothing goes
        // again without its whole body.
        let next = RetryRule.decide(
            certainlyNotSent ? .notSent : request.onKeptConnection ? .keptConnectionClosed : .failedBeforeAnswer,
            method: request.head.method.rawValue, bodyWhole: request.bodyWhole, attempt: index,
            routes: request.targets.count, resentOnNewConnection: request.resentOnNewConnection)
        if next == .sameRouteNewConnection {
            request.resentOnNewConnection = true
            gateway.metrics.gatewayRetries.increment()
            gateway.logger.info(
                "gateway: a kept connection closed unanswered; the request goes again on a new one",
                metadata: ["route": "\(target.routeID)", "reason": "\(detail)"])
            return attempt(request, index: index, fresh: true)
        }
        let manager = gateway.agent.manager
        let routeID = target.routeID
        Task { await manager.gatewayFailed(routeID, reason: detail) }
        gateway.logger.notice(
            "gateway: route failed before answering",
            metadata: [
                "route": "\(routeID)", "reason": "\(detail)", "retry": "\(next == .nextRoute)",
                // The system call and errno behind the summary (no request data in it).
                "error": "\(error.map { String(String(describing: $0).prefix(300)) } ?? "-")",
            ])
        if next == .nextRoute {
            return attempt(request, index: index + 1)
        }
        gateway.metrics.gatewayFailures.increment()
        gateway.agent.traffic.answered(
            model: request.model, via: target.via, status: 502, firstByte: nil, answered: false)
        respond(
            request, status: 502, code: "upstream_unreachable",
            message: "the Opta LMX server could not be reached (\(detail)); the agent is probing it again")
    }

    /// An answer of the gateway's own, in the OpenAI error shape.
    /// Written as bytes like forwarded answers (SwiftNIO's encoder sees only the general path's).
    private func respond(
        _ request: ForwardedRequest, status: Int, code: String, message: String, retryAfter: Int? = nil
    ) {
        guard context != nil else { return }
        let body = ByteBuffer(bytes: Gateway.errorBody(code: code, message: message))
        request.keepAlive = request.head.keepAlive && request.clientEnded
        request.holdsAnswer = false
        let head = answerHead(request, status: .init(statusCode: status), sized: true) { out in
            out.add("Content-Type: application/json\r\nCache-Control: no-store\r\n")
            if let retryAfter {
                out.add("Retry-After: ")
                out.add(decimal: retryAfter)
                out.add("\r\n")
            }
            out.add(Self.securityHeaderLines)
            out.add("Content-Length: ")
            out.add(decimal: body.readableBytes)
            out.add("\r\n")
        }
        writeToClient(.head(head), for: request)
        if request.head.method != .HEAD { writeToClient(.body(body), for: request) }
        writeToClient(.end, for: request)
        flushToClient()
        request.phase = .done
        request.releaseCounts()
        if request.clientEnded { finished(request) } else { closeConnection() }
    }

    private func tooLarge(_ request: ForwardedRequest) {
        gateway.metrics.gatewayRefused.increment()
        bodyNotWhole(
            request, status: 413, code: "request_too_large",
            message:
                "request bodies are limited to \(gateway.configuration.maxRequestBytes) bytes (gateway.max_request_bytes)"
        )
    }

    /// The request's body will not reach the server whole (too large, cut, stalled): the server's
    /// connection is closed (it sees the body cut, never a request that looks whole), and the
    /// client gets `status` unless its answer has begun to go out; then the connection closes.
    private func bodyNotWhole(_ request: ForwardedRequest, status: Int, code: String, message: String) {
        if let upstream = request.upstream {
            upstream.handler.owner = nil
            upstream.channel.close(promise: nil)
            request.upstream = nil
        }
        if request.holdsAnswer {
            // Nothing of the answer reached the client yet: the refusal replaces it.
            request.holdsAnswer = false
            request.heldAnswer = []
            request.answerStarted = false
        }
        guard !request.answerStarted else {
            closeConnection()
            return
        }
        respond(request, status: status, code: code, message: message)
    }

    // MARK: The answer

    func upstreamRead(_ part: UpstreamResponseParser.Part) {
        guard let request, context != nil, let upstream = request.upstream else { return }
        switch part {
        case .head(let head):
            if head.status < 200 { return }  // 100 Continue and other interim answers (the parser skips them)
            let target = request.targets[request.attempt]
            // What the rules read of the answer's headers, read with the head.
            let read = head.read
            if let cooldown = RouteLoad.busyCooldown(
                code: head.status, retryAfter: read.retryAfter, cap: gateway.configuration.busyCooldownMax)
            {
                gateway.load.coolDown(target.routeKey, seconds: cooldown)
                if RetryRule.decide(
                    .busy, method: request.head.method.rawValue, bodyWhole: request.bodyWhole,
                    attempt: request.attempt, routes: request.targets.count, resentOnNewConnection: false) == .nextRoute
                {
                    // Another server may take it: the general path hands it over (and answers
                    // with this server's own answer if none does).
                    upstream.handler.owner = nil
                    upstream.channel.close(promise: nil)
                    request.upstream = nil
                    request.releaseCounts()
                    gateway.logger.info(
                        "gateway: server busy, trying the next",
                        metadata: ["route": "\(target.routeID)", "status": "\(head.status)"])
                    return handOver(request)
                }
            }
            if (200..<300).contains(head.status), let instance = target.instanceID,
                let made = request.madeByRequest
            {
                gateway.affinity.record(made, on: instance, user: peer.uid)
            }
            let events = read.eventStream
            if events { request.relay = EventRelay() }
            let series = TrafficTap(
                traffic: gateway.agent.traffic, model: request.model, started: request.started
            )
            .answered(target.via, status: head.status, stream: events, recent: state.recentTraffic)
            request.traffic = series
            state.recentTraffic = series
            // GatewayPolicy.downstreamHeaders, one header at a time, copied from the server's
            // bytes straight into the head's (the names and values read strictly by
            // ``UpstreamResponseParser``: tokens, no line breaks or control characters; and ours).
            upstream.keepFor = .seconds(Int64(read.keepAlive.seconds))
            let length = read.contentLength
            let connectionListed = read.connectionListed
            request.keepAlive = request.head.keepAlive
            let bytes = head.bytes.withUnsafeReadableBytes { raw in
                // (Room for a small body, or a stream's first events: gathered after the head,
                // in the same buffer; growing it cost about 1,000 instructions.)
                answerHead(
                    request, status: .init(statusCode: head.status), sized: length != nil,
                    estimate: raw.count + 320 + min(length ?? 1024, HTTP1Bytes.gatherLimit)
                ) { out in
                    for field in head.fields where field.kept {
                        let name = UnsafeRawBufferPointer(rebasing: raw[field.name])
                        if !connectionListed.isEmpty,
                            !GatewayPolicy.keepsDownstream(nameBytes: name, connectionListed: connectionListed)
                        {
                            continue
                        }
                        out.add(name)
                        out.add(": ")
                        out.add(UnsafeRawBufferPointer(rebasing: raw[field.value]))
                        out.add("\r\n")
                    }
                    if let length {
                        out.add("Content-Length: ")
                        out.add(decimal: length)
                        out.add("\r\n")
                    }
                    out.add(Self.securityHeaderLines)
                    out.header("X-LMX-Via", target.via.rawValue)
                }
            }
            request.answerStarted = true
            // An answer that comes before the client has sent its whole body (a server that
            // answers without reading it) is held until the body has come, as nginx does: many
            // clients cannot read an answer while they are still writing. Bounded.
            request.holdsAnswer = !request.clientEnded
            emit(.head(bytes), for: request)
        case .body(let chunk):
            guard request.answerStarted else { return }
            if let relay = request.relay {
                relay.pass(chunk) { emit(.body($0), for: request) }
            } else {
                emit(.body(chunk), for: request)
            }
        case .end:
            guard request.answerStarted else { return }
            if let relay = request.relay {
                let (rest, cut) = relay.finish()
                if cut { return streamLost(request, error: Gateway.StreamEndedMidEvent()) }
                if let rest { emit(.body(rest), for: request) }
                if let series = request.traffic {
                    TrafficTap(traffic: gateway.agent.traffic, model: request.model, started: request.started)
                        .streamed(series: series, relay.tally)
                }
            }
            emit(.end, for: request)
            flushToClient()
            request.phase = .done
            upstream.handler.owner = nil
            request.upstream = nil
            // The pool keeps it only when the whole request went to the server (as nginx's
            // upstream keep-alive: a body cut short would leave the server reading the next
            // request as its rest) and the parser found the answer whole and the connection
            // reusable (``UpstreamPool/release``).
            if request.clientEnded {
                state.pool.release(upstream)
            } else {
                upstream.channel.close(promise: nil)
            }
            request.releaseCounts()
            if request.clientEnded {
                finished(request)
            } else {
                resumeReadsIfHeld()  // the rest of the body is read and dropped
            }
        }
    }

    /// The largest answer held while the client is still sending its body; past it, the answer
    /// goes as it comes.
    static let maxHeldAnswer = 1 << 20

    /// Writes a part of the answer to the client, or holds it (see ``ForwardedRequest/holdsAnswer``).
    private func emit(_ part: ClientOutput, for request: ForwardedRequest) {
        guard context != nil else { return }
        if request.holdsAnswer {
            if case .body(let bytes) = part { request.heldBytes += bytes.readableBytes }
            request.hold(part)
            if request.heldBytes <= Self.maxHeldAnswer { return }
            releaseHeldAnswer(request)
            return
        }
        writeToClient(part, for: request)
    }

    /// The head of an answer of the data path, as bytes: the status line, the headers `write`
    /// writes, and the framing for this client — chunked only when the answer has no length and
    /// the client speaks HTTP/1.1; to an HTTP/1.0 client such a body runs until the connection
    /// closes; nothing after the head of an answer to `HEAD`, or of a 204 or 304.
    private func answerHead(
        _ request: ForwardedRequest, status: HTTPResponseStatus, sized: Bool, estimate: Int = 512,
        headers write: (inout HeadLines) -> Void
    ) -> ByteBuffer {
        let code = status.code
        let bodiless = request.head.method == .HEAD || code == 204 || code == 304 || code < 200
        request.chunkedToClient = !bodiless && !sized && request.head.minor >= 1
        if !bodiless, !sized, !request.chunkedToClient { request.keepAlive = false }
        let chunked = request.chunkedToClient
        let keepAlive = request.keepAlive
        return HeadLines.make(context?.channel.allocator ?? ByteBufferAllocator(), estimate: estimate) { out in
            out.add("HTTP/1.1 ")
            out.add(decimal: Int(code))
            out.add(" ")
            out.add(status.reasonPhrase)
            out.add("\r\n")
            write(&out)
            if chunked { out.add("Transfer-Encoding: chunked\r\n") }
            if !keepAlive { out.add("Connection: close\r\n") }
            out.add("\r\n")
        }
    }

    /// ``GatewayPolicy/securityHeaders`` as header lines, made once.
    private static let securityHeaderLines: [UInt8] = GatewayPolicy.securityHeaders.flatMap { name, value in
        Array("\(name): \(value)\r\n".utf8)
    }

    /// Writes a part of an answer of the data path to the client as bytes, past SwiftNIO's HTTP/1
    /// response encoder (through its context): the encoder frames only the general path's
    /// answers, to requests llhttp read (``ClientFront``).
    /// Small parts are gathered and written as one at the flush (``flushToClient()``).
    private func writeToClient(_ part: ClientOutput, for request: ForwardedRequest) {
        guard let output = rawOutput else { return }
        clientUnflushed = true
        let chunked = request.chunkedToClient
        switch part {
        case .head(let bytes):
            withGathered { $0.add(head: bytes) }
        case .body(let bytes):
            answerBytesWritten &+= bytes.readableBytes
            withGathered { $0.add(bytes, chunked: chunked, to: output) }
        case .end:
            if chunked { withGathered { $0.add(HTTP1Bytes.lastChunk, chunked: false, to: output) } }
        }
    }

    /// Sends what was written to the client.
    private func flushToClient() {
        // Not again when nothing was written since (an answer that ends in a read batch is
        // flushed as it ends, and the batch's end would flush nothing through the pipeline).
        guard clientUnflushed else { return }
        clientUnflushed = false
        if let rawOutput { withGathered { $0.write(to: rawOutput) } }
        context?.flush()
    }

    /// `change` made to what is gathered, moved out of the handler into a local and back.
    private func withGathered(_ change: (inout Gathered) -> Void) {
        var gathered = Gathered()
        swap(&gathered, &self.gathered)
        change(&gathered)
        swap(&gathered, &self.gathered)
    }

    /// Writes what was held of the answer, and holds no more.
    private func releaseHeldAnswer(_ request: ForwardedRequest) {
        guard request.holdsAnswer, context != nil else { return }
        request.holdsAnswer = false
        let held = request.heldAnswer
        request.heldAnswer = []
        request.heldBytes = 0
        for part in held { writeToClient(part, for: request) }
        flushToClient()
    }

    func upstreamReadComplete() {
        flushToClient()
    }

    func upstreamWritable() {
        resumeReadsIfHeld()
    }

    /// The upstream connection closed or failed while this request held it.
    func upstreamClosed(_ error: (any Error)?) {
        guard let request, request.upstream != nil else { return }
        if !request.answerStarted {
            let detail = error.map { Prober.classify($0).detail } ?? "the server closed the connection"
            return failed(request, index: request.attempt, detail: detail, error: error)
        }
        if request.relay != nil {
            return streamLost(request, error: error ?? Gateway.StreamEndedMidEvent())
        }
        // An answer cut in the middle: the client gets what came, then sees its connection
        // close, as from the server.
        request.upstream?.handler.owner = nil
        releaseHeldAnswer(request)
        flushToClient()
        request.upstream = nil
        request.releaseCounts()
        request.phase = .done
        self.request = nil
        closeConnection()
    }

    /// A stream of events lost mid-answer: ended with an `error` event naming the route, and the
    /// agent probes it again.
    private func streamLost(_ request: ForwardedRequest, error: any Error) {
        guard context != nil, let relay = request.relay else { return }
        let target = request.targets[request.attempt]
        if let upstream = request.upstream {
            upstream.handler.owner = nil
            upstream.channel.close(promise: nil)
            request.upstream = nil
        }
        emit(.body(relay.lost(target: target, error: error)), for: request)
        emit(.end, for: request)
        flushToClient()
        if let series = request.traffic {
            TrafficTap(traffic: gateway.agent.traffic, model: request.model, started: request.started)
                .streamed(series: series, relay.tally)
        }
        let manager = gateway.agent.manager
        let routeID = target.routeID
        Task { await manager.gatewayFailed(routeID, reason: "a stream was cut mid-answer") }
        request.phase = .done
        request.releaseCounts()
        if request.clientEnded {
            finished(request)
        } else {
            resumeReadsIfHeld()
        }
    }

    /// Answer and request both ended: the connection takes the next request.
    private func finished(_ request: ForwardedRequest) {
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
    private func abandon() {
        guard let request else { return }
        self.request = nil
        if let upstream = request.upstream {
            upstream.handler.owner = nil
            upstream.channel.close(promise: nil)
        }
        request.releaseCounts()
    }

    /// The loop's sweep looks at the connection after `delay` (one timer for the loop's
    /// connections, not one per connection or per request): ``sweepDue()``.
    private func checkAgain(in delay: TimeAmount? = nil) {
        nextCheck = .now() + (delay ?? clientTimeout)
    }

    private func leaveSweep() {
        guard let sweepSlot else { return }
        self.sweepSlot = nil
        state.sweep.remove(sweepSlot)
    }

    /// Closes the connection when it has been idle for the whole timeout, else looks again at the
    /// rest of it; answers 408 when the body of the request in progress has not moved for a whole
    /// period though it was being read (reads held for the server's sake do not count against the
    /// client).
    func sweepDue() {
        guard context != nil else { return leaveSweep() }
        let busy = request != nil || handedOver > 0 || passing
        let deadline = idleSince + clientTimeout
        if !busy, deadline <= .now() {
            closeConnection()
            return
        }
        // In the middle of a request (ours, or one llhttp reads for the general path), waiting
        // for the client's bytes (as nginx's `client_body_timeout`).
        let midRequest = (request.map { !$0.clientEnded } ?? false) || passing || replaying
        if midRequest, readAsked, let read = front?.bytesRead {
            if let bytesSeen, bytesSeen == read {
                gateway.logger.info(
                    "gateway: a client sent nothing of its request for gateway.client_timeout; its connection is closed"
                )
                if let request, !request.clientEnded {
                    return bodyNotWhole(
                        request, status: 408, code: "request_timeout",
                        message:
                            "no byte of the request's body came for \(clientTimeout.nanoseconds / 1_000_000_000) s (gateway.client_timeout)"
                    )
                }
                closeConnection()
                return
            }
            bytesSeen = read
        } else {
            bytesSeen = nil
        }
        if let request, request.answerStarted, !request.holdsAnswer, !clientWritable {
            // The client takes nothing of its answer (as nginx's `send_timeout`): the server's
            // connection is not held for it any longer.
            if let answerSeen, answerSeen == answerBytesWritten {
                gateway.logger.info(
                    "gateway: a client took nothing of its answer for gateway.client_timeout; its connection is closed")
                closeConnection()
                return
            }
            answerSeen = answerBytesWritten
        } else {
            answerSeen = nil
        }
        checkAgain(in: busy ? clientTimeout : deadline - .now())
    }
}

/// A part of an answer of the data path, as written to the client (its head already bytes).
enum ClientOutput {
    case head(ByteBuffer)
    case body(ByteBuffer)
    case end
}

/// A request the data path forwards, from its head to its answer's end.
final class ForwardedRequest {
    /// Reading ahead; waiting for a usable route (``GatewayConnectionHandler/hold(_:)``);
    /// connecting; sending and answering; answered.
    enum Phase { case collecting, waiting, connecting, forwarding, done }

    /// The head, with its bytes as the client sent them (given to llhttp if the request is handed over).
    let head: ClientHead
    let path: String
    /// The path may name or make an object of one server (``ServerAffinity/mayConcern(path:)``).
    let mayConcern: Bool
    /// When its head came (``SystemClock/monotonic()``: the traffic figures' start).
    let started = SystemClock.monotonic()
    /// What the body read ahead holds of the shared budget (made with the first body part).
    private var reservation: ReadAheadBudget.Reservation?
    var phase = Phase.collecting
    /// The body read ahead (while collecting), then what arrives while connecting.
    var parts: [ByteBuffer] = []
    var received = 0
    /// The body's length as the client declared it (0: none).
    let declaredLength: Int
    var clientEnded = false
    var model: String?
    /// The client brings a key of its own (`Authorization`, `X-Api-Key`).
    var clientHasKey = false
    /// While no route is usable (``Phase/waiting``), held until then.
    var heldUntil = NIODeadline.distantFuture
    /// When the agent is next asked to probe everything for it.
    var nextNudge = NIODeadline.distantPast
    var madeByRequest: ServerObject?
    var targets: [GatewayTarget] = []
    var attempt = 0
    var upstream: UpstreamConnection?
    /// The connection it went on was kept from an earlier answer (it may have been closing).
    var onKeptConnection = false
    /// Sent again on a new connection after a kept one closed unanswered (once at most).
    var resentOnNewConnection = false
    /// Its body was passed on as it came (longer than the read-ahead): it can never be sent again.
    var bodyPassedOn = false
    /// The gateway holds the whole body (all of it came, none passed on yet): the request can go again.
    var bodyWhole: Bool { clientEnded && !bodyPassedOn }
    var keepAlive = true
    var answerStarted = false
    /// The answer goes to the client chunked (it had no length, and the client speaks HTTP/1.1).
    var chunkedToClient = false
    /// The answer is held until the client's body has come (``GatewayConnectionHandler/emit``).
    var holdsAnswer = false
    var heldAnswer: [ClientOutput] = []
    var heldBytes = 0
    var relay: EventRelay?
    /// The traffic figures' series the answer was counted under (its stream's figures go under it).
    var traffic: GatewayTraffic.Series?
    /// The gateway's in-flight gauge, while it counts this request.
    var inFlight: Gauge?
    /// The route's count of requests in flight, while it counts this request.
    var routeCount: RouteLoad.Count?

    init(head: ClientHead, path: String, declaredLength: Int, mayConcern: Bool) {
        self.head = head
        self.declaredLength = declaredLength
        self.path = path
        self.mayConcern = mayConcern
    }

    /// Keeps a part of the body (the array moved out and back: its growth spans a call the
    /// compiler cannot see into, which would make every access to it checked at run time).
    func add(_ chunk: ByteBuffer) {
        var parts: [ByteBuffer] = []
        swap(&parts, &self.parts)
        parts.append(chunk)
        swap(&parts, &self.parts)
    }

    /// Holds a part of the answer (as ``add(_:)``).
    func hold(_ part: ClientOutput) {
        var held: [ClientOutput] = []
        swap(&held, &heldAnswer)
        held.append(part)
        swap(&held, &heldAnswer)
    }

    func reservation(from budget: ReadAheadBudget, for peer: PeerUser) -> ReadAheadBudget.Reservation {
        if let reservation { return reservation }
        let made = budget.reservation(for: peer.uid)
        reservation = made
        return made
    }

    /// Counted in flight (the gateway's gauge) from now until released.
    func countInFlight(_ gauge: Gauge) {
        guard inFlight == nil else { return }
        gauge.increment()
        inFlight = gauge
    }

    /// Counted against `count` (its route's) from now until released, and no longer against the
    /// route it was counted against before.
    func countOnRoute(_ count: RouteLoad.Count) {
        count.add()
        routeCount?.remove()
        routeCount = count
    }

    /// No longer counted against its route (the attempt on it failed).
    func leaveRoute() {
        routeCount?.remove()
        routeCount = nil
    }

    /// No longer counted in flight, on the gateway or its route.
    func releaseCounts() {
        inFlight?.decrement()
        inFlight = nil
        leaveRoute()
    }

    deinit { releaseCounts() }
}
