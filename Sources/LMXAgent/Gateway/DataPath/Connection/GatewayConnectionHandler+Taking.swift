import LMXCore
import LMXProbe
import LMXSystem
import NIOCore
import NIOHTTP1
import Prometheus

extension GatewayConnectionHandler {
    // MARK: Taking a request

    /// What becomes of a request whose head came: every request but the dashboard's is forwarded
    /// or refused here (the policy says which: `/v1/`, and `/admin/` with `gateway.admin`, are
    /// forwarded); the dashboard's are answered by the general path. With
    /// `gateway.group`, a user the gate has no fresh answer for is looked up first, off the
    /// event loop (``lookUpGroup(_:uid:gate:)``).
    func takes(_ head: ClientHead, length: Int) -> Taken {
        // A bad request (RFC 9112 §3.2): answered at once, and the connection closes after it,
        // as nginx does (nothing behind such a head is read as a request).
        if head.hostTwice {
            return .refuse(
                head.uri,
                .refused(
                    status: 400, code: "bad_request",
                    message: "the request has more than one Host header (RFC 9112 section 3.2): send one"),
                closing: true)
        }
        // Over TCP the policy reads the Host (requests addressed to loopback only): a request
        // without one is a bad request too (for HTTP/1.1, and HTTP/1.0 is told the same).
        if overTCP, head.known & ClientHead.Known.host.rawValue == 0 {
            let refusal = GatewayPolicy.noHost
            return .refuse(
                head.uri, .refused(status: refusal.status, code: refusal.code, message: refusal.message), closing: true)
        }
        guard let target = Self.forwardedTarget(head.uri) else { return .generalPath }
        guard case .path(let path) = target else {
            return .refuse(
                head.uri,
                .refused(
                    status: 400, code: "bad_target",
                    message: "a request target carries no fragment (#...): send the path and query alone"))
        }
        if let gate = gateway.groupGate {
            let member: Bool
            if let uid = peer.uid {
                guard let known = groupMember(uid, gate) else { return .lookUpGroup(uid, gate) }
                member = known
            } else {
                member = false
            }
            if !member {
                return .refuse(
                    path,
                    .refused(
                        status: 403, code: "forbidden",
                        message: "only members of the group \(gate.group) may use this gateway"))
            }
        }
        // (Most paths can concern no object: told in one pass.)
        let mayConcern = ServerAffinity.mayConcern(path: path)
        // (The rules read a few headers by name, all of them known ones: when none but Host came,
        // as from API clients, they are not looked for one by one.)
        let header: (String) -> String? = head.contains(anyOf: Self.refusalHeaderBits) ? head.first : { _ in nil }
        if let refusal = GatewayPolicy.refusal(
            method: head.method.rawValue, path: path, authority: head.first(.host), header: header,
            adminEnabled: gateway.adminEnabled, overTCP: overTCP,
            localhostIsOurs: gateway.listeners.localhostIsOurs)
        {
            return .refuse(path, .refused(status: refusal.status, code: refusal.code, message: refusal.message))
        }
        guard length <= gateway.maxRequestBytes else {
            return .refuse(path, .tooLarge(limit: gateway.maxRequestBytes))
        }
        return .forward(path, mayConcern: mayConcern)
    }

    /// What becomes of a request whose head came (``takes(_:length:)``).
    enum Taken {
        /// Forwarded by this handler.
        case forward(String, mayConcern: Bool)
        /// Refused by this handler, in the policy's words; `closing`: at once, the connection
        /// closing after the answer.
        case refuse(String, GatewayExchange.Refusal, closing: Bool = false)
        /// `gateway.group`: the user's membership must be looked up before the request is taken.
        case lookUpGroup(UInt32, GroupMembership)
        /// Answered by the general path: the dashboard's.
        case generalPath
    }

    /// What the client's `Expect` asks (HTTP/1.0 clients' are ignored, as RFC 9110 says).
    enum Expectation { case none, continue100, unmet }

