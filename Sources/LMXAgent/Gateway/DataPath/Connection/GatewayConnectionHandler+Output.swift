import LMXCore
import LMXProbe
import LMXSystem
import NIOCore
import NIOHTTP1
import Prometheus

extension GatewayConnectionHandler {
    // MARK: Answers to the client

    /// The head of an answer of the data path, as bytes: the status line, the headers `write`
    /// writes, and the framing for this client — chunked only when the answer has no length and
    /// the client speaks HTTP/1.1; to an HTTP/1.0 client such a body runs until the connection
    /// closes; nothing after the head of an answer to `HEAD`, or of a 204 or 304.
    func answerHead(
        _ request: ForwardedRequest, status: HTTPResponseStatus, sized: Bool, estimate: Int = 512,
        headers write: (inout HeadLines) -> Void
    ) -> ByteBuffer {
        let code = status.code
        let bodiless = request.head.method == .HEAD || code == 204 || code == 304 || code < 200
        let framing: ClientFraming =
            bodiless || sized ? .asIs : request.head.minor >= 1 ? .chunked : .untilClose
        request.framing = framing
        if framing == .untilClose { request.keepAlive = false }
        let chunked = framing == .chunked
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
    static let securityHeaderLines: [UInt8] = GatewayPolicy.securityHeaders.flatMap { name, value in
        Array("\(name): \(value)\r\n".utf8)
    }

    /// Writes a part of an answer of the data path to the client as bytes, past SwiftNIO's HTTP/1
    /// response encoder (through its context): the encoder frames only the general path's
    /// answers, to requests llhttp read (``ClientFront``).
    /// Small parts are gathered and written as one at the flush (``flushToClient()``).
    func writeToClient(_ part: ClientOutput, for request: ForwardedRequest) {
        guard let output = rawOutput else { return }
        clientUnflushed = true
        let chunked = request.framing == .chunked
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
    func flushToClient() {
        // Not again when nothing was written since (an answer that ends in a read batch is
        // flushed as it ends, and the batch's end would flush nothing through the pipeline).
        guard clientUnflushed else { return }
        clientUnflushed = false
        if let rawOutput { withGathered { $0.write(to: rawOutput) } }
        context?.flush()
    }

    /// `change` made to what is gathered, moved out of the handler into a local and back.
    func withGathered(_ change: (inout Gathered) -> Void) {
        var gathered = Gathered()
        swap(&gathered, &self.gathered)
        change(&gathered)
        swap(&gathered, &self.gathered)
    }
}
