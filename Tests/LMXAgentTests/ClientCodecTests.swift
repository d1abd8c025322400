import Foundation
import LMXCore
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import LMXAgent

/// The data path's reading of clients' requests: the strict subset it reads itself, what it
/// leaves to llhttp, and — against SwiftNIO's llhttp decoder on the same bytes — that wherever it
/// reads a request, llhttp reads the same one, ending at the same byte.
@Suite("The data path's reading of clients' requests")
struct ClientCodecTests {
    /// The requests a reader made of some bytes, in order, and whether it left the rest to llhttp
    /// (ours) or failed (llhttp).
    struct Reading: Equatable, CustomStringConvertible {
        struct Request: Equatable {
            var method = ""
            var uri = ""
            var minor = 1
            var headers: [String] = []
            var body: [UInt8] = []
            var ended = false
            var raw: [UInt8] = []
            /// Whether the connection stays open after the answer, as the reader says.
            var keepAlive = true
        }
        var requests: [Request] = []
        var stopped = false
        /// Ours: a chunked body broke its framing (nothing more read).
        var malformed = false
        /// Bytes left to llhttp, from where ours stopped.
        var rest: [UInt8] = []
        /// Ours: a head longer than it reads (nothing more read).
        var headTooLarge = false
        var description: String {
            requests.map {
                "\($0.method) \($0.uri) 1.\($0.minor) \($0.headers) body \($0.body.count) B ended \($0.ended)"
            }.joined(separator: " | ") + (stopped ? " [stopped]" : "")
        }
    }

    static func ours(_ bytes: [UInt8], piece: Int = 0) -> Reading {
        var parser = ClientRequestParser()
        var reading = Reading()
        let size = piece > 0 ? piece : max(bytes.count, 1)
        var offset = 0
        while offset < bytes.count {
            let end = min(offset + size, bytes.count)
            parser.read(ByteBuffer(bytes: bytes[offset..<end])) { part in
                switch part {
                case .head(let head, _):
                    reading.requests.append(
                        .init(
                            method: head.method.rawValue, uri: head.uri, minor: head.minor,
                            headers: head.headers.map { "\($0.name): \($0.value)" },
                            raw: Array(head.raw.readableBytesView),
                            keepAlive: head.keepAlive))
                case .body(let b): reading.requests[reading.requests.count - 1].body += Array(b.readableBytesView)
                case .end: reading.requests[reading.requests.count - 1].ended = true
                case .other(let b):
                    reading.stopped = true
                    reading.rest += Array(b.readableBytesView)
                case .malformed:
                    reading.malformed = true
                case .headTooLarge:
                    reading.headTooLarge = true
                }
            }
            offset = end
        }
        return reading
    }

    static func llhttp(_ bytes: [UInt8]) -> Reading {
        let channel = EmbeddedChannel()
        var reading = Reading()
        do {
            try channel.pipeline.syncOperations.configureHTTPServerPipeline(
                withPipeliningAssistance: false, withErrorHandling: false)
            try channel.writeInbound(ByteBuffer(bytes: bytes))
        } catch {
            reading.stopped = true
        }
        while let part = try? channel.readInbound(as: HTTPServerRequestPart.self) {
            switch part {
            case .head(let head):
                reading.requests.append(
                    .init(
                        method: head.method.rawValue, uri: head.uri, minor: head.version.minor,
                        // llhttp keeps a value's trailing spaces and tabs; RFC 9110 §5.5 (and ours) does not.
                        headers: head.headers.map {
                            "\($0.name): \(String($0.value.reversed().drop { $0 == " " || $0 == "\t" }.reversed()))"
                        }, keepAlive: head.isKeepAlive))
            case .body(let b): reading.requests[reading.requests.count - 1].body += Array(b.readableBytesView)
            case .end: reading.requests[reading.requests.count - 1].ended = true
            }
        }
        _ = try? channel.finish()
        return reading
    }

    static func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

