import LMXCore
import NIOCore

/// How an exchange (``UpstreamExchange``) speaks to a server over one connection: the request's
/// head and body written, the answer's parts read, the connection's fitness for another request.
/// The exchange's rules (connect, retry, pass, hold, resume, finish) know nothing of the wire;
/// HTTP/1.1 (``HTTP1Upstream``) is the first conformer, an HTTP/2 connection would be another
/// (nginx's split of `ngx_http_upstream.c` from `ngx_http_proxy_module.c`: `create_request`,
/// `process_header`, `input_filter`).
///
/// A conformer is the last handler of its connection's channel and is used only on its loop.
protocol UpstreamProtocol: AnyObject {
    /// The exchange that holds the connection now (nil while idle in the pool).
    var owner: (any UpstreamOwner)? { get set }
    /// The connection may take another request (its answers so far were framed exactly).
    var reusable: Bool { get }
    /// The last answer's body ran until the server closed the connection: nothing told its end
    /// from a cut.
    var endedByClose: Bool { get }
    /// Writes the request's head (sent by ``flush()``).
    func send(_ request: UpstreamRequest)
    /// Writes a part of the request's body.
    func sendBody(_ bytes: ByteBuffer)
    /// Ends the request.
    func sendEnd()
    /// Sends what was written since the last flush.
    func flush()
    /// The client can take more: a read of the answer held back goes ahead.
    func resumeReads()
}

/// What a connection's protocol tells the exchange that holds it.
protocol UpstreamOwner: AnyObject {
    /// A part of the answer, as it is whole.
    func upstreamRead(_ part: UpstreamAnswerPart)
    /// The parts of one read of the connection were all handed on.
    func upstreamReadComplete()
    /// The connection closed or failed (`error`: how it failed, if it did).
    func upstreamClosed(_ error: (any Error)?)
    /// The connection can take more of the request's body.
    func upstreamWritable()
    /// The client can take more of the answer (the server is read only while it can).
    var clientWritable: Bool { get }
}

/// A part of a server's answer, as a protocol hands it on: the head (interim answers skipped),
/// the body as the slices read (its transfer framing taken off), the end.
enum UpstreamAnswerPart {
    case head(UpstreamAnswerHead)
    case body(ByteBuffer)
    case end
}

/// A request as the exchange hands it to its server's protocol: the client's head, and what this
/// hop changes in it (which of its headers go on, the route's host and key, the body's framing).
struct UpstreamRequest {
    let head: ClientHead
    /// The server's authority (`Host`, `:authority`).
    let authority: String
    /// Which of the client's headers go on (``GatewayPolicy/upstreamHeaders``), and the route's key.
    let rule: GatewayPolicy.UpstreamHeaderRule
    /// The answer is asked for uncompressed (the stream is read event by event).
    let identity: Bool
    /// The `Idempotency-Key` the gateway adds (a run's creation that came without one).
    let idempotencyKey: String?
    /// The body's length when known (all of it read, or declared); nil: none, or chunked.
    let length: Int?
    /// The body goes as it comes, its length not known.
    let chunked: Bool
    /// Bytes of body that follow the head at once (room for them after the head).
    let bodyRoom: Int
}
