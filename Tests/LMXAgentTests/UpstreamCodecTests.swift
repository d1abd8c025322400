import LMXCore
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import LMXAgent

/// The data path's own HTTP/1.1 reading of servers' answers: what it takes, what it refuses,
/// when a connection may be reused, and — against SwiftNIO's llhttp decoder on the same bytes —
/// that it never frames an answer differently from llhttp.
@Suite("The data path's HTTP/1.1 codec on connections to servers")
struct UpstreamCodecTests {
    /// What a parser made of an answer: the head, the body's bytes, whether it ended, whether
    /// the connection may be reused, the error if any.
    struct Reading: Equatable, CustomStringConvertible {
        var status: Int?
        var headers: [String] = []
        var body: [UInt8] = []
        var ended = false
        var reusable = true
        var failed = false
        var description: String {
            "status \(status.map(String.init) ?? "-") headers \(headers) body \(body.count) B ended \(ended) reusable \(reusable) failed \(failed)"
        }
    }

    /// Our parser over `bytes`, fed in pieces of `piece` bytes (0: at once), then the close if `close`.
    static func ours(_ bytes: [UInt8], head: Bool = false, piece: Int = 0, close: Bool = false) -> Reading {
        var parser = UpstreamResponseParser()
        parser.expectAnswer(toHEAD: head)
        var reading = Reading()
        let emit: (UpstreamResponseParser.Part) -> Void = { part in
            switch part {
            case .head(let h):
                reading.status = h.status
                reading.headers = h.headers.map { "\($0.name): \($0.value)" }
            case .body(let b): reading.body += Array(b.readableBytesView)
            case .end: reading.ended = true
            }
        }
        let size = piece > 0 ? piece : max(bytes.count, 1)
        var offset = 0
        do {
            while offset < bytes.count {
                let end = min(offset + size, bytes.count)
                try parser.read(ByteBuffer(bytes: bytes[offset..<end]), emit: emit)
                offset = end
            }
            if close, parser.closed() { emit(.end) }
        } catch {
            reading.failed = true
        }
        reading.reusable = parser.reusable && !reading.failed
        return reading
    }

    /// SwiftNIO's llhttp decoder over the same bytes, after a request with `method`.
    static func llhttp(_ bytes: [UInt8], head: Bool = false, close: Bool = false) -> Reading {
        let channel = EmbeddedChannel()
        var reading = Reading()
        do {
            try channel.pipeline.syncOperations.addHTTPClientHandlers()
            try channel.writeOutbound(
                HTTPClientRequestPart.head(HTTPRequestHead(version: .http1_1, method: head ? .HEAD : .GET, uri: "/")))
            try channel.writeOutbound(HTTPClientRequestPart.end(nil))
            try channel.writeInbound(ByteBuffer(bytes: bytes))
            if close { try channel.close().wait() }
        } catch {
            reading.failed = true
        }
        while let part = try? channel.readInbound(as: HTTPClientResponsePart.self) {
            switch part {
            case .head(let h):
                if h.status.code < 200 { continue }
                reading.status = Int(h.status.code)
                // llhttp keeps a value's trailing spaces and tabs; RFC 9110 §5.5 (and ours) does not.
                reading.headers = h.headers.map {
                    "\($0.name): \(String($0.value.reversed().drop { $0 == " " || $0 == "\t" }.reversed()))"
                }
            case .body(let b): reading.body += Array(b.readableBytesView)
            case .end: reading.ended = true
            }
        }
        _ = try? channel.finish()
        return reading
    }

    static func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

