import Testing

@testable import LMXCore

@Suite("Server-sent events from /admin/events")
struct ServerEventTests {
    @Test("events split across chunks, CRLF, comments, multi-line data; the model named by any field")
    func parse() {
        var parser = ServerEventParser()
        var events: [ServerEvent] = []
        let stream =
            "event: heartbeat\ndata: {}\n\n: a comment\r\nevent: model_loaded\r\ndata: {\"model_id\":\"qwen3-32b\"}\r\n\r\nevent: readiness_changed\ndata: {\"ready\":\ndata: false}\n\ndata: {\"id\":\"x\"}\n\n"
        // Fed in 7-byte pieces, as a network delivers them.
        var bytes = Array(stream.utf8)[...]
        while !bytes.isEmpty {
            events += parser.feed(bytes.prefix(7))
            bytes = bytes.dropFirst(7)
        }
        #expect(events.map(\.type) == ["heartbeat", "model_loaded", "readiness_changed", "message"])
        #expect(events[1].model == "qwen3-32b")
        #expect(String(decoding: events[2].data, as: UTF8.self) == "{\"ready\":\nfalse}")
        #expect(events[3].model == "x")
        #expect(ServerEvent(type: "model_unloaded", data: Array(#"{"model":"m"}"#.utf8)).model == "m")
        #expect(ServerEvent(type: "model_unloaded", data: Array("not json".utf8)).model == nil)
    }

    @Test("an endless line or event is dropped, not kept in memory")
    func bounded() {
        var parser = ServerEventParser()
        let huge = [UInt8](repeating: UInt8(ascii: "a"), count: ServerEventParser.maxEventBytes + 10)
        #expect(parser.feed(Array("data: ".utf8) + huge).isEmpty)
        #expect(parser.feed(Array("\n\nevent: heartbeat\n\n".utf8)).map(\.type) == ["heartbeat"])
    }
}
