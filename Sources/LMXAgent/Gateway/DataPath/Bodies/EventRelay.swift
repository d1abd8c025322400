import LMXCore
import NIOCore

/// Server-sent events passed on whole: a chunk goes out up to its last event boundary at once;
/// only a trailing partial event waits for its end (at most ``Gateway/maxHeldEvent`` bytes, then
/// it goes as it is). Counts events as they pass (first and last, for the traffic figures). Both
/// paths of the gateway pass streams through it. An object: a request's relay changes with every
/// chunk, in place (a value held by the request would be copied out and back).
final class EventRelay {
    // (Its properties are changed through locals moved out of them and back: an access to a
    // class's property that spans a call the compiler cannot see into, as `ByteBuffer`'s writes
    // and the clock are, is checked at run time, about 70 instructions each.)
    private var held = ByteBuffer()
    /// Bytes of an unfinished event were passed on.
    private(set) var midEvent = false
    /// The last byte passed on of that unfinished event (``finish(framed:)`` tells by it whether
    /// it ended mid-line).
    private var lastPassed: UInt8?
    private(set) var tally = Gateway.EventTally()
    /// A stream that may be opened again (``StreamContinuation``): its events are looked at as
    /// they pass (``resumable()``).
    private var resumable: ResumableEvents?

    /// The last whole event passed on, and whether the stream's `data: [DONE]` has passed; after
    /// the stream is opened again (``resumed()``), its first event is dropped when it repeats the
    /// last one the client got (a run's events are whole snapshots: the same state, the same
    /// bytes).
    struct ResumableEvents {
        var last: [UInt8] = []
        var done = false
        var dropRepeat = false
    }

    /// The bytes of an unfinished event it holds, and the last event a resumable stream keeps.
    var bytesHeld: Int { held.readableBytes + (resumable?.last.count ?? 0) }

    /// Looks at the events as they pass, for a stream that may be opened again.
    func makeResumable() { resumable = ResumableEvents() }

    /// The stream's `data: [DONE]` has passed: nothing more is to come.
    var sawDone: Bool { resumable?.done ?? false }

    /// The stream goes on from a new answer: what was held of an unfinished event is dropped
    /// (the new answer starts with whole events), and its first event is dropped if the client
    /// already has it. Returns what ends an event the client got in part (only one larger than
    /// anyone sends is passed on unfinished), to be sent first.
    func resumed() -> ByteBuffer? {
        held = ByteBuffer()
        resumable?.dropRepeat = true
        guard midEvent else { return nil }
        midEvent = false
        return ByteBuffer(string: "\n\n")
    }

    /// Passes what may go now of `chunk` to `out`.
    func pass(_ chunk: ByteBuffer, _ out: (ByteBuffer) -> Void) {
        guard resumable != nil else { return passWhole(chunk, out) }
        passWhole(chunk) { passed in
            if let kept = self.look(at: passed) { out(kept) }
        }
    }

    /// The events in `passed` (whole, but for one larger than anyone sends), the last one and
    /// `[DONE]` noted; the first after a resume dropped when it repeats the last passed. Nil
    /// when nothing of it goes on.
    private func look(at passed: ByteBuffer) -> ByteBuffer? {
        guard var seen = resumable else { return passed }
        defer { resumable = seen }
        let bytes = Array(passed.readableBytesView)
        var kept: [UInt8] = []
        kept.reserveCapacity(bytes.count)
        var start = 0
        var index = 0
        func event(_ range: Range<Int>) {
            let event = bytes[range]
            // Comments (`: keep-alive`) pass, and are no event of the run's.
            if event.first == UInt8(ascii: ":") {
                kept.append(contentsOf: event)
                return
            }
            if seen.dropRepeat {
                seen.dropRepeat = false
                if event.elementsEqual(seen.last) { return }
            }
            seen.last = Array(event)
            if Self.isDone(event) { seen.done = true }
            kept.append(contentsOf: event)
        }
        while index < bytes.count {
            if bytes[index] == 0x0A {
                var end: Int?
                if index + 1 < bytes.count, bytes[index + 1] == 0x0A {
                    end = index + 2
                } else if index + 2 < bytes.count, bytes[index + 1] == 0x0D, bytes[index + 2] == 0x0A {
                    end = index + 3
                }
                if let end {
                    event(start..<end)
                    start = end
                    index = end
                    continue
                }
            } else if bytes[index] == 0x0D, index + 1 < bytes.count, bytes[index + 1] == 0x0D {
                // Lines ended by CR alone.
                event(start..<index + 2)
                start = index + 2
                index = start
                continue
            }
            index += 1
        }
        if start < bytes.count { kept.append(contentsOf: bytes[start...]) }
        if kept.count == bytes.count { return passed }
        return kept.isEmpty ? nil : ByteBuffer(bytes: kept)
    }

