import Foundation
import Testing

@testable import LMXCore

/// What arrives from outside is read by total functions: the cases by hand, then at least 100,000
/// generated or mutated inputs per parser (seeded, so a failure repeats), none of which may trap.
@Suite("Outside input: total parsing and fuzzing of every parser")
struct OutsideInputTests {
    static let iterations = 100_000

    @Test("Retry-After: delay seconds clamped; dates, signs, exponents, hex, non-finite and lists are not a delay")
    func delaySeconds() {
        #expect(OutsideInput.delaySeconds("30", cap: 60) == 30)
        #expect(OutsideInput.delaySeconds(" 7 ", cap: 60) == 7)
        #expect(OutsideInput.delaySeconds("\t2.5", cap: 60) == 2.5)
        #expect(OutsideInput.delaySeconds("0", cap: 60) == 0)
        #expect(OutsideInput.delaySeconds("99999999999999999999999999999999999", cap: 60) == 60)
        #expect(OutsideInput.delaySeconds(String(repeating: "9", count: 256), cap: 3600) == 3600)
        for bad in [
            "nan", "NaN", "inf", "-inf", "infinity", "-1", "+5", "1e309", "1e3", "0x10", "5, 7", "", " ", ".", "5.",
            ".5",
            "Wed, 21 Oct 2015 07:28:00 GMT", "\u{661}\u{662}", "1_000", "5s", String(repeating: "9", count: 300),
        ] {
            #expect(OutsideInput.delaySeconds(bad, cap: 60) == nil, "\(bad)")
        }
    }

    @Test("Content-Length: digits only, below Int64, no lists or signs")
    func contentLength() {
        #expect(OutsideInput.contentLength("0") == 0)
        #expect(OutsideInput.contentLength("4096") == 4096)
        #expect(OutsideInput.contentLength("999999999999999999") == 999_999_999_999_999_999)
        for bad in [
            "", "-1", "+1", " 5", "5 ", "5, 5", "0x10", "1e3", "9999999999999999999", "99999999999999999999999",
        ] {
            #expect(OutsideInput.contentLength(bad) == nil, "\(bad)")
        }
    }

    @Test("counts from documents clamped; kept text bounded; identifiers whole or not at all")
    func countsAndText() {
        #expect(OutsideInput.count(Int.max) == OutsideInput.maxCount)
        #expect(OutsideInput.count(Int.min) == 0)
        #expect(OutsideInput.count(nil) == nil)
        let long = OutsideInput.label(String(repeating: "é", count: 10_000), maxBytes: 64)
        #expect(long != nil && long!.utf8.count <= 64 && long!.hasSuffix("…"))
        #expect(OutsideInput.label("0.1.0", maxBytes: 64) == "0.1.0")
        #expect(OutsideInput.label("a\u{1}b", maxBytes: 64) == nil)
        #expect(OutsideInput.identifier("Mono512:1234") == "Mono512:1234")
        #expect(OutsideInput.identifier(String(repeating: "x", count: 301)) == nil)
        #expect(OutsideInput.identifier("Mono512\u{0}:1234") == nil)
    }

    @Test("a discovery document full of odd numbers and huge strings is kept clamped and bounded")
    func hostileDocument() {
        let document = """
            {"service":"opta-lmx","instance_id":"\(String(repeating: "i", count: 70_000))","version":"\(String(repeating: "v", count: 70_000))",
             "ready":true,"in_flight_requests":9223372036854775807,"loaded_model_count":-9223372036854775808,
             "loaded_models":[\((0..<2000).map { "\"\(String(repeating: "m", count: 200))\($0)\"" }.joined(separator: ","))],
             "endpoints":{"preferred_base_url":"http://\(String(repeating: "h", count: 4000))","base_urls":[\((0..<3000).map { "\"http://10.0.\($0 % 250).1:1\"" }.joined(separator: ","))]}}
            """
        let report = Self.probe(discovery: Array(document.utf8))
        #expect(report.verdict == .ready)
        #expect(report.instanceID == nil)
        #expect((report.version ?? "").utf8.count <= ProbeSequence.maxVersionBytes)
        #expect(report.inFlightRequests == OutsideInput.maxCount)
        #expect(report.modelCount == 0)
        #expect((report.models ?? []).count <= ProbeSequence.maxModels)
        #expect((report.advertisedBaseURLs ?? []).count <= 64)
    }