    @Test("plain requests: heads, bodies by Content-Length, pipelined, in any pieces; the raw head kept")
    func reads() {
        let text =
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/json\r\n"
            + "Authorization: Bearer sk-x\r\nContent-Length: 11\r\n\r\n{\"a\": true}"
            + "GET /v1/models?x=1 HTTP/1.1\r\nHost: h\r\nX-Empty:\r\nX-Pad: \t v \t\r\n\r\n"
            + "HEAD /v1/models HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
            + "DELETE /v1/x HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
            + "GET / HTTP/1.1\r\n\r\n"
        for piece in [0, 1, 2, 7, 100] {
            let reading = Self.ours(Self.bytes(text), piece: piece)
            #expect(!reading.stopped)
            #expect(reading.requests.map { $0.method } == ["POST", "GET", "HEAD", "DELETE", "GET"], "\(piece)")
            #expect(reading.requests.allSatisfy { $0.ended })
            #expect(reading.requests.first?.body == Self.bytes("{\"a\": true}"))
            #expect(reading.requests[1].headers == ["Host: h", "X-Empty: ", "X-Pad: v"])
            #expect(reading.requests[1].uri == "/v1/models?x=1")
            #expect(reading.requests[2].minor == 0)
            #expect(
                reading.requests[1].raw
                    == Self.bytes("GET /v1/models?x=1 HTTP/1.1\r\nHost: h\r\nX-Empty:\r\nX-Pad: \t v \t\r\n\r\n"))
            #expect(reading == Self.llhttp(Self.bytes(text)).withRaw(from: reading), "\(piece)")
        }
        // After a request that closes the connection, nothing more is read.
        let closing = Self.ours(Self.bytes("GET /a HTTP/1.1\r\nConnection: close\r\n\r\nGET /b HTTP/1.1\r\n\r\n"))
        #expect(closing.requests.map { $0.uri } == ["/a"] && closing.requests[0].ended && !closing.stopped)
        let old = Self.ours(Self.bytes("GET /a HTTP/1.0\r\n\r\nGET /b HTTP/1.0\r\n\r\n"))
        #expect(old.requests.map { $0.uri } == ["/a"])
    }

    @Test(
        "chunked bodies: the data without its framing, any pieces, trailers dropped; a broken framing ends the reading"
    )
    func chunkedBodies() {
        let request =
            "POST /v1/x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n"
        for piece in [0, 1, 2, 7] {
            let reading = Self.ours(Self.bytes(request + "GET /v1/models HTTP/1.1\r\n\r\n"), piece: piece)
            #expect(reading.requests.count == 2 && reading.requests.allSatisfy(\.ended), "\(piece)")
            #expect(reading.requests.first?.body == Self.bytes("abc0123456789"))
            #expect(!reading.stopped && !reading.malformed)
        }
        let head = "POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        for broken in [
            "3;ext=1\r\nabc\r\n0\r\n\r\n", "3 \r\nabc\r\n0\r\n\r\n", "-3\r\nabc\r\n0\r\n\r\n", "3\r\nabcd\r\n",
            "3\nabc\r\n", "g\r\n", String(repeating: "f", count: 16) + "\r\n", "0\r\nbad trailer\r\n\r\n",
            "0\r\nX: " + String(repeating: "a", count: 5000) + "\r\n\r\n",
        ] {
            let reading = Self.ours(Self.bytes(head + broken + "GET /v1/models HTTP/1.1\r\n\r\n"))
            #expect(reading.malformed && reading.requests.count == 1, "\(broken.debugDescription)")
            #expect(reading.requests.first?.ended == false, "\(broken.debugDescription)")
        }
        // A size line that never ends is not held past its bound.
        let endless = Self.ours(Self.bytes(head + String(repeating: "1", count: 5000)))
        #expect(endless.malformed)
    }

    @Test("what is outside the subset goes to llhttp from that request on, as it came")
    func leftToLLHTTP() {
        let first = "GET /v1/models HTTP/1.1\r\nHost: h\r\n\r\n"
        let others = [
            "POST /v1/x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            "POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            "POST /v1/x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            "POST /v1/x HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
            "POST /v1/x HTTP/1.1\r\nContent-Length: 3 \r\n\r\nabc",
            "POST /v1/x HTTP/1.1\r\nContent-Length: +3\r\n\r\nabc",
            "POST /v1/x HTTP/1.1\r\nContent-Length: 1234567890123456\r\n\r\n",
            "GET /x HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
            "GET /dashboard/api/watch HTTP/1.1\r\nConnection: keep-alive, upgrade\r\n\r\n",
            "GET /v1/x HTTP/1.1\nHost: h\n\n",
            "GET /v1/x HTTP/1.1\r\nHost: h\r\r\n\r\n",
            "GET /v1/x HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
            "GET /v1/x HTTP/1.1\r\nX : a\r\n\r\n",
            "GET /v1/x HTTP/1.1\r\nX: a\u{7F}\r\n\r\n",
            "GET /v1/x HTTP/1.1\r\nX: a\u{0}b\r\n\r\n",
            "GET http://u@h/v1/x HTTP/1.1\r\n\r\n",
            "GET ftp://h/v1/x HTTP/1.1\r\n\r\n",
            "GET http:///v1/x HTTP/1.1\r\n\r\n",
            "GET * HTTP/1.1\r\n\r\n",
            "CONNECT h:443 HTTP/1.1\r\n\r\n",
            "PROPFIND /v1/x HTTP/1.1\r\n\r\n",
            "get /v1/x HTTP/1.1\r\n\r\n",
            "GET /v1/x HTTP/2.0\r\n\r\n",
            "GET /v1/x  HTTP/1.1\r\n\r\n",
            "GET /v1/\u{E9} HTTP/1.1\r\n\r\n",
            "\u{16}\u{3}\u{1}\u{0}",
            "GET /v1/x HTTP/1.1\r\n" + String(repeating: "X-A: 1\r\n", count: 101) + "\r\n",
        ]
        for other in others {
            let reading = Self.ours(Self.bytes(first + other))
            #expect(reading.requests.count == 1 && reading.requests[0].ended, "\(other.debugDescription)")
            #expect(reading.stopped && reading.rest == Self.bytes(other), "\(other.debugDescription)")
            // Fed a byte at a time, the same (a head not yet whole waits).
            let slow = Self.ours(Self.bytes(first + other), piece: 1)
            #expect(
                slow.requests.count == 1 && slow.stopped && slow.rest == Self.bytes(other), "\(other.debugDescription)")
        }
        // A head longer than 32 KiB, whole or not, in one read or byte by byte: refused here,
        // nothing of it handed on, nothing read after it.
        for long in [
            "GET /v1/x HTTP/1.1\r\nX: " + String(repeating: "a", count: 33 << 10) + "\r\n\r\n" + first,
            "GET /v1/x HTTP/1.1\r\nX: " + String(repeating: "a", count: 40 << 10),
            "GET /v1/x HTTP/1.1\r\n"
                + String(repeating: "X-Some: " + String(repeating: "b", count: 400) + "\r\n", count: 90)
                + "\r\n",
        ] {
            for piece in [0, 1, 4096] {
                let reading = Self.ours(Self.bytes(first + long), piece: piece)
                #expect(reading.requests.count == 1 && reading.requests[0].ended, "\(piece)")
                #expect(reading.headTooLarge && !reading.stopped && reading.rest.isEmpty, "\(piece)")
            }
        }
    }

    @Test(
        "read here since the general path forwards nothing: values past ASCII, heads up to 32 KiB (as llhttp reads them), absolute-form targets as their path, an upgrade of a forwarded target as a plain request"
    )
    func readSinceOnePath() {
        let next = "GET /v1/models HTTP/1.1\r\nHost: h\r\n\r\n"
        let agreed = [
            "GET /v1/x HTTP/1.1\r\nX-Title: caf\u{E9} \u{2014} \u{1F600}\r\n\r\n",
            "POST /v1/x HTTP/1.1\r\nX: \u{FF}\r\nContent-Length: 3\r\n\r\nabc",
            "GET /v1/x HTTP/1.1\r\nX: " + String(repeating: "a", count: 31 << 10) + "\r\n\r\n",
            // A transfer coding's name in any case (RFC 9112 §7).
            "POST /v1/x HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            // Empty lines before the request line: ignored by both (RFC 9112 §2.2).
            "\r\nGET /v1/x HTTP/1.1\r\n\r\n",
            "\r\n\r\nPOST /v1/x HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc\r\n",
            "GET /v1/x HTTP/1.1\r\n"
                + String(repeating: "X-Some-Header: " + String(repeating: "b", count: 300) + "\r\n", count: 99)
                + "\r\n",
        ]
        for text in agreed {
            for piece in [0, 1, 4096] {
                let reading = Self.ours(Self.bytes(text + next), piece: piece)
                #expect(reading.requests.count == 2 && !reading.stopped, "\(text.prefix(80).debugDescription)")
                #expect(reading == Self.llhttp(Self.bytes(text + next)).withRaw(from: reading), "\(piece)")
            }
        }
        // An absolute-form target: its path and query (llhttp gives the whole target).
        for (target, path) in [
            ("http://h/v1/x?y=1", "/v1/x?y=1"), ("HTTPS://h:81/v1/x", "/v1/x"), ("http://h", "/"),
            ("http://h?q", "/?q"),
        ] {
            let reading = Self.ours(Self.bytes("GET \(target) HTTP/1.1\r\nHost: h\r\n\r\n" + next))
            #expect(reading.requests.map(\.uri) == [path, "/v1/models"] && !reading.stopped, "\(target)")
            let theirs = Self.llhttp(Self.bytes("GET \(target) HTTP/1.1\r\nHost: h\r\n\r\n" + next))
            #expect(theirs.requests.map(\.uri) == [target, "/v1/models"], "llhttp reads it whole: \(target)")
        }
        // An upgrade of a forwarded target: a plain request (llhttp would hand the rest of the
        // connection to the upgrade); the policy refuses it (403), the next request is read.
        for upgrade in [
            "GET /v1/x HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
            "GET /admin/x HTTP/1.1\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n",
        ] {
            let reading = Self.ours(Self.bytes(upgrade + next))
            #expect(reading.requests.count == 2 && !reading.stopped, "\(upgrade.debugDescription)")
            #expect(reading.requests.allSatisfy(\.ended) && reading.requests.allSatisfy(\.keepAlive))
        }
    }

    @Test(
        "read a word at a time, every byte position of a long request line and value counts: a control byte goes to llhttp, bytes past ASCII are read as they are, spaces and tabs are trimmed only at the ends"
    )
    func everyPosition() {
        func read(_ text: [UInt8]) -> ClientRequestParser.Request? {
            guard case .request(var request, let length) = ClientRequestParser.readHead(ByteBuffer(bytes: text)) else {
                return nil
            }
            #expect(length == text.count)
            request.head.raw = ByteBuffer(bytes: text)
            return request
        }
        let target = "/v1/" + String(repeating: "t", count: 40)
        let value = String(repeating: "v", count: 40)
        let line = Array("GET \(target) HTTP/1.1\r\n".utf8)
        #expect(read(line + Array("X-Long: \(value)\r\n\r\n".utf8))?.head.uri == target)
        for position in 0..<40 {
            // A bare LF in the request line, at any place in the target.
            var bare = line
            bare[8 + position] = 0x0A
            #expect(read(bare + Array("\r\n".utf8)) == nil, "LF at \(position)")
            for bad: UInt8 in [0x00, 0x01, 0x0A, 0x1F, 0x7F] {
                var bytes = Array("X-Long: \(value)".utf8)
                bytes[8 + position] = bad
                #expect(read(line + bytes + Array("\r\n\r\n".utf8)) == nil, "\(bad) at \(position)")
            }
            // obs-text (bytes past ASCII) is read, as the bytes it is.
            for high: UInt8 in [0x80, 0xC3, 0xFF] {
                var bytes = Array("X-Long: \(value)".utf8)
                bytes[8 + position] = high
                let head = read(line + bytes + Array("\r\n\r\n".utf8))?.head
                #expect(head?.fields.count == 1, "\(high) at \(position)")
                if let head, let field = head.fields.first {
                    let raw = Array(head.raw.readableBytesView)
                    #expect(Array(raw[field.value]) == Array(bytes[8...]), "\(high) at \(position)")
                }
            }
            // A long name: any token byte anywhere in it is read; any other byte goes to llhttp.
            let name = Array(("X-" + String(repeating: "n", count: 38)).utf8)
            for (byte, readable) in [
                (UInt8(ascii: "_"), true), (UInt8(ascii: "!"), true), (UInt8(ascii: "~"), true),
                (UInt8(ascii: "@"), false), (UInt8(ascii: " "), false), (UInt8(ascii: "\""), false), (0xC3, false),
            ] {
                var bytes = name
                bytes[position] = byte
                let head = read(line + bytes + Array(": v\r\n\r\n".utf8))?.head
                #expect((head != nil) == readable, "\(byte) at \(position) of the name")
                if readable { #expect(head?.first(String(decoding: bytes, as: UTF8.self).lowercased()) == "v") }
            }
            for blank: UInt8 in [0x20, 0x09] {
                var bytes = Array("X-Long: \(value)".utf8)
                bytes[8 + position] = blank
                let head = read(line + bytes + Array("\r\n\r\n".utf8))?.head
                let expected = String(decoding: bytes[8...], as: UTF8.self).trimmingCharacters(in: [" ", "\t"])
                #expect(head?.first("x-long") == expected, "\(blank) at \(position)")
            }
        }
    }

    @Test(
        "the headers looked up by their bit: each name (in any case) sets its own bit, and a look-up by the bit finds what a look-up by the name finds"
    )
    func knownHeaders() {
        for header in ClientHead.Known.allCases {
            let lower = header.lower.description
            for name in [lower, lower.uppercased(), lower.prefix(1).uppercased() + lower.dropFirst()] {
                #expect(Array(name.utf8).withUnsafeBytes { ClientHead.knownBit($0) } == header.rawValue, "\(name)")
            }
            #expect(Array((lower + "x").utf8).withUnsafeBytes { ClientHead.knownBit($0) } == 0)
        }
        // The headers the policy reads are all known ones: the data path asks for them only when
        // one of their bits is set (a bit of each, and nothing else).
        let policy = GatewayConnectionHandler.refusalHeaderBits
        #expect(
            policy == ClientHead.Known.origin.rawValue | ClientHead.Known.secFetchSite.rawValue
                | ClientHead.Known.upgrade.rawValue)
        #expect(ClientHead.bits(of: ["host", "x-unknown"]) == nil)
        #expect(ClientHead.bits(of: []) == 0)
        let values = [
            "Host: h:1", "Origin: http://o", "Expect: 100-continue", "Cookie: c=1", "X-Api-Key: k",
            "Connection: keep-alive", "User-Agent: u/1", "Authorization: Bearer t", "Sec-Fetch-Site: none",
            "X-Other: 1",
        ]
        var random = ByteMutations(state: 0x4B0)
        for _ in 0..<500 {
            let lines = values.filter { _ in random.next(2) == 0 }
            let text = "GET /v1/models HTTP/1.1\r\n" + lines.map { $0 + "\r\n" }.joined() + "\r\n"
            guard case .request(var request, _) = ClientRequestParser.readHead(ByteBuffer(string: text)) else {
                Issue.record("not read: \(text.debugDescription)")
                continue
            }
            request.head.raw = ByteBuffer(string: text)
            for header in ClientHead.Known.allCases where header != .upgrade {
                let name = header.lower.description
                #expect(request.head.contains(header) == request.head.contains(name), "\(name) in \(lines)")
                #expect(request.head.first(header) == request.head.first(name), "\(name) in \(lines)")
            }
        }
    }

    @Test("the upstream head's header lines, copied from the client's bytes, are upstreamHeaders' own, for 3,000 heads")
    func upstreamLinesFromBytes() throws {
        var random = ByteMutations(state: 0x0B17_E5)
        let names = [
            "Host", "Authorization", "AUTHORIZATION", "X-Api-Key", "x-admin-key", "Cookie", "cookie", "Connection",
            "Keep-Alive", "TE", "Upgrade2", "Proxy-Authorization", "Content-Type", "Accept", "User-Agent", "user-agent",
            "X-Private", "x-private", "CF-Access-Client-Id", "X-Trace", "Expect", "Origin", "SEC-FETCH-SITE",
            "Sec-Fetch-Sites", "Hosts", "Origim",
        ]
        let values = ["", "v", " spaced  value ", "a,b", "X-Private, te", "close", "Bearer sk-client", "\t*/*"]
        let routes = [
            Credentials(), Credentials(inferenceKey: "sk-route"),
            Credentials(adminKey: "a", inferenceKey: "k", accessClientID: "i", accessClientSecret: "s"),
        ]
        var read = 0
        for round in 0..<3000 {
            var text = "POST /v1/chat/completions HTTP/1.1\r\n"
            for _ in 0..<random.next(8) {
                text += "\(names[random.next(names.count)]):\(values[random.next(values.count)])\r\n"
            }
            text += "\r\n"
            var head: ClientHead?
            var parser = ClientRequestParser()
            parser.read(ByteBuffer(string: text)) { part in
                if case .head(let h, _) = part { head = h }
            }
            guard let head else { continue }  // (a Connection: upgrade-like head goes to llhttp)
            read += 1
            let credentials = routes[round % routes.count]
            let path = round % 5 == 0 ? "/admin/models" : "/v1/chat/completions"
            let expected = GatewayPolicy.upstreamHeaders(
                client: head.headers, credentials: credentials, path: path, userAgent: "lmx-agent/test"
            ).map { "\($0.name): \($0.value)\r\n" }.joined()
            let rule = GatewayPolicy.UpstreamHeaderRule(
                connectionListed: GatewayPolicy.connectionListed(head.all("connection")) ?? [],
                credentials: credentials, path: path)
            let lines = HeadLines.make(ByteBufferAllocator(), estimate: 16) {
                $0.clientHeaders(head, keeping: rule, userAgent: "lmx-agent/test")
            }
            #expect(String(buffer: lines) == expected, "\(text.debugDescription)")
            // The rules' look-ups read the bytes as the Strings would.
            // (Known names are answered from what the parser noted: never absent when present.)
            for name in [
                "host", "origin", "sec-fetch-site", "upgrade", "expect", "authorization", "x-api-key", "cookie",
                "connection", "user-agent", "x-private", "absent",
            ] {
                let first = head.headers.first { $0.name.lowercased() == name }?.value
                #expect(head.first(name) == first, "\(name) \(text.debugDescription)")
            }
            #expect(head.contains("cookie") == head.headers.contains { $0.name.lowercased() == "cookie" })
            #expect(head.contains("expect") == head.headers.contains { $0.name.lowercased() == "expect" })
            #expect(head.contains("x-api-key") == head.headers.contains { $0.name.lowercased() == "x-api-key" })
        }
        #expect(read > 2500)
    }

    /// Requests built from parts, valid and then mutated.
    struct Generator {
        var random: ByteMutations
        init(state: UInt64) { random = ByteMutations(state: state) }
        mutating func next(_ bound: Int) -> Int { random.next(bound) }

        mutating func request() -> [UInt8] {
            let methods = ["GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"]
            let targets = [
                "/v1/models", "/v1/chat/completions?a=b&c=%20", "/", "/v1/x;y=z", "/a/../b", "/v1/~!$&'()*+,=:@",
            ]
            var text =
                "\(methods[next(methods.count)]) \(targets[next(targets.count)]) HTTP/1.\(next(5) == 0 ? 0 : 1)\r\n"
            let body = String(repeating: "b", count: next(3) == 0 ? 0 : next(200))
            let lines = [
                "Host: 127.0.0.1:8080", "Authorization: Bearer sk-1", "Content-Type: application/json",
                "Connection: keep-alive", "X-Empty:", "Accept:\t*/*", "Connection: close", "Expect: 100-continue",
                // Connection tokens as llhttp reads them (whether the connection stays open).
                "Connection: Keep-Alive, TE", "Connection: te,close", "Connection:  close ,", "Connection: ,keep-alive",
                "Connection: closed", "Connection: keep-alive close",
            ]
            for _ in 0..<next(5) { text += lines[next(lines.count)] + "\r\n" }
            switch next(6) {
            case 0, 1, 2:
                text += "Content-Length: \(body.utf8.count)\r\n\r\n" + body
            case 3:
                text += "\r\n"
            case 4:
                // One chunk or several, sizes in either case, sometimes a trailer.
                text += "Transfer-Encoding: chunked\r\n\r\n"
                var rest = Substring(body)
                while !rest.isEmpty {
                    let piece = rest.prefix(1 + next(max(rest.count, 1)))
                    rest = rest.dropFirst(piece.count)
                    let size = String(piece.utf8.count, radix: 16)
                    text += (next(2) == 0 ? size : size.uppercased()) + "\r\n" + piece + "\r\n"
                }
                text += next(4) == 0 ? "0\r\nX-Checksum: abc\r\n\r\n" : "0\r\n\r\n"
            default:
                text +=
                    "Content-Length: \(body.utf8.count)\r\nContent-Length: \(body.utf8.count + next(2))\r\n\r\n" + body
            }
            return Array(text.utf8)
        }

        mutating func mutate(_ bytes: [UInt8]) -> [UInt8] {
            let alphabet: [UInt8] =
                Array("\r\n :;0123456789abcdefABCDEF\t\0-,xX/?#%\"<>{}\\".utf8) + [0x7F, 0xC3, 0xFF, 0x0B, 0x0C]
            return random.mutate(bytes, alphabet: alphabet)
        }
    }

    @Test(
        "against llhttp on 6,000 generated connections and 12,000 mutated ones: every request ours reads, llhttp reads alike"
    )
    func differentialAgainstLLHTTP() {
        var generator = Generator(
            state: ProcessInfo.processInfo.environment["LMX_SEED"].flatMap { UInt64($0) } ?? 0xC11E_2026)
        var agreed = 0
        var leftToLLHTTP = 0
        var malformed = 0
        for round in 0..<18000 {
            // One to three requests on a connection, the last of them mutated after the first 6,000.
            var bytes: [UInt8] = []
            for _ in 0...generator.next(3) { bytes += generator.request() }
            if round >= 6000 { bytes = generator.mutate(bytes) }
            let ours = Self.ours(bytes, piece: [0, 1, 3, 50][generator.next(4)])
            let theirs = Self.llhttp(bytes)
            if ours.stopped { leftToLLHTTP += 1 }
            // Each request ours read whole, llhttp read the same: method, target, version,
            // headers, body, end.
            for (index, request) in ours.requests.enumerated() where request.ended {
                let same =
                    index < theirs.requests.count
                    && theirs.requests[index]
                        == Reading.Request(
                            method: request.method, uri: request.uri, minor: request.minor, headers: request.headers,
                            body: request.body, ended: true, keepAlive: request.keepAlive)
                #expect(
                    same,
                    "\(String(decoding: bytes, as: UTF8.self).debugDescription)\n ours: \(ours)\n llhttp: \(theirs)")
                if same { agreed += 1 }
            }
            // Where ours stopped, what it left is exactly the rest of the bytes after the requests
            // it read whole: llhttp, given the bytes before it, reads those requests and ends
            // cleanly at a request's start (where it is then given the rest).
            if ours.stopped {
                let prefix = Array(bytes[..<(bytes.count - ours.rest.count)])
                let before = Self.llhttp(prefix)
                #expect(
                    ours.requests.allSatisfy { $0.ended } && Array(bytes.suffix(ours.rest.count)) == ours.rest
                        && !before.stopped && before.requests.count == ours.requests.count
                        && before.requests.allSatisfy { $0.ended },
                    "\(String(decoding: bytes, as: UTF8.self).debugDescription)")
            }
            if ours.malformed { malformed += 1 }
        }
        #expect(agreed > 8000)
        print(
            "figure: client codec vs llhttp: \(agreed) requests read alike; \(leftToLLHTTP) connections left to llhttp; \(malformed) chunked bodies refused as malformed"
        )
    }
}

extension ClientCodecTests.Reading {
    /// llhttp's reading with ours' raw heads (llhttp gives none) and nothing left over, to compare.
    func withRaw(from ours: Self) -> Self {
        var copy = self
        for index in copy.requests.indices where index < ours.requests.count {
            copy.requests[index].raw = ours.requests[index].raw
        }
        return copy
    }
}