    /// An event whose data is `[DONE]`.
    private static func isDone(_ event: ArraySlice<UInt8>) -> Bool {
        // (Lines end in LF, CRLF or CR alone.)
        event.split(whereSeparator: { $0 == 0x0A || $0 == 0x0D }).contains { line in
            line.elementsEqual("data: [DONE]".utf8) || line.elementsEqual("data:[DONE]".utf8)
        }
    }

    /// Passes what may go now of `chunk` to `out`: up to its last event boundary.
    private func passWhole(_ chunk: ByteBuffer, _ out: (ByteBuffer) -> Void) {
        var chunk = chunk
        var tally = self.tally
        chunk.withUnsafeReadableBytes { tally.count($0) }
        self.tally = tally
        var held = ByteBuffer()
        swap(&held, &self.held)
        defer { swap(&held, &self.held) }
        if let boundary = chunk.withUnsafeReadableBytes({ EventBoundary.end(in: $0) })
            ?? Self.straddling(held, chunk)
        {
            if held.readableBytes > 0 {
                var first = held
                held = ByteBuffer()
                first.writeBytes(chunk.readableBytesView.prefix(boundary))
                out(first)
            } else if boundary == chunk.readableBytes {
                out(chunk)
                midEvent = false
                return
            } else {
                out(chunk.getSlice(at: chunk.readerIndex, length: boundary)!)
            }
            midEvent = false
            chunk.moveReaderIndex(forwardBy: boundary)
        }
        if midEvent || held.readableBytes + chunk.readableBytes > Gateway.maxHeldEvent {
            // An event larger than anyone sends: passed on as it comes, what was held of it
            // first, the rest read by read until its end (nothing more of it held: the bytes
            // held stay within `maxHeldEvent`, and each read waits for the client as any does).
            if held.readableBytes > 0 { out(held) }
            if let last = chunk.readableBytesView.last ?? held.readableBytesView.last { lastPassed = last }
            held = ByteBuffer()
            if chunk.readableBytes > 0 { out(chunk) }
            midEvent = true
            return
        }
        held.writeBuffer(&chunk)
    }

    /// A blank line that begins in what is `held` and ends at the start of `chunk`: the offset
    /// past it.
    /// (`\n` + `\n`, `\n` + `\r\n`, `\n\r` + `\n`, or `\r` + `\r`: a server that ends its lines with `\r\n`,
    /// as sse-starlette does, has its blank line split between two reads wherever a proxy or a
    /// tunnel cuts the stream.)
    static func straddling(_ held: ByteBuffer, _ chunk: ByteBuffer) -> Int? {
        guard let first = chunk.readableBytesView.first, let last = held.readableBytesView.last else { return nil }
        // Lines ended by CR alone: `\r` + `\r`.
        if last == 0x0D, first == 0x0D { return 1 }
        if last == 0x0D, first == 0x0A, held.readableBytes >= 2,
            held.getInteger(at: held.writerIndex - 2, as: UInt8.self) == 0x0A
        {
            return 1
        }
        guard last == 0x0A else { return nil }
        if first == 0x0A { return 1 }
        if first == 0x0D, chunk.readableBytes >= 2, chunk.readableBytesView.dropFirst().first == 0x0A { return 2 }
        return nil
    }