    @Test(
        "answers framed by Content-Length, chunked (extensions, trailers), none (204, 304, HEAD) or the close; interim answers skipped; read whole or a byte at a time"
    )
    func framing() {
        let cases: [(String, Bool, Bool, Reading)] = [
            (
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", false, false,
                Reading(
                    status: 200, headers: ["Content-Type: application/json", "Content-Length: 2"],
                    body: Self.bytes("{}"), ended: true)
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n1\r\n!\r\n0\r\nX-Trailer: t\r\n\r\n",
                false, false,
                Reading(status: 200, headers: ["Transfer-Encoding: chunked"], body: Self.bytes("hello!"), ended: true)
            ),
            (
                "HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n", false, false,
                Reading(status: 204, headers: ["Content-Length: 10"], ended: true)
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", true, false,
                Reading(status: 200, headers: ["Content-Length: 10"], ended: true)
            ),
            (
                "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx", false, false,
                Reading(status: 200, headers: ["Content-Length: 1"], body: Self.bytes("x"), ended: true)
            ),
            (
                "HTTP/1.0 200 OK\r\nServer: old\r\n\r\nuntil the close", false, true,
                Reading(
                    status: 200, headers: ["Server: old"], body: Self.bytes("until the close"), ended: true,
                    reusable: false)
            ),
            (
                "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx", false, false,
                Reading(
                    status: 200, headers: ["Connection: close", "Content-Length: 1"], body: Self.bytes("x"),
                    ended: true, reusable: false)
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxGARBAGE", false, false,
                Reading(
                    status: 200, headers: ["Content-Length: 1"], body: Self.bytes("x"), ended: true, reusable: false)
            ),
        ]
        for (text, head, close, expected) in cases {
            for piece in [0, 1, 2, 7] {
                let got = Self.ours(Self.bytes(text), head: head, piece: piece, close: close)
                #expect(got == expected, "\(text.debugDescription) in pieces of \(piece)")
            }
        }
        // A body cut by the close: no end, and the connection is not reused.
        let cut = Self.ours(Self.bytes("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"), close: true)
        #expect(!cut.ended && cut.body == Self.bytes("abc") && !cut.reusable)
    }

    @Test("what is not strict HTTP/1.1 fails the answer and the connection, never a guess")
    func refusals() {
        let bad = [
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
            "HTTP/1.1 200 OK\r\nContent-Length: 1, 1\r\n\r\nx",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n: bad trailer\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\nx",
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nx",
            "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\nx",
            "HTTP/1.1 200 OK\nContent-Length: 1\r\n\r\nx",
            "HTTP/1.1 200 OK\r\nBad Name: 1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nX: a\r\n folded\r\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 200 OK\r\n: no name\r\n\r\n",
            "HTTP/1.1 200 OK\r\nX: a\u{0}b\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
            "HTTP/1.0 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\n",
            "HTTP/2 200 OK\r\n\r\n",
            // Each byte of `HTTP/1.` and the minor version matter.
            "http/1.1 200 OK\r\n\r\n", "HTTQ/1.1 200 OK\r\n\r\n", "HTTP/1,1 200 OK\r\n\r\n",
            "HTTP/1.2 200 OK\r\n\r\n", "HTTP/0.9 200 OK\r\n\r\n", "HTTP/11.1 200 OK\r\n\r\n",
            "XTTP/1.1 200 OK\r\n\r\n", "HTTP/1.1200 OK\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "HTTP/1.1 20 OK\r\n\r\n",
            "ICY 200 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1000000000000000\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\nab\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + String(repeating: "1", count: 5000) + "\r\n",
            "HTTP/1.1 200 OK\r\nX: " + String(repeating: "a", count: 90 << 10) + "\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n"
                + String(repeating: "T: " + String(repeating: "a", count: 1000) + "\r\n", count: 90) + "\r\n",
        ]
        for text in bad {
            for piece in [0, 3] {
                let got = Self.ours(Self.bytes(text), piece: piece)
                #expect(got.failed && !got.reusable && !got.ended, "\(text.prefix(80).debugDescription): \(got)")
            }
        }
        // A head that never ends: refused once past the limit, not held without bound.
        var parser = UpstreamResponseParser()
        parser.expectAnswer(toHEAD: false)
        var threw = false
        for _ in 0..<100 where !threw {
            do { try parser.read(ByteBuffer(repeating: UInt8(ascii: "a"), count: 1024)) { _ in } } catch {
                threw = true
            }
        }
        #expect(threw)
        // Bytes on an idle connection: not reused.
        var idle = UpstreamResponseParser()
        try? idle.read(ByteBuffer(string: "HTTP/1.1 200 OK\r\n\r\n")) { _ in }
        #expect(!idle.reusable)
    }

