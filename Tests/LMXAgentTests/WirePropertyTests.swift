import Foundation
import LMXCore
import NIOCore
import Testing

@testable import LMXAgent

/// Generated client and server behaviours over the whole pipeline in process
/// (``PipelineHarness``): pipelined requests drip-fed or sent at once (bodies by length or in
/// chunks, a byte at a time, within the read-ahead or streamed past it), answers by length,
/// chunked, as event streams (with or without a length, the last event without its final
/// newline), compressed, early (before the body has all come), cut at a random byte (a run's
/// event stream then resumed by its server's other route), each delivered in random slices. Every time: the bytes the client receives are one well-framed
/// answer per request, in order (or, where an answer was cut, the connection closes right after
/// it), and the bytes the connection holds stay within the bound.
@Suite("The gateway's wire, generated: one well-framed answer per request, in order, bytes held bounded")
struct WirePropertyTests {
    static let server = AgentFixture.lan("10.9.0.2")
    static let other = AgentFixture.lan("10.9.0.3")
    /// The bound the generated connections are held to (docs/gateway.md, "Bytes held").
    static let bound = 64 << 10

    @Test("300 generated connections (seeded: a failure names its seed)")
    func generated() async throws {
        try await AgentFixture.with { fixture in
            fixture.publish([Self.server, Self.other], oneServer: true)
            for seed in UInt64(1)...300 {
                var random = SplitMix(seed: seed)
                let scenario = Scenario(&random)
                var configuration = GatewayConfiguration()
                configuration.readAheadBytes = scenario.readAhead
                let pipe = try PipelineHarness(fixture, configuration: configuration)
                defer { pipe.finish() }
                try Self.run(scenario, pipe, &random, seed: seed)
            }
            // The generated cases reach what they are for: streams resumed by the other route.
            let resumed = fixture.agent.metrics.text().split(separator: "\n").first {
                $0.hasPrefix("lmx_gateway_streams_resumed_total ")
            }
            #expect((resumed?.split(separator: " ").last.flatMap { Int($0) } ?? 0) >= 10, "\(resumed ?? "none")")
        }
    }

    /// What a server does with one request (its first attempt; a request sent again is answered
    /// with plain JSON).
    enum Answer: CaseIterable {
        case json, chunkedJSON, stream, sizedStream, doneWithoutNewline, compressed, cutBeforeHead, cutMidBody,
            cutMidStream, cutMidSizedStream, early
    }

    enum Kind: CaseIterable { case get, post, chunkedPost, streamPost, runEvents }

    struct Scenario: CustomStringConvertible {
        var kinds: [Kind]
        var answers: [Answer]
        var clientSlice: Int
        var serverSlice: Int
        /// `gateway.read_ahead_bytes`: bodies read ahead whole, or streamed past 16 bytes.
        var readAhead: Int

        init(_ random: inout SplitMix) {
            let count = random.int(1...4)
            kinds = (0..<count).map { _ in random.pick(Kind.allCases) }
            answers = kinds.map { kind in
                // A run's events: whole, or cut after an event (then resumed by the other route).
                kind == .runEvents
                    ? random.pick([.stream, .cutMidStream, .cutMidSizedStream]) : random.pick(Answer.allCases)
            }
            clientSlice = random.pick([1, 3, 17, 64, 1 << 20])
            serverSlice = random.pick([1, 5, 29, 1 << 20])
            readAhead = random.pick([16, 256 << 10])
        }

        var description: String {
            "kinds \(kinds) answers \(answers) slices \(clientSlice)/\(serverSlice) read-ahead \(readAhead)"
        }
    }

    static func request(_ kind: Kind, _ index: Int) -> String {
        let body = #"{"model":"alpha","i":\#(index),"pad":"\#(String(repeating: "p", count: 40))"}"#
        switch kind {
        case .get:
            return "GET /v1/models?i=\(index) HTTP/1.1\r\nHost: x\r\n\r\n"
        case .runEvents:
            return "GET /v1/agents/runs/run-\(index)/events?i=\(index) HTTP/1.1\r\nHost: x\r\n\r\n"
        case .post, .streamPost:
            let path = kind == .post ? "/v1/embeddings" : "/v1/chat/completions"
            return
                "POST \(path)?i=\(index) HTTP/1.1\r\nHost: x\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
        case .chunkedPost:
            var text = "POST /v1/embeddings?i=\(index) HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            var rest = Substring(body)
            while !rest.isEmpty {
                let part = rest.prefix(7)
                rest = rest.dropFirst(part.count)
                text += String(part.utf8.count, radix: 16) + "\r\n" + part + "\r\n"
            }
            return text + "0\r\n\r\n"
        }
    }