    /// The stream's body ended: what completes its last event, nil when nothing is held; `cut`
    /// when it cannot be told whole. Ended as its framing says (its length, its last chunk:
    /// `framed`), an event the server did not close with its blank line (`data: [DONE]` and the
    /// body's end) is whole: the server said so by ending the body, so it is passed on with the
    /// line ends a reader needs, never reported as cut — unless its data opens JSON that it does
    /// not close (a length that cut the event mid-JSON: ``endsWhole(_:)``). A body that runs
    /// until the server closes says nothing of that: one that ends mid-line is treated as a lost
    /// connection (a reader would drop that event). An event larger than ``Gateway/maxHeldEvent``,
    /// passed on unfinished, cannot be read back: it is ended when it stopped at a line's end,
    /// and reported cut when it stopped mid-line.
    func finish(framed: Bool) -> (rest: ByteBuffer?, cut: Bool) {
        var rest = ByteBuffer()
        swap(&rest, &held)
        if rest.readableBytes == 0, midEvent, let last = lastPassed {
            midEvent = false
            guard last == 0x0A || last == 0x0D else { return (nil, true) }
            return (ByteBuffer(string: last == 0x0A ? "\n" : "\r"), false)
        }
        guard rest.readableBytes > 0 else { return (nil, false) }
        let last = rest.readableBytesView.last
        let midLine = last != 0x0A && last != 0x0D
        if (midLine && !framed) || !Self.endsWhole(rest.readableBytesView) { return (nil, true) }
        // The blank line that ends it, in its own line ends (a CR alone is answered by a CR: a
        // LF after it would read as the end of a CRLF).
        rest.writeString(last == 0x0A ? "\n" : last == 0x0D ? "\r" : "\n\n")
        var seen = resumable
        if seen != nil, Self.isDone(Array(rest.readableBytesView)[...]) { seen?.done = true }
        resumable = seen
        return (rest, false)
    }

    /// Whether an event the body's end left without its blank line is whole: its data does not
    /// open JSON (`{`, `[`), or its JSON closes (every `{` and `[` closed, outside strings:
    /// `[DONE]` does). Read over the bytes held, which the relay bounds.
    static func endsWhole(_ event: ByteBufferView) -> Bool {
        let lines = event.split(omittingEmptySubsequences: false, whereSeparator: { $0 == 0x0A || $0 == 0x0D })
        var depth = 0
        var inString = false
        var escaped = false
        var opened: Bool?
        for line in lines where line.starts(with: "data:".utf8) {
            var value = line.dropFirst(5)
            if value.first == UInt8(ascii: " ") { value = value.dropFirst() }
            for byte in value {
                if opened == nil, byte != UInt8(ascii: " "), byte != UInt8(ascii: "\t") {
                    opened = byte == UInt8(ascii: "{") || byte == UInt8(ascii: "[")
                }
                if inString {
                    if escaped {
                        escaped = false
                    } else if byte == UInt8(ascii: "\\") {
                        escaped = true
                    } else if byte == UInt8(ascii: "\"") {
                        inString = false
                    }
                    continue
                }
                switch byte {
                case UInt8(ascii: "\""): inString = true
                case UInt8(ascii: "{"), UInt8(ascii: "["): depth += 1
                case UInt8(ascii: "}"), UInt8(ascii: "]"): depth -= 1
                default: break
                }
            }
        }
        return opened != true || (depth <= 0 && !inString)
    }

    /// The connection was lost mid-stream: what was held is dropped; an event already partly
    /// passed on is ended first, so the error event stands on its own.
    func lost(target: GatewayTarget, error: any Error) -> ByteBuffer {
        held = ByteBuffer()
        var out = ByteBuffer()
        if midEvent { out.writeString("\n\n") }
        out.writeBytes(Gateway.streamLostEvent(target: target, error: error))
        midEvent = false
        return out
    }
}
