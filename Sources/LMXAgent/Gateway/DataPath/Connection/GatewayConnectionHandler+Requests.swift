import LMXCore
import NIOCore
import NIOHTTP1

/// The client's requests as the front reads them: taken one at a time, in order, the next one
/// read only once the one before it is answered.
extension GatewayConnectionHandler {
    /// Parts of requests read ahead, waiting their turn, hold one whole request: the front reads
    /// no more of the connection's bytes until the handler gets to it (a flood of pipelined
    /// requests costs one read's bytes, not a parsed request each).
    /// (Also once the connection is closing: nothing more is parsed.)
    var queueFull: Bool { queuedEnds > 0 || lingering }

    /// A part of a request, from the front: handled now, or queued while the request before it
    /// waits for its answer (ours, or one handed over to the general path).
    func receive(_ part: ClientRequestParser.Part) {
        // Closing (a refusal that ends the connection): what came behind it is not a request.
        if lingering { return }
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
        if case .headTooLarge = part {
            // (The front reads nothing more of the connection.)
            let refusal = GatewayPolicy.headTooLarge(limit: ClientRequestParser.maxHead)
            return refuseAndClose(status: 431, code: refusal.code, message: refusal.message)
        }
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
            case .head, .other, .headTooLarge: break  // not before the end
            }
            endReadBatchIfFired()
            return
        }
        if let exchange {
            exchange.receive(part)
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
        case .refuse(let refusedPath, let refusal, let closing):
            // The body (within the limit) is read and dropped, then the refusal answers it; one
            // too large is answered at once, and the connection closes. So is a body the client
            // holds back until it hears `100 Continue` (`Expect: 100-continue`): it would wait
            // for a word while the gateway waits for its body (RFC 9110 §10.1.1: a final status
            // instead of 100, and the body need not be read).
            let exchange = startExchange(head, path: refusedPath, declaredLength: length, mayConcern: false)
            gateway.metrics.gatewayRefused.increment()
            let atOnce =
                closing || length > gateway.maxRequestBytes
                || (length != 0 && Self.expectation(head) == .continue100)
            return exchange.perform(exchange.request.machine.refuse(refusal, atOnce: atOnce, closing: closing))
        case .forward(let forwardedPath, let concern):
            path = forwardedPath
            mayConcern = concern
        }
        let exchange = startExchange(head, path: path, declaredLength: length, mayConcern: mayConcern)
        // `Expect: 100-continue`: the client waits for a word before it sends its body (curl: a
        // second, for bodies past 1 MiB); the gateway reads it, so it says so now, as nginx does
        // (the server is never asked: `Expect` does not travel upstream). Any other expectation
        // is one the gateway cannot meet: 417 (RFC 9110).
        switch Self.expectation(head) {
        case .none: break
        case .continue100: if length != 0 { sendContinue() }
        case .unmet: exchange.perform(exchange.request.machine.respond(.expectationFailed))
        }
    }

    /// `100 Continue`, written to the client at once (no answer of the connection is in
    /// progress: a request is taken only once the one before it has been answered).
    /// The exchange for the request just read, held as this connection's current one.
    private func startExchange(_ head: ClientHead, path: String, declaredLength: Int, mayConcern: Bool)
        -> UpstreamExchange
    {
        let exchange = UpstreamExchange(
            ForwardedRequest(
                head: head, path: path, declaredLength: declaredLength, mayConcern: mayConcern,
                configuration: gateway.configuration, maxBodyBytes: gateway.maxRequestBytes),
            client: self)
        self.exchange = exchange
        return exchange
    }

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
            while exchange?.request.clientEnded != true, !waitsForGeneralPath, !waitsForGroup, var parts = queued.take()
            {
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
}