    /// A small generator: answers built from parts, valid and then mutated.
    struct Generator {
        var random: ByteMutations
        init(state: UInt64) { random = ByteMutations(state: state) }
        mutating func next(_ bound: Int) -> Int { random.next(bound) }

        mutating func answer() -> [UInt8] {
            let statuses = [200, 201, 204, 304, 400, 404, 429, 500, 503, 100]
            let status = statuses[next(statuses.count)]
            var text = "HTTP/1.\(next(4) == 0 ? 0 : 1) \(status) Reason\r\n"
            if status == 100 { text += "\r\nHTTP/1.1 200 OK\r\n" }
            let body = String(repeating: "b", count: next(3) == 0 ? 0 : next(300))
            let framing = next(6)
            for _ in 0..<next(4) {
                text +=
                    ["X-A: 1", "Server: s", "Content-Type: text/event-stream", "Connection: keep-alive"][next(4)]
                    + "\r\n"
            }
            switch framing {
            case 0, 1:
                text += "Content-Length: \(body.utf8.count)\r\n\r\n" + body
            case 2, 3:
                text += "Transfer-Encoding: chunked\r\n\r\n"
                var rest = Substring(body)
                while !rest.isEmpty {
                    let n = min(rest.count, 1 + next(40))
                    text +=
                        String(n, radix: 16)
                        + (next(5) == 0 ? [";x=y", ";q=\"a \\\" b\"", ";k", ";a=1;b"][next(4)] : "") + "\r\n"
                        + rest.prefix(n) + "\r\n"
                    rest = rest.dropFirst(n)
                }
                text += "0\r\n" + (next(4) == 0 ? "T: 1\r\n" : "") + "\r\n"
            case 4:
                text +=
                    "Content-Length: \(body.utf8.count)\r\nContent-Length: \(body.utf8.count + next(2))\r\n\r\n" + body
            default:
                text += "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
            }
            return Array(text.utf8)
        }

        mutating func mutate(_ bytes: [UInt8]) -> [UInt8] {
            let alphabet: [UInt8] = Array("\r\n :;0123456789abcdefABCDEF\t\0-,xX".utf8) + [0x7F, 0xC3, 0xFF]
            return random.mutate(bytes, alphabet: alphabet)
        }
    }