    static func expectation(_ head: ClientHead) -> Expectation {
        guard head.contains(.expect), head.minor == 1 else { return .none }
        let all = head.all("expect")
        return all.count == 1 && all[0].value.lowercased() == "100-continue" ? .continue100 : .unmet
    }

    /// The headers the policy reads (``GatewayPolicy/refusalHeaders``) but Host, which it is
    /// given, as the head's bits.
    /// (Should the policy read a header that is not a known one, every request looks them up.)
    static let refusalHeaderBits = ClientHead.bits(of: GatewayPolicy.refusalHeaders.subtracting(["host"])) ?? .max

    /// A target the data path takes: its path (the target without its query), or one that
    /// carries a fragment (refused).
    enum ForwardedTarget: Equatable {
        case path(String)
        case fragment
    }

    /// The path of a target (the target without its query), or `.fragment` for one that
    /// carries a fragment; nil for the dashboard's (``DashboardPolicy/resource(path:)``), which
    /// the general path answers. Every other target is the data path's, to forward or refuse:
    /// what the path may hold (dot segments, encoded separators, a path outside `/v1/`, `/admin/`
    /// while `gateway.admin` is off) is the policy's to say
    /// (``GatewayPolicy/refusal(method:path:authority:header:adminEnabled:overTCP:localhostIsOurs:)``).
    /// One pass over the bytes (walking `String.UTF8View` cost about 30 instructions a byte).
    static func forwardedTarget(_ uri: String) -> ForwardedTarget? {
        var uri = uri
        // Where the path ends (the query's `?`, or the end), -1 for a fragment; and whether the
        // target is under `/v1/` (no dashboard path is).
        let (end, v1) = uri.withUTF8 { bytes -> (Int, Bool) in
            let v1 =
                bytes.count >= 4 && bytes[0] == UInt8(ascii: "/") && bytes[1] == UInt8(ascii: "v")
                && bytes[2] == UInt8(ascii: "1") && bytes[3] == UInt8(ascii: "/")
            var query: Int?
            for index in bytes.indices {
                let byte = bytes[index]
                if byte == UInt8(ascii: "#") { return (-1, v1) }
                if byte == UInt8(ascii: "?"), query == nil { query = index }
            }
            return (query ?? bytes.count, v1)
        }
        if end < 0 { return .fragment }
        let path = end == uri.utf8.count ? uri : String(decoding: uri.utf8.prefix(end), as: UTF8.self)
        if !v1, DashboardPolicy.resource(path: path) != nil { return nil }
        return .path(path)
    }

    /// The exchange's request goes to the general path as it came (the plan leaves it to the
    /// general path): its bytes (head, the body so far) to llhttp, the rest as it arrives; then
    /// the requests read after it.
    func handOver(_ exchange: UpstreamExchange) {
        guard self.exchange === exchange else { return }
        self.exchange = nil
        let request = exchange.request
        handOver(
            raw: request.head.raw, parts: request.parts, ended: request.clientEnded,
            chunked: request.machine.declaredLength == ClientRequestParser.chunked)
        drainQueue()
    }
    func handOver(raw: ByteBuffer, parts: [ByteBuffer], ended: Bool, chunked: Bool) {
        guard let front, ensureGeneralPath() else { return }
        // llhttp reads it (its parts come back through channelRead, to the general path); a
        // chunked body framed again as chunks.
        front.toLLHTTP(raw)
        for part in parts { front.toLLHTTP(chunked ? HTTP1Bytes.chunkFramed(part) : part) }
        if ended, chunked { front.toLLHTTP(HTTP1Bytes.lastChunk) }
        life.handedToLLHTTP(ended: ended)
        replayingChunked = chunked
        endReadBatchIfFired()
    }

    /// The general path's handlers deliver what they were given when a read batch ends: parts
    /// given to them outside a read of the client's (a queued request handled once the one before
    /// it ended, a busy server's handover during its answer) get an end of their own.
    func endReadBatchIfFired() {
        guard firedRead, let context else { return }
        firedRead = false
        context.fireChannelReadComplete()
    }
}