    /// The server's answer to request `index`, and how many of its bytes go before a cut (nil: whole).
    static func answer(_ kind: Answer, _ index: Int, _ random: inout SplitMix) -> (String, cutAt: Int?) {
        let json = #"{"i":\#(index)}"#
        let events = "data: {\"i\":\(index),\"n\":1}\n\ndata: {\"i\":\(index),\"n\":2}\n\n"
        func chunked(_ body: String, pieces: Int) -> String {
            var text = ""
            var rest = Substring(body)
            while !rest.isEmpty {
                let part = rest.prefix(max(1, body.utf8.count / pieces))
                rest = rest.dropFirst(part.count)
                text += String(part.utf8.count, radix: 16) + "\r\n" + part + "\r\n"
            }
            return text + "0\r\n\r\n"
        }
        let sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        switch kind {
        case .json, .cutBeforeHead, .early:
            let whole = PipelineHarness.ok(json)
            return (whole, kind == .cutBeforeHead ? 0 : nil)
        case .chunkedJSON:
            return (
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                    + chunked(json, pieces: 3), nil
            )
        case .stream:
            return (sse + "Transfer-Encoding: chunked\r\n\r\n" + chunked(events + "data: [DONE]\n\n", pieces: 4), nil)
        case .sizedStream:
            let body = events + "data: [DONE]\n\n"
            return (sse + "Content-Length: \(body.utf8.count)\r\n\r\n" + body, nil)
        case .doneWithoutNewline:
            return (sse + "Transfer-Encoding: chunked\r\n\r\n" + chunked(events + "data: [DONE]", pieces: 2), nil)
        case .compressed:
            let coded = "~coded \(index)~"
            return (
                sse + "Content-Encoding: gzip\r\nContent-Length: \(coded.utf8.count)\r\n\r\n" + coded, nil
            )
        case .cutMidBody:
            let whole = PipelineHarness.ok(#"{"i":\#(index),"long":"\#(String(repeating: "l", count: 64))"}"#)
            let head = whole.utf8.count - 70
            return (whole, random.int(head...(whole.utf8.count - 2)))
        case .cutMidStream:
            let whole = sse + "Transfer-Encoding: chunked\r\n\r\n" + chunked(events, pieces: 2)
            let head = sse.utf8.count + 30
            return (whole, random.int(head...(whole.utf8.count - 8)))
        case .cutMidSizedStream:
            let head = sse + "Content-Length: \(events.utf8.count)\r\n\r\n"
            return (head + events, random.int(head.utf8.count...(head.utf8.count + events.utf8.count - 2)))
        }
    }

    static func run(_ scenario: Scenario, _ pipe: PipelineHarness, _ random: inout SplitMix, seed: UInt64) throws {
        let context = "seed \(seed): \(scenario)"
        var toSend = Array(scenario.kinds.enumerated().map { request($1, $0) }.joined().utf8)
        var serverText: [Int: [UInt8]] = [:]
        var firstAttempt = Set(scenario.kinds.indices)
        var received: [UInt8] = []
        var steps = 0
        while steps < 10_000 {
            steps += 1
            var progressed = false
            if !toSend.isEmpty, pipe.client.isActive, !pipe.handler.holdsReads {
                let slice = Array(toSend.prefix(scenario.clientSlice))
                toSend.removeFirst(slice.count)
                try pipe.client.writeInbound(ByteBuffer(bytes: slice))
                pipe.loop.run()
                progressed = true
            }
            for index in pipe.servers.indices where pipe.servers[index].isActive {
                serverText[index, default: []] += Array(try pipe.serverGot(index).utf8)
                let text = serverText[index]!
                // An early answer: as soon as the head has come (a body past the read-ahead
                // still coming), the rest of the request dropped with the connection after.
                let early =
                    Self.headEnd(text).flatMap { Self.marker(in: Array(text[..<$0])) }.map {
                        firstAttempt.contains($0) && scenario.answers[$0] == .early
                    } ?? false
                let request: [UInt8]
                if early {
                    request = text
                    serverText[index] = []
                } else {
                    guard let (whole, rest) = Self.wholeRequest(text) else { continue }
                    request = whole
                    serverText[index] = rest
                }
                guard let marker = Self.marker(in: request) else {
                    Issue.record("\(context): a request without its marker reached the server")
                    return
                }
                var kind = scenario.answers[marker]
                if !firstAttempt.contains(marker) { kind = scenario.kinds[marker] == .runEvents ? .stream : .json }
                firstAttempt.remove(marker)
                let (answer, cutAt) = Self.answer(kind, marker, &random)
                let bytes = Array(answer.utf8)
                let sent = bytes.prefix(cutAt ?? bytes.count)
                var offset = 0
                while offset < sent.count {
                    let slice = sent[offset..<min(sent.count, offset + scenario.serverSlice)]
                    offset += slice.count
                    try pipe.servers[index].writeInbound(ByteBuffer(bytes: slice))
                    pipe.loop.run()
                    #expect(pipe.handler.bytesHeld <= Self.bound, "\(context): held \(pipe.handler.bytesHeld)")
                }
                if cutAt != nil { pipe.serverCloses(index) }
                progressed = true
            }
            received += Array(try pipe.received().utf8)
            #expect(pipe.handler.bytesHeld <= Self.bound, "\(context): held \(pipe.handler.bytesHeld)")
            if !progressed { break }
        }
        check(received, scenario, active: pipe.client.isActive, context: context)
    }

    /// The client's bytes, read strictly: one well-framed answer per request, in order; an answer
    /// of the server's names its request; a connection closed only right after a cut answer.
    static func check(_ bytes: [UInt8], _ scenario: Scenario, active: Bool, context: String) {
        var reader = ResponseReader(bytes: bytes)
        var index = 0
        while let response = reader.next() {
            guard index < scenario.kinds.count else {
                Issue.record("\(context): more answers than requests")
                return
            }
            switch response {
            case .malformed(let why):
                Issue.record("\(context): answer \(index) malformed: \(why)")
                return
            case .truncated:
                #expect(!active, "\(context): answer \(index) cut short but the connection was kept")
                #expect(
                    [.cutMidBody, .cutMidStream, .cutMidSizedStream].contains(scenario.answers[index]),
                    "\(context): answer \(index) cut short without a cut")
                return
            case .whole(let status, let body):
                if status == 200, let marker = Self.marker(in: Array(body.utf8)) {
                    #expect(marker == index, "\(context): answer \(index) is request \(marker)'s")
                }
                if status == 200, body.contains("data: ") {
                    // (A run's stream cut is resumed by the other route: it ends whole.)
                    let cut =
                        [.cutMidStream, .cutMidSizedStream].contains(scenario.answers[index])
                        && scenario.kinds[index] != .runEvents
                    #expect(body.contains("event: error") == cut, "\(context): answer \(index): \(body)")
                    if !cut { #expect(body.contains("data: [DONE]"), "\(context): answer \(index): \(body)") }
                }
                if status != 200 {
                    #expect(
                        scenario.answers[index] == .cutBeforeHead && status == 502,
                        "\(context): answer \(index) status \(status): \(body)")
                }
                if scenario.answers[index] == .compressed {
                    #expect(body == "~coded \(index)~", "\(context): compressed body touched: \(body)")
                }
            }
            index += 1
        }
        // (A connection closes only right after an answer cut short: returned above.)
        #expect(active, "\(context): closed after \(index) whole answers")
        #expect(index == scenario.kinds.count, "\(context): \(index) answers to \(scenario.kinds.count) requests")
    }