    @Test(
        "against llhttp on 5,000 generated answers and 10,000 mutated ones: where ours reads an answer, llhttp reads the same head, body and end"
    )
    func differentialAgainstLLHTTP() {
        var generator = Generator(state: 0x5EED_1003)
        var agreed = 0
        var refusedMore = 0
        for round in 0..<15000 {
            let valid = generator.answer()
            let bytes = round < 5000 ? valid : generator.mutate(valid)
            let head = generator.next(8) == 0
            let piece = [0, 1, 5, 64][generator.next(4)]
            let ours = Self.ours(bytes, head: head, piece: piece)
            let theirs = Self.llhttp(bytes, head: head)
            if ours.failed {
                refusedMore += theirs.failed ? 0 : 1
                continue
            }
            // Where ours read an answer through its end, llhttp read the same (status, headers,
            // body, end) — the framing never differs.
            if ours.ended {
                // (llhttp may fail afterwards on bytes past the end: ours then does not reuse the
                // connection, and reads nothing more from it.)
                #expect(
                    (!theirs.failed || !ours.reusable) && theirs.status == ours.status && theirs.headers == ours.headers
                        && theirs.body == ours.body && theirs.ended,
                    "\(String(decoding: bytes, as: UTF8.self).debugDescription)\n ours: \(ours)\n llhttp: \(theirs)")
                agreed += 1
            } else {
                // Not ended yet: llhttp has not ended it either.
                #expect(!theirs.ended || theirs.failed, "\(String(decoding: bytes, as: UTF8.self).debugDescription)")
            }
        }
        #expect(agreed > 5000)
        print(
            "figure: upstream codec vs llhttp: \(agreed) answers read alike; \(refusedMore) refused here that llhttp read"
        )
    }

    @Test(
        "an answer's head read with what the rules need: the length, an event stream, Retry-After, what Connection lists, keep-alive hints, the headers kept"
    )
    func answerHeadRead() throws {
        var parser = UpstreamResponseParser()
        parser.expectAnswer(toHEAD: false)
        var heads: [UpstreamAnswerHead] = []
        try parser.read(
            ByteBuffer(
                string:
                    "HTTP/1.1 429 Too Many Requests\r\nContent-Type: Text/Event-Stream; charset=utf-8\r\n"
                    + "content-type: application/json\r\nRetry-After:  7 \r\nConnection: keep-alive, X-Private\r\n"
                    + "X-Private: 1\r\nKeep-Alive: timeout=9\r\nSet-Cookie: a=b\r\nX-Request-ID: r1\r\n"
                    + "Content-Length: 0\r\n\r\n")
        ) {
            if case .head(let head) = $0 { heads.append(head) }
        }
        let head = try #require(heads.first)
        #expect(head.status == 429 && head.minor == 1)
        #expect(head.read.eventStream)  // the first Content-Type
        #expect(head.read.retryAfter == "7")
        #expect(head.read.contentLength == 0)
        #expect(head.read.connectionListed == ["keep-alive", "x-private"])
        #expect(head.read.keepAlive.seconds == 8)
        #expect(head.headers.count == 9)
        // Kept before what Connection lists is known (the handler leaves X-Private out then).
        let kept = head.headers.enumerated().filter { head.fields[$0.offset].kept }.map(\.element.name)
        #expect(kept == ["Content-Type", "content-type", "Retry-After", "X-Private", "X-Request-ID"])
    }

    @Test(
        "keep-alive hints and what Connection lists, read from an answer's bytes, are what the rules read from its text, for every mix of Server, CF-RAY, Connection and Keep-Alive"
    )
    func answerHintsAsTheRulesReadThem() throws {
        let choices: [[(String, String)]] = [
            [], [("Server", "cloudflare")], [("server", "CloudFlare")], [("Server", "nginx")],
            [("Server", "cloudflare"), ("Server", "nginx")], [("Server", "nginx"), ("SERVER", "cloudflare")],
        ]
        let rays: [[(String, String)]] = [[], [("CF-RAY", "8f1c2d-AMS")], [("cf-ray", "")]]
        let connections: [[(String, String)]] = [
            [], [("Connection", "keep-alive")], [("Connection", "Keep-Alive")], [("connection", "close")],
            [("Connection", "keep-alive, X-Private")], [("Connection", "Upgrade")],
            [("Keep-Alive", "timeout=9, max=5")], [("keep-alive", "timeout=\"3\"")],
            [("Connection", "keep-alive"), ("Keep-Alive", "timeout=30")],
        ]
        for server in choices {
            for ray in rays {
                for connection in connections {
                    let headers = server + ray + connection
                    var text = "HTTP/1.1 200 OK\r\n"
                    for (name, value) in headers { text += "\(name): \(value)\r\n" }
                    text += "Content-Length: 0\r\n\r\n"
                    var parser = UpstreamResponseParser()
                    parser.expectAnswer(toHEAD: false)
                    var heads: [UpstreamAnswerHead] = []
                    try parser.read(ByteBuffer(string: text)) { if case .head(let head) = $0 { heads.append(head) } }
                    let head = try #require(heads.first)
                    var expected = UpstreamKeepAlive()
                    var listed: [String] = []
                    for (name, value) in headers + [("Content-Length", "0")] {
                        expected.read(name: name, value: value)
                        _ = GatewayPolicy.addConnectionListed(name: name, value: value, to: &listed)
                    }
                    #expect(head.read.keepAlive == expected, "\(headers)")
                    #expect(head.read.keepAlive.seconds == expected.seconds, "\(headers)")
                    #expect(head.read.connectionListed == listed, "\(headers)")
                }
            }
        }
    }

    @Test(
        "eight bytes at a time: the first byte of a word below a bound, equal to a byte, or not visible ASCII is found exactly, and none when there is none"
    )
    func wordChecks() {
        var random = ByteMutations(state: 0x3057_0D5)
        let interesting: [UInt8] = [
            0, 1, 0x09, 0x0A, 0x0D, 0x1F, 0x20, 0x21, 0x2C, 0x2D, 0x2E, 0x2F, 0x30, 0x39, 0x3A, 0x40, 0x41, 0x5A, 0x5B,
            0x60, 0x61, 0x7A, 0x7B, 0x7E, 0x7F, 0x80, 0x81, 0xA0, 0xAD, 0xC1, 0xE1, 0xFF,
        ]
        func first(_ bytes: [UInt8], _ test: (UInt8) -> Bool) -> Int { bytes.firstIndex(where: test) ?? 8 }
        for _ in 0..<200_000 {
            let bytes = (0..<8).map { _ in
                random.next(3) == 0 ? interesting[random.next(interesting.count)] : UInt8(random.next(256))
            }
            let word = bytes.withUnsafeBytes { ByteWord.word($0, at: 0) }
            for bound: UInt8 in [1, 0x20, 0x21, 0x80] {
                let marks = ByteWord.bytes(below: bound, in: word)
                #expect((marks != 0) == bytes.contains { $0 < bound }, "\(bytes) < \(bound)")
                #expect(ByteWord.firstMarked(marks) == first(bytes) { $0 < bound }, "\(bytes) < \(bound)")
            }
            for byte: UInt8 in [0, 0x0A, 0x0D, 0x3A, 0x7F, 0xFF] {
                let marks = ByteWord.bytes(equalTo: byte, in: word)
                #expect(ByteWord.firstMarked(marks) == first(bytes) { $0 == byte }, "\(bytes) has \(byte)")
            }
            // Letters, digits and dashes: every byte marked exactly (not only the first).
            let names = ByteWord.nameBytes(in: word)
            for (place, byte) in bytes.enumerated() {
                let isName =
                    (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte)
                    || (0x61...0x7A).contains(byte) || byte == 0x2D
                #expect((names >> UInt64(place * 8 + 7)) & 1 == (isName ? 1 : 0), "\(bytes) at \(place)")
                #expect(names & ~(0x80 << UInt64(place * 8)) & (0xFF << UInt64(place * 8)) == 0)
            }
            #expect(
                ByteWord.firstUnmarked(names)
                    == first(bytes) {
                        !((0x30...0x39).contains($0) || (0x41...0x5A).contains($0) || (0x61...0x7A).contains($0)
                            || $0 == 0x2D)
                    })
            let invisible = ByteWord.invisibleBytes(in: word)
            #expect(ByteWord.firstMarked(invisible) == first(bytes) { !(0x21...0x7E).contains($0) }, "\(bytes)")
        }
        // A transfer coding the gateway never asked for (it sends no `TE`): its body would pass
        // on still coded with the header that says so dropped (hop-by-hop), a gzip stream read as
        // events; refused as nginx refuses it ("upstream sent unknown Transfer-Encoding").
        for coding in [
            "Transfer-Encoding: gzip", "Transfer-Encoding: gzip, chunked", "Transfer-Encoding: chunked, chunked",
            "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
            "Transfer-Encoding: identity",
        ] {
            let head = ByteBuffer(string: "HTTP/1.1 200 OK\r\n\(coding)\r\n\r\n")
            #expect(throws: UpstreamResponseParser.Malformed.self, "\(coding)") {
                try UpstreamResponseParser.parseHead(head)
            }
        }
        for coding in ["chunked", "Chunked", " chunked "] {
            let head = ByteBuffer(string: "HTTP/1.1 200 OK\r\nTransfer-Encoding:\(coding)\r\n\r\n")
            #expect(throws: Never.self) { try UpstreamResponseParser.parseHead(head) }
        }
        // Every byte position of a long line, read a word at a time: a control character or DEL
        // anywhere refuses the answer; a colon anywhere in the name ends it there.
        let value = String(repeating: "v", count: 40)
        for position in 0..<40 {
            for bad: UInt8 in [0x01, 0x0B, 0x1F, 0x7F] {
                var bytes = Array("X-Long-Header-Name: \(value)".utf8)
                bytes[20 + position] = bad
                var head = ByteBuffer(string: "HTTP/1.1 200 OK\r\n")
                head.writeBytes(bytes + Array("\r\nContent-Length: 0\r\n\r\n".utf8))
                #expect(throws: UpstreamResponseParser.Malformed.self) { try UpstreamResponseParser.parseHead(head) }
            }
            // A long name: a token byte anywhere in it is read, any other refuses the answer.
            for (byte, valid) in [("_", true), ("!", true), ("~", true), ("@", false), (" ", false), ("\u{C3}", false)]
            {
                var long = Array(String(repeating: "n", count: 40).utf8)
                long.replaceSubrange(position..<position + 1, with: Array(byte.utf8))
                let head = ByteBuffer(bytes: Array("HTTP/1.1 200 OK\r\n".utf8) + long + Array(": v\r\n\r\n".utf8))
                #expect(((try? UpstreamResponseParser.parseHead(head)) != nil) == valid, "\(byte) at \(position)")
            }
            let name = String(repeating: "n", count: position + 1)
            let head = ByteBuffer(string: "HTTP/1.1 200 OK\r\n\(name):a:b:\(value)\r\n\r\n")
            let parsed = try? UpstreamResponseParser.parseHead(head)
            #expect(parsed?.fields.first?.name == 17..<17 + position + 1, "name of \(position + 1) bytes")
            #expect(parsed?.fields.first?.value.count == 4 + value.count, "name of \(position + 1) bytes")
        }
    }

    @Test(
        "Connection: close among other items, in any case and with spaces, closes; an item that only contains it does not"
    )
    func connectionClose() throws {
        let closing = ["close", "Close", "keep-alive, close", "keep-alive ,\tCLOSE ", ",close,", "x,,close"]
        let keeping = ["keep-alive", "closed", "x-close", "clo se", "", ",", "keep-alive, closer"]
        for (values, expected) in [(closing, true), (keeping, false)] {
            for value in values {
                let head = try UpstreamResponseParser.parseHead(
                    ByteBuffer(string: "HTTP/1.1 200 OK\r\nConnection: \(value)\r\nContent-Length: 0\r\n\r\n"))
                #expect(!GatewayPolicy.keepsDownstream("Transfer-Encoding", connectionListed: []))
                #expect(head.close == expected, "Connection: \(value.debugDescription)")
                // The framing headers never go to the client as they came (the rule's own answer).
                #expect(head.fields.map(\.kept) == [false, false])
                #expect(!GatewayPolicy.keepsDownstream("Connection", connectionListed: []))
                #expect(!GatewayPolicy.keepsDownstream("Content-Length", connectionListed: []))
            }
        }
    }

    @Test("a head made in one piece is the same whether it fits the first buffer or is made again in larger ones")
    func headLines() {
        let long = String(repeating: "v", count: 3000)
        let build: (inout HeadLines) -> Void = { out in
            out.add("HTTP/1.1 200 OK\r\n")
            out.header("X-Small", "a")
            out.header("X-Long", long)
            out.add(Array("X-Bytes: b\r\n".utf8))
            out.add("\r\n")
        }
        let expected = Array("HTTP/1.1 200 OK\r\nX-Small: a\r\nX-Long: \(long)\r\nX-Bytes: b\r\n\r\n".utf8)
        for estimate in [0, 1, 256, 1000, 3100, 8192] {
            let made = HeadLines.make(ByteBufferAllocator(), estimate: estimate, build)
            #expect(Array(made.readableBytesView) == expected, "estimate \(estimate)")
        }
        // Numbers written in place read as `String(_:)` writes them, whatever the space left.
        let numbers = [0, 7, 9, 10, 99, 100, 200, 404, 65_535, 1 << 20, 999_999_999, Int.max, -1, -42, Int.min]
        for number in numbers {
            for estimate in [0, 3, 300] {
                let filler = String(repeating: "x", count: 253)
                let made = HeadLines.make(ByteBufferAllocator(), estimate: estimate) { out in
                    out.add(filler)
                    out.add(decimal: number)
                    out.add("\r\n")
                }
                #expect(String(buffer: made) == filler + String(number) + "\r\n", "\(number), estimate \(estimate)")
            }
        }
    }

    @Test(
        "parts gathered for one write: chunk size lines as String(radix: 16) writes them, small parts in one write per flush, a large part after what was gathered, in order"
    )
    func gatheredWrites() throws {
        for size in [1, 9, 10, 15, 16, 255, 256, 4095, 4096, 65535, 1 << 20, Int(Int32.max), Int.max] {
            var line = ByteBuffer()
            HTTP1Bytes.writeChunkSize(size, to: &line)
            #expect(String(buffer: line) == String(size, radix: 16) + "\r\n")
        }
        final class Sink: ChannelOutboundHandler {
            typealias OutboundIn = ByteBuffer
        }
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(Sink())
        let context = try channel.pipeline.syncOperations.context(handlerType: Sink.self)
        func written() throws -> [String] {
            var out: [String] = []
            while let buffer = try channel.readOutbound(as: ByteBuffer.self) { out.append(String(buffer: buffer)) }
            return out
        }
        var gathered = Gathered()
        // A head, two small chunks and the last chunk: one write.
        gathered.add(head: ByteBuffer(string: "HTTP/1.1 200 OK\r\n\r\n"))
        gathered.add(ByteBuffer(string: "data: a\n\n"), chunked: true, to: context)
        gathered.add(ByteBuffer(), chunked: true, to: context)  // nothing: no empty chunk (the end)
        gathered.add(ByteBuffer(string: "data: b\n\n"), chunked: true, to: context)
        gathered.add(HTTP1Bytes.lastChunk, chunked: false, to: context)
        #expect(try written().isEmpty)
        gathered.write(to: context)
        context.flush()
        #expect(try written() == ["HTTP/1.1 200 OK\r\n\r\n9\r\ndata: a\n\n\r\n9\r\ndata: b\n\n\r\n0\r\n\r\n"])
        // Chunks of every size line length up to the limit, framed as String(radix: 16) writes
        // them, from a part that is a slice of a larger buffer (its readable bytes only).
        for size in [1, 15, 16, 255, 256, 4095, 4096, HTTP1Bytes.gatherLimit] {
            var larger = ByteBuffer(string: "<" + String(repeating: "y", count: size) + ">")
            larger.moveReaderIndex(forwardBy: 1)
            let part = larger.getSlice(at: larger.readerIndex, length: size)!
            gathered.add(head: ByteBuffer(string: "H"))
            gathered.add(part, chunked: true, to: context)
            gathered.write(to: context)
            context.flush()
            #expect(
                try written() == ["H" + String(size, radix: 16) + "\r\n" + String(repeating: "y", count: size) + "\r\n"]
            )
        }
        // A large part: what was gathered goes first, then the part as it is (not copied).
        let large = String(repeating: "x", count: HTTP1Bytes.gatherLimit + 1)
        gathered.add(ByteBuffer(string: "small"), chunked: false, to: context)
        gathered.add(ByteBuffer(string: large), chunked: true, to: context)
        gathered.add(ByteBuffer(string: "tail"), chunked: false, to: context)
        gathered.write(to: context)
        context.flush()
        #expect(try written() == ["small", "1001\r\n", large, "\r\n", "tail"])
        _ = try channel.finish()
    }
}
