import LMXCore
import NIOCore

/// HTTP/1.1 to a server (``UpstreamProtocol``), the last handler of an upstream connection
/// (behind TLS for a tunnel): writes the request of the exchange that holds the connection
/// straight into bytes (``HeadLines``, ``Gathered``), reads its answer with the data path's own
/// parser (``UpstreamResponseParser``), hands the answer's parts to that exchange, and reads only
/// while its client can take more.
final class HTTP1Upstream: ChannelDuplexHandler, UpstreamProtocol {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// The exchange that holds this connection (nil while idle).
    weak var owner: (any UpstreamOwner)?
    private(set) var context: ChannelHandlerContext?
    private var readPending = false
    // (The parser and the gathered bytes are changed through locals moved out of them and back
    // (``withParser(_:)``, ``withGathered(_:)``), as in ``EventRelay``: no access checked at run
    // time.)
    private var parser = UpstreamResponseParser()
    /// The request's body goes chunked (its length was not known when it went).
    private var chunkedBody = false
    /// What was written of the request since the last flush.
    private var gathered = Gathered()

    /// The connection may take another request (its answers so far were framed exactly).
    var reusable: Bool { parser.reusable }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard owner != nil, parser.inAnswer else {
            // A connection that speaks unasked: not reused.
            context.close(promise: nil)
            return
        }
        // The parts are handed on once the parser has read the whole batch: handing on the end
        // gives the connection back (and may send the next request on it), which must find the
        // parser done, and knowing whether bytes followed the answer.
        var parts: [UpstreamAnswerPart] = []
        // A head, a few chunks (a stream's first event, its `[DONE]`), the end: one allocation.
        parts.reserveCapacity(8)
        var failure: UpstreamResponseParser.Malformed?
        withParser { parser in
            do throws(UpstreamResponseParser.Malformed) {
                try parser.read(unwrapInboundIn(data)) { parts.append($0) }
            } catch {
                failure = error
            }
        }
        for part in parts { owner?.upstreamRead(part) }
        if let failure {
            owner?.upstreamClosed(failure)
            context.close(promise: nil)
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        owner?.upstreamReadComplete()
    }

    /// The answer's body ran until the server closed the connection: nothing tells its end from
    /// a cut.
    private(set) var endedByClose = false

    func channelInactive(context: ChannelHandlerContext) {
        // An answer whose body runs until the server closes ends here (a close that may as well
        // be a cut: ``endedByClose``).
        if withParser({ $0.closed() }) {
            endedByClose = true
            owner?.upstreamRead(.end)
        }
        owner?.upstreamClosed(nil)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        owner?.upstreamClosed(error)
        context.close(promise: nil)
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { owner?.upstreamWritable() }
        context.fireChannelWritabilityChanged()
    }

    func read(context: ChannelHandlerContext) {
        if let owner, !owner.clientWritable {
            readPending = true
        } else {
            context.read()
        }
    }

    /// The client can take more: the read held back goes ahead.
    func resumeReads() {
        guard readPending, let context else { return }
        readPending = false
        context.read()
    }

    /// Something was written (``send(_:)``, a body part, the end) since the last ``flush()``.
    private var unflushed = false

    /// Writes the request's head straight into bytes: the names are the client's (read as
    /// tokens, their values as visible ASCII by ``ClientRequestParser``), the route's (checked by
    /// `isHeaderSafe` before the request was taken) and ours; the kept lines are copied from the
    /// client's bytes.
    func send(_ request: UpstreamRequest) {
        let head = request.head
        let bytes = HeadLines.make(
            context?.channel.allocator ?? ByteBufferAllocator(),
            estimate: head.raw.readableBytes + 512 + request.bodyRoom
        ) { out in
            out.add(head.method.rawValue)
            out.add(" ")
            out.add(head.uri)
            out.add(" HTTP/1.1\r\nHost: ")
            out.add(request.authority)
            out.add("\r\n")
            out.clientHeaders(head, keeping: request.rule, userAgent: Gateway.userAgent)
            if request.identity { out.add("Accept-Encoding: identity\r\n") }
            if let key = request.idempotencyKey {
                out.add("Idempotency-Key: ")
                out.add(key)
                out.add("\r\n")
            }
            if let length = request.length {
                out.add("Content-Length: ")
                out.add(decimal: length)
                out.add("\r\n")
            } else if request.chunked {
                out.add("Transfer-Encoding: chunked\r\n")
            }
            out.add("\r\n")
        }
        // (Let go of here: the body parts that follow are added to the same buffer, which must be
        // held by nothing else, or the first of them copies it.)
        sendHead(consume bytes, toHEAD: head.method == .HEAD, chunkedBody: request.chunked)
    }

    /// Writes the request's head, as bytes (sent by ``flush()``); its body goes chunked when
    /// `chunkedBody`.
    private func sendHead(_ head: ByteBuffer, toHEAD: Bool, chunkedBody: Bool) {
        guard context != nil else { return }
        self.chunkedBody = chunkedBody
        withParser { $0.expectAnswer(toHEAD: toHEAD) }
        // (A request's bytes are always flushed before its answer ends: nothing is gathered.)
        gathered = Gathered(head: head)
        unflushed = true
    }

    /// Writes a part of the request's body.
    func sendBody(_ bytes: ByteBuffer) {
        guard let context else { return }
        let chunkedBody = chunkedBody
        withGathered { $0.add(bytes, chunked: chunkedBody, to: context) }
        unflushed = true
    }

    /// Ends the request.
    func sendEnd() {
        guard let context, chunkedBody else { return }
        withGathered { $0.add(HTTP1Bytes.lastChunk, chunked: false, to: context) }
        unflushed = true
    }

    /// Sends what was written since the last flush; nothing when nothing was (the client's read
    /// batch ends with a flush, after the request it brought was sent and flushed whole).
    func flush() {
        guard let context, unflushed else { return }
        unflushed = false
        withGathered { $0.write(to: context) }
        context.flush()
    }

    /// `change` made to the parser, moved out of the handler into a local and back.
    private func withParser<Result>(_ change: (inout UpstreamResponseParser) -> Result) -> Result {
        var parser = UpstreamResponseParser()
        swap(&parser, &self.parser)
        defer { swap(&parser, &self.parser) }
        return change(&parser)
    }

    /// `change` made to what is gathered, moved out of the handler into a local and back.
    private func withGathered(_ change: (inout Gathered) -> Void) {
        var gathered = Gathered()
        swap(&gathered, &self.gathered)
        change(&gathered)
        swap(&gathered, &self.gathered)
    }
}