    /// Where a head ends (its blank line's end), if it has.
    static func headEnd(_ bytes: [UInt8]) -> Int? {
        guard bytes.count >= 4 else { return nil }
        for index in 0...(bytes.count - 4) where bytes[index..<(index + 4)].elementsEqual([13, 10, 13, 10]) {
            return index + 4
        }
        return nil
    }

    /// The request's marker: `i=N` in its target, or `"i":N` in its body.
    static func marker(in bytes: [UInt8]) -> Int? {
        let text = String(decoding: bytes, as: UTF8.self)
        for key in ["?i=", "\"i\":"] {
            if let range = text.range(of: key) {
                return Int(text[range.upperBound...].prefix { $0.isNumber })
            }
        }
        return nil
    }

    /// A whole request at the start of what a server got, and what follows it.
    static func wholeRequest(_ bytes: [UInt8]) -> ([UInt8], [UInt8])? {
        let text = String(decoding: bytes, as: UTF8.self)
        guard let headEnd = text.range(of: "\r\n\r\n") else { return nil }
        let head = text[..<headEnd.lowerBound].lowercased()
        let bodyStart = text.utf8.distance(from: text.startIndex, to: headEnd.upperBound)
        var end = bodyStart
        if let line = head.split(separator: "\r\n").first(where: { $0.hasPrefix("content-length:") }) {
            guard let length = Int(line.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces))
            else { return nil }
            end += length
        } else if head.contains("transfer-encoding: chunked") {
            guard let last = text[headEnd.upperBound...].range(of: "0\r\n\r\n") else { return nil }
            end = text.utf8.distance(from: text.startIndex, to: last.upperBound)
        }
        guard end <= bytes.count else { return nil }
        return (Array(bytes[..<end]), Array(bytes[end...]))
    }
}