    /// Drives a whole probe with `discovery` as the document (and a busy `readyz` when asked).
    static func probe(discovery: [UInt8], retryAfter: String? = nil) -> ProbeReport {
        var sequence = ProbeSequence(servicePath: TXTRecord.defaultServicePath, via: .lan)
        var step = sequence.receive(
            .success(ProbeResponse(status: 200, body: Array(#"{"status":"ok","version":"0.1.0"}"#.utf8))))
        for _ in 0..<6 {
            guard case .request(let path) = step else { break }
            let response: ProbeResponse
            switch path {
            case "/readyz":
                if let retryAfter {
                    response = ProbeResponse(
                        status: 503, headers: ["Retry-After": retryAfter],
                        body: Array(#"{"error":{"message":"x","type":"server_error","code":"overloaded"}}"#.utf8))
                } else {
                    response = ProbeResponse(
                        status: 200, body: Array(#"{"status":"ready","models_loaded":1e999}"#.utf8))
                }
            case "/v1/models":
                response = ProbeResponse(status: 200, body: discovery)
            default:
                response = ProbeResponse(status: 200, body: discovery)
            }
            step = sequence.receive(.success(response))
        }
        if case .finished(let report) = step { return report }
        return ProbeReport(verdict: .down, latency: 0)
    }

    // MARK: - Fuzzing

    /// Mutates `seed` a few times: replace, delete, insert, duplicate a run, cut, or splice in a
    /// hostile token (numbers past Int64, exponents, non-finite words, invalid UTF-8, NUL).
    static func mutate(_ seed: [UInt8], _ rng: inout SplitMix64) -> [UInt8] {
        let alphabet =
            Array("{}[]\":,.-+eE0123456789 \t\r\nabcxyz=%&?/\\u".utf8) + [0x00, 0x7F, 0xC0, 0xFF, 0xED, 0xA0]
        let tokens: [[UInt8]] = [
            "9223372036854775807", "-9223372036854775808", "18446744073709551616", "1e400", "-1e400", "1.5e308", "NaN",
            "Infinity", "-0", "0x7fffffff", "\"\\ud800\"", "null", "true", "[]", "{}", "\"\u{0}\"",
            String(repeating: "9", count: 400), String(repeating: "[", count: 300),
        ].map { Array($0.utf8) }
        var bytes = seed
        for _ in 0...(rng.next() % 8) {
            guard !bytes.isEmpty else { break }
            let at = Int(rng.next() % UInt64(bytes.count))
            switch rng.next() % 7 {
            case 0: bytes[at] = alphabet[Int(rng.next() % UInt64(alphabet.count))]
            case 1: bytes.remove(at: at)
            case 2: bytes.insert(alphabet[Int(rng.next() % UInt64(alphabet.count))], at: at)
            case 3: bytes.insert(contentsOf: bytes[at...].prefix(Int(rng.next() % 24)), at: at)
            case 4: bytes = Array(bytes.prefix(at))
            default:
                // Replace a number or a word with a hostile token.
                var end = at
                while end < bytes.count, !",}] \n".utf8.contains(bytes[end]) { end += 1 }
                bytes.replaceSubrange(at..<end, with: tokens[Int(rng.next() % UInt64(tokens.count))])
            }
        }
        return bytes
    }

    static let documentSeed = Array(
        """
        {"schema_version":"2026-03-02","instance_id":"Mono512:1234","service":"opta-lmx","version":"0.1.0",\
        "security_profile":"lan","ready":true,"loaded_models":["mlx-community/MiniMax-M2.5-4bit"],"loaded_model_count":1,\
        "in_flight_requests":0,"auth":{"admin_key_required":true,"inference_key_required":true},\
        "endpoints":{"preferred_base_url":"http://mono512.local:1234","base_urls":["http://192.168.188.11:1234"]}}
        """.utf8)

    @Test("100,000 mutated discovery documents through a whole probe: no trap, every kept value bounded")
    func fuzzDiscoveryDocument() {
        var rng = SplitMix64(seed: 0xD15C0)
        var decoded = 0
        for _ in 0..<Self.iterations {
            let bytes = Self.mutate(Self.documentSeed, &rng)
            if DiscoveryDocument.decode(bytes) != nil { decoded += 1 }
            let report = Self.probe(discovery: bytes)
            #expect((report.inFlightRequests ?? 0) >= 0 && (report.inFlightRequests ?? 0) <= OutsideInput.maxCount)
            #expect((report.modelCount ?? 0) >= 0 && (report.modelCount ?? 0) <= OutsideInput.maxCount)
            #expect((report.version ?? "").utf8.count <= ProbeSequence.maxVersionBytes)
            #expect((report.instanceID ?? "").utf8.count <= 300)
        }
        #expect(decoded > 5_000)
    }

    @Test("100,000 generated header values (Retry-After, Content-Length) through the probe and the gateway's readers")
    func fuzzHeaders() {
        var rng = SplitMix64(seed: 0x4EAD)
        let seeds = ["30", "2.5", "0", "Wed, 21 Oct 2015 07:28:00 GMT", "120", "1e3", "9999999999999999999"].map {
            Array($0.utf8)
        }
        var delays = 0
        for i in 0..<Self.iterations {
            let bytes = Self.mutate(seeds[i % seeds.count], &rng)
            let text = String(decoding: bytes, as: UTF8.self)
            if let seconds = OutsideInput.delaySeconds(text, cap: 3600) {
                delays += 1
                #expect(seconds.isFinite && seconds >= 0 && seconds <= 3600)
            }
            if let length = OutsideInput.contentLength(text) { #expect(length >= 0) }
            if i % 10 == 0 {
                let report = Self.probe(discovery: Self.documentSeed, retryAfter: text)
                #expect(report.verdict == .overloaded)
                if let wait = report.retryAfter { #expect(wait.isFinite && wait >= 0 && wait <= 3600) }
            }
        }
        #expect(delays > 1000)
    }

    @Test("100,000 mutated event streams in random pieces: no trap, events and held bytes bounded")
    func fuzzServerEvents() {
        var rng = SplitMix64(seed: 0x55E)
        let seed = Array(
            "event: model_loaded\ndata: {\"model_id\":\"qwen3-32b\"}\n\n: c\r\nevent: heartbeat\r\ndata: {}\r\n\r\ndata: x\n\n"
                .utf8)
        var parser = ServerEventParser()
        var events = 0
        for _ in 0..<Self.iterations {
            let mutated = Self.mutate(seed, &rng)
            // The boundary search from the end finds what a plain search from the start finds last.
            var lastBlank: Int?
            for i in mutated.indices.dropFirst()
            where mutated[i] == 0x0A
                && (mutated[i - 1] == 0x0A || (i >= 2 && mutated[i - 1] == 0x0D && mutated[i - 2] == 0x0A))
                || mutated[i] == 0x0D && mutated[i - 1] == 0x0D
            { lastBlank = i + 1 }
            #expect(EventBoundary.end(in: mutated) == lastBlank)
            var bytes = mutated[...]
            while !bytes.isEmpty {
                let piece = Int(rng.next() % 40) + 1
                for event in parser.feed(bytes.prefix(piece)) {
                    events += 1
                    #expect(event.data.count <= ServerEventParser.maxEventBytes)
                    _ = event.model
                }
                bytes = bytes.dropFirst(piece)
            }
        }
        #expect(events > 50_000)
        // One giant line and a megabyte of blank lines: bounded, linear.
        var big = ServerEventParser()
        for _ in 0..<40 { _ = big.feed(repeatElement(UInt8(ascii: "z"), count: 64 * 1024)) }
        #expect(big.feed(Array("\n\ndata: ok\n\n".utf8)).map(\.type) == ["message"])
        #expect(big.feed(repeatElement(UInt8(0x0A), count: 1 << 20)).isEmpty)
    }

    @Test("event boundaries: found from the end, LF, CRLF and CR alone, none in a partial event")
    func eventBoundary() {
        #expect(EventBoundary.end(in: Array("data: a\r\rdata: b".utf8)) == 9)
        #expect(EventBoundary.end(in: Array("data: a\rdata: b".utf8)) == nil)
        #expect(EventBoundary.end(in: Array("data: a\n\n".utf8)) == 9)
        #expect(EventBoundary.end(in: Array("data: a\r\n\r\ndata: b".utf8)) == 11)
        #expect(EventBoundary.end(in: Array("data: a\n\ndata: b\n\ndata: c".utf8)) == 18)
        #expect(EventBoundary.end(in: Array("data: a\ndata: b".utf8)) == nil)
        #expect(EventBoundary.end(in: []) == nil)
        #expect(EventBoundary.end(in: [0x0A]) == nil)
    }

    @Test("100,000 mutated TXT records: no trap, the service path is always a path")
    func fuzzTXT() {
        var rng = SplitMix64(seed: 0x7A7)
        let seeds = ["path=/.well-known/opta-lmx", "service=opta-lmx", "flag", "=x", "PATH=/v1/discovery", ""].map {
            Array($0.utf8)
        }
        for _ in 0..<Self.iterations {
            let count = Int(rng.next() % 5)
            let entries = (0..<count).map { _ in Self.mutate(seeds[Int(rng.next() % UInt64(seeds.count))], &rng) }
            let txt = TXTRecord(entries: entries)
            let path = txt.servicePath
            #expect(path.hasPrefix("/"))
            _ = txt["service"]
            _ = DNSSDText.quoteTXT(txt)
        }
    }

    @Test("100,000 mutated pairing payloads and address books: no trap; what is accepted is bounded")
    func fuzzPairingPayloads() {
        var rng = SplitMix64(seed: 0xB00C)
        let parser = PairingParser(now: 1_760_000_000)
        let seeds = [
            "opta-lmx://pair?v=1&name=Studio&url=https%3A%2F%2Fquiet-river-1234.trycloudflare.com&key=ADMIN&api_key=INFER&cf_id=ID.access&cf_secret=SECRET&instance=Mono512%3A1234&lan=192.168.188.11%3A1234&exp=1767225600",
            "https://lmx.optalocal.com/connect?host=192.168.188.11&port=1234&via=lan&tunnel=https%3A%2F%2Fx.trycloudflare.com",
            #"{"entries":[{"id":"192.168.188.11:1234","label":"LMX","host":"192.168.188.11","port":1234,"tunnelUrl":"https://example.trycloudflare.com","lastConnectedVia":"mdns"},{"host":"10.0.0.2","port":"1234","tunnel_url":"https://b.example","last_connected_via":"lan"}]}"#,
            #"{"entries":[{"host":"h.local","port":65535},{"host":"[fe80::1%25eth0]","port":1}]}"#,
        ].map { Array($0.utf8) }
        var accepted = 0
        for i in 0..<Self.iterations {
            let bytes = Self.mutate(seeds[i % seeds.count], &rng)
            guard let pairings = try? parser.parse(bytes) else { continue }
            for pairing in pairings {
                accepted += 1
                #expect((pairing.wan?.url.utf8.count ?? 0) <= 4096)
                if let lan = pairing.lan { #expect((1...65535).contains(lan.port)) }
            }
        }
        #expect(accepted > 1000)
    }

    @Test(
        "100,000 mutated request bodies: the model field reader never traps, and agrees with Foundation's JSON reader on every whole body"
    )
    func fuzzModelField() {
        var rng = SplitMix64(seed: 0x30DE1)
        let seed = Array(
            #"{"messages":[{"role":"user","content":"hi \"there\""}],"stream":true,"model":"qwen3-32b","n":1}"#.utf8)
        let key = Array(#""model""#.utf8)
        var found = 0
        var compared = 0
        for _ in 0..<Self.iterations {
            let bytes = Self.mutate(seed, &rng)
            let model = ModelField.find(in: bytes)
            if model != nil { found += 1 }
            // Read in place (the data path's first body part) as read from the array.
            #expect(bytes.withUnsafeBytes { ModelField.find(in: $0) } == model)
            // A prefix that holds the whole field reads as the whole body does (the data path
            // reads the first part alone first).
            if let model, bytes.count > 1 {
                let prefix = Array(bytes.prefix(Int(rng.next() % UInt64(bytes.count)) + 1))
                if let early = ModelField.find(in: prefix) { #expect(early == model) }
            }
            // A whole JSON object whose text names `"model"` once (no other key or value that
            // spells it): the reader's answer is the object's `model` string, or nil.
            guard Self.occurrences(of: key, in: bytes) == 1,
                let object = try? JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any]
            else { continue }
            compared += 1
            #expect(model == object["model"] as? String, "\(String(decoding: bytes, as: UTF8.self))")
        }
        #expect(found > 10_000)
        #expect(compared > 1_000, "\(compared) bodies compared")
    }

    private static func occurrences(of needle: [UInt8], in haystack: [UInt8]) -> Int {
        guard haystack.count >= needle.count else { return 0 }
        return (0...(haystack.count - needle.count)).count { haystack[$0..<($0 + needle.count)].elementsEqual(needle) }
    }
}
