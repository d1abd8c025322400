import LMXCore
import NIOCore
import NIOHTTP1

/// A server's answer head as the data path reads it: its bytes as they came, where each header is
/// in them, and what the rules read of them (``AnswerHeaders``), in the one pass that checks the
/// head. No `String` is made of a header the gateway only passes on: the kept ones are written to
/// the client from these bytes (read strictly by ``UpstreamResponseParser``: names are tokens,
/// values have no line breaks or control characters).
final class UpstreamAnswerHead {
    struct Field {
        /// Where the name and the value (without the spaces around it) are in ``bytes``.
        var name: Range<Int>
        var value: Range<Int>
        /// Not one the gateway drops (hop-by-hop, cookies, its own): ``GatewayPolicy/keepsDownstream(nameBytes:connectionListed:)``
        /// before what `Connection` lists is known.
        var kept: Bool
    }

    /// `HTTP/1.<minor>`.
    let minor: Int
    let status: Int
    /// The head, status line through the blank line.
    let bytes: ByteBuffer
    let fields: [Field]
    let read: AnswerHeaders

    /// (An object: the parser's parts are handed on, and copied, several times per answer; a
    /// struct of buffers, arrays and texts was retained and released whole at every copy.)
    init(minor: Int, status: Int, bytes: ByteBuffer, fields: [Field], read: AnswerHeaders) {
        self.minor = minor
        self.status = status
        self.bytes = bytes
        self.fields = fields
        self.read = read
    }

    /// The headers as text (tests, logs): the data path itself reads ``fields``.
    var headers: [(name: String, value: String)] {
        bytes.withUnsafeReadableBytes { raw in
            fields.map {
                (
                    String(decoding: UnsafeRawBufferPointer(rebasing: raw[$0.name]), as: UTF8.self),
                    String(decoding: UnsafeRawBufferPointer(rebasing: raw[$0.value]), as: UTF8.self)
                )
            }
        }
    }
}

/// What the data path reads of a server's answer's headers, as they are read: the
/// `Content-Length`, the first `Content-Type` and `Retry-After` (as `HTTPHeaders.first(name:)`
/// would give them), what `Connection` lists, and the keep-alive hints. `String`s are made only of
/// the few headers these need.
struct AnswerHeaders {
    var contentLength: Int?
    var retryAfter: String?
    var eventStream = false
    /// `Content-Type: application/json` (an answer the gateway may read an object's id from).
    var json = false
    /// The first non-blank `Location` (of a redirect, which ``ForeignAnswer`` judges).
    var location: String?
    /// A second non-blank `Location` that differs from the first (a field that may come once,
    /// RFC 9110 §10.2.2): judged too, so a blank or harmless first one hides no portal's.
    var otherLocation: String?
    private var contentTypeSeen = false
    /// What the first `Content-Type` says (``AnswerLabel/init(mediaType:)``, as the probes read it:
    /// `.none` when there is none), or a later one's page (``AnswerLabel/then(_:)``).
    private(set) var label = AnswerLabel.none
    /// A `Content-Encoding` other than `identity` came: the body is passed on as it is, never
    /// read or written into (``EventRelay``).
    var encoded = false
    var connectionListed: [String] = []
    var keepAlive = UpstreamKeepAlive()

    /// False when the `Connection` headers list more than ``GatewayPolicy/maxConnectionListed``
    /// names (the answer is refused: ``GatewayPolicy/connectionListed(_:)``).
    mutating func read(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> Bool {
        // Lengths first: most headers are none of these.
        switch name.count {
        case 12 where HTTPSyntax.equalsLowercased(name, "content-type"):
            guard !contentTypeSeen else {
                // A second one (``AnswerLabel/then(_:)``): a page's label wins.
                label = label.then(AnswerLabel(mediaType: value))
                break
            }
            contentTypeSeen = true
            eventStream =
                value.count >= 17
                && HTTPSyntax.equalsLowercased(UnsafeRawBufferPointer(rebasing: value[0..<17]), "text/event-stream")
            json =
                value.count >= 16
                && HTTPSyntax.equalsLowercased(UnsafeRawBufferPointer(rebasing: value[0..<16]), "application/json")
            label = AnswerLabel(mediaType: value)
        case 8 where otherLocation == nil && HTTPSyntax.equalsLowercased(name, "location"):
            // (The value's spaces are already trimmed: an empty one is blank.)
            guard !value.isEmpty else { break }
            let read = String(decoding: value.prefix(512), as: UTF8.self)
            if location == nil {
                location = read
            } else if read != location {
                otherLocation = read
            }
        case 16 where HTTPSyntax.equalsLowercased(name, "content-encoding"):
            if !value.isEmpty, !HTTPSyntax.equalsLowercased(value, "identity") { encoded = true }
        case 11 where retryAfter == nil && HTTPSyntax.equalsLowercased(name, "retry-after"):
            retryAfter = String(decoding: value, as: UTF8.self)
        case 6:
            // CF-RAY and Server (behind Cloudflare's edge): read from the bytes.
            if HTTPSyntax.equalsLowercased(name, "cf-ray") {
                keepAlive.readRayID(present: !value.isEmpty)
            } else if HTTPSyntax.equalsLowercased(name, "server") {
                // (The value's spaces are already trimmed.)
                keepAlive.readServer(isCloudflare: HTTPSyntax.equalsLowercased(value, "cloudflare"))
            }
        case 10:
            // `Connection: keep-alive` or `close` (the usual values) name no other header and say
            // nothing of how long the connection is kept: no `String`s. Otherwise, and
            // `Keep-Alive`, read as text by the rules they belong to.
            let connection = HTTPSyntax.equalsLowercased(name, "connection")
            guard connection || HTTPSyntax.equalsLowercased(name, "keep-alive") else { return true }
            if connection,
                HTTPSyntax.equalsLowercased(value, "keep-alive") || HTTPSyntax.equalsLowercased(value, "close")
            {
                return true
            }
            let name = String(decoding: name, as: UTF8.self)
            let value = String(decoding: value, as: UTF8.self)
            guard GatewayPolicy.addConnectionListed(name: name, value: value, to: &connectionListed) else {
                return false
            }
            keepAlive.read(name: name, value: value)
        default:
            break
        }
        return true
    }
}

/// The bytes of HTTP/1.1's grammar both sides of the data path read (RFC 9110 §5.6.2).
enum HTTPSyntax {
    /// A `tchar`: a byte of a token (header names, methods).
    static func isTokenByte(_ byte: UInt8) -> Bool {
        switch byte {
        case 0x30...0x39, 0x41...0x5A, 0x61...0x7A: true
        case UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"),
            UInt8(ascii: "'"), UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."),
            UInt8(ascii: "^"), UInt8(ascii: "_"), UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
            true
        default: false
        }
    }

    /// Whether `bytes` are `lower` (lowercase letters and `-`) in any case.
    static func equalsLowercased(_ bytes: some Collection<UInt8>, _ lower: StaticString) -> Bool {
        // Most names asked about differ in length: answered without reading a byte.
        // (A one-scalar literal has no pointer, nor a count without one.)
        guard !lower.hasPointerRepresentation || bytes.count == lower.utf8CodeUnitCount else { return false }
        return lower.withUTF8Buffer { expected in
            guard bytes.count == expected.count else { return false }
            var index = 0
            for byte in bytes {
                guard byte | 0x20 == expected[index] else { return false }
                index += 1
            }
            return true
        }
    }
}
