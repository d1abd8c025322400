import LMXCore
import NIOCore
import NIOHTTP1

/// The general path behind the handler (Hummingbird behind SwiftNIO's HTTP/1 handlers): set up
/// when a connection first needs it, given the requests llhttp reads one at a time, its answers
/// passed through on their way out.
extension GatewayConnectionHandler {
    /// The general path behind this handler, set up if it was not; false (and the connection
    /// closed) if it could not be.
    func ensureGeneralPath() -> Bool {
        if generalPathStarted { return true }
        guard let context else { return false }
        do {
            try startGeneralPath(context.channel)
            try context.channel.syncOptions?.setOption(.writeBufferWaterMark, value: Self.generalPathWaterMark)
            generalPathStarted = true
            return true
        } catch {
            gateway.logger.error(
                "gateway: could not set up a connection's general path", metadata: ["error": "\(error)"])
            closeConnection()
            return false
        }
    }

    /// How much of the connection's answers SwiftNIO holds while the client takes no more, once the
    /// general path is set up: Hummingbird writes its next answer only while the connection is
    /// writable, and with SwiftNIO's default (64 KiB) the answers to requests pipelined behind a
    /// head llhttp reads held 64 KiB, and more in their buffers' room to grow, per connection
    /// that did not read them. The kernel's send buffer takes most of an answer regardless.
    static let generalPathWaterMark = ChannelOptions.Types.WriteBufferWaterMark(low: 8 << 10, high: 16 << 10)

    /// llhttp could not read a request (a line ended by a bare LF, control bytes, a doubled
    /// `Content-Length`, a transfer coding other than chunked): with nothing else of the
    /// connection in progress, the gateway's own 400 in its JSON shape with the security headers,
    /// naming what was wrong; then the connection closes (nothing after a request that cannot be
    /// framed can be read). False when an answer is in progress: SwiftNIO's error then goes on
    /// to the general path, in the middle of its request.
    func refuseUnreadable(_ error: HTTPParserError) -> Bool {
        // (Not once the gateway closes the connection: llhttp's complaint about the bytes it is
        // left with then is no request of the client's.)
        if life.closing { return true }
        guard exchange == nil, life.handedOver == 0, rawOutput != nil, context != nil else { return false }
        let refusal = GatewayPolicy.unreadableRefusal
        refuseAndClose(status: 400, code: refusal.code, message: refusal.message)
        return true
    }

    /// The gateway's own error to a request it does not read (in its JSON shape, with the
    /// security headers and `Connection: close`), then the connection closes once it is written.
    /// Only when nothing else of the connection is in progress: else it closes at once.
    func refuseAndClose(status: Int, code: String, message: String) {
        guard let rawOutput, context != nil else { return }
        guard exchange == nil, life.handedOver == 0 else { return closeConnection() }
        let body = Gateway.errorBody(code: code, message: message)
        let head = HeadLines.make(rawOutput.channel.allocator, estimate: 512) { out in
            out.add("HTTP/1.1 ")
            out.add(decimal: status)
            out.add(" ")
            out.add(HTTPResponseStatus(statusCode: status).reasonPhrase)
            out.add("\r\nContent-Type: application/json\r\nCache-Control: no-store\r\n")
            out.add(Self.securityHeaderLines)
            out.add("Content-Length: ")
            out.add(decimal: body.count)
            out.add("\r\nConnection: close\r\n\r\n")
        }
        var answer = head
        answer.writeBytes(body)
        gateway.metrics.gatewayRefused.increment()
        life.closedByGateway()
        rawOutput.writeAndFlush(NIOAny(answer), promise: nil)
        lingerThenClose()
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if let rawOutput { withGathered { $0.write(to: rawOutput) } }  // (empty: answers are flushed as they end)
        if life.passing || life.llhttpOnly {
            // The general path answers a request whose body has not all come (a refusal to a
            // client waiting for `100 Continue`, or one that sends no more), or one the data
            // path's reader could not read: the connection closes after it, and says so (as
            // nginx closes after a bad request); what follows could not be told from that body,
            // and requests pipelined behind are not parsed for nothing.
            switch unwrapOutboundIn(data) {
            case .head(var head):
                head.headers.replaceOrAdd(name: "Connection", value: "close")
                context.write(wrapOutboundOut(.head(head)), promise: promise)
                return
            case .end:
                context.writeAndFlush(data, promise: promise)
                _ = life.generalPathAnswered(exchangeNow)
                lingerThenClose()
                return
            case .body:
                break
            }
        }
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
}