/// HTTP/1.1 answers read strictly from a client's bytes (interim 1xx skipped).
struct ResponseReader {
    enum Response {
        case whole(status: Int, body: String)
        case truncated
        case malformed(String)
    }

    let bytes: [UInt8]
    private var at = 0
    init(bytes: [UInt8]) { self.bytes = bytes }
    var atEnd: Bool { at >= bytes.count }

    mutating func next() -> Response? {
        guard !atEnd else { return nil }
        guard let headEnd = find([13, 10, 13, 10], from: at) else { return .truncated }
        let head = String(decoding: bytes[at..<headEnd], as: UTF8.self)
        var lines = head.components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst()
        guard statusLine.hasPrefix("HTTP/1.1 "), let status = Int(statusLine.dropFirst(9).prefix(3)) else {
            return .malformed("status line \(statusLine)")
        }
        at = headEnd + 4
        if status < 200 { return next() }
        var length: Int?
        var chunked = false
        for line in lines {
            let lower = line.lowercased()
            if lower.hasPrefix("content-length:") {
                guard length == nil else { return .malformed("two lengths") }
                length = Int(lower.dropFirst(15).trimmingCharacters(in: .whitespaces))
            }
            if lower.hasPrefix("transfer-encoding:") { chunked = lower.hasSuffix("chunked") }
        }
        if length != nil, chunked { return .malformed("a length and chunks") }
        if status == 204 || status == 304 { return .whole(status: status, body: "") }
        if let length {
            guard at + length <= bytes.count else { return .truncated }
            let body = String(decoding: bytes[at..<(at + length)], as: UTF8.self)
            at += length
            return .whole(status: status, body: body)
        }
        guard chunked else {
            // Until the connection's close.
            let body = String(decoding: bytes[at...], as: UTF8.self)
            at = bytes.count
            return .whole(status: status, body: body)
        }
        var body: [UInt8] = []
        while true {
            guard let lineEnd = find([13, 10], from: at) else { return .truncated }
            guard let size = Int(String(decoding: bytes[at..<lineEnd], as: UTF8.self), radix: 16) else {
                return .malformed("chunk size")
            }
            at = lineEnd + 2
            guard at + size + 2 <= bytes.count else { return .truncated }
            body += bytes[at..<(at + size)]
            guard bytes[at + size] == 13, bytes[at + size + 1] == 10 else { return .malformed("chunk end") }
            at += size + 2
            if size == 0 { return .whole(status: status, body: String(decoding: body, as: UTF8.self)) }
        }
    }

    private func find(_ pattern: [UInt8], from start: Int) -> Int? {
        guard bytes.count >= pattern.count else { return nil }
        var index = start
        while index + pattern.count <= bytes.count {
            if bytes[index..<(index + pattern.count)].elementsEqual(pattern) { return index }
            index += 1
        }
        return nil
    }
}

/// A seeded generator (SplitMix64): the same seed, the same connection.
struct SplitMix {
    private var state: UInt64
    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    mutating func int(_ range: ClosedRange<Int>) -> Int {
        range.lowerBound + Int(next() % UInt64(range.count))
    }

    mutating func pick<T>(_ values: [T]) -> T { values[int(0...(values.count - 1))] }
}
