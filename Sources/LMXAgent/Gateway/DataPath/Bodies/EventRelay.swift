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
    private(set) var tally = Gateway.EventTally()

    /// Passes what may go now of `chunk` to `out`.
    func pass(_ chunk: ByteBuffer, _ out: (ByteBuffer) -> Void) {
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
        held.writeBuffer(&chunk)
        if held.readableBytes > Gateway.maxHeldEvent {
            // An event larger than anyone sends: passed on as it is.
            out(held)
            held = ByteBuffer()
            midEvent = true
        }
    }

    /// A blank line that begins in what is `held` and ends at the start of `chunk`: the offset
    /// past it.
    private static func straddling(_ held: ByteBuffer, _ chunk: ByteBuffer) -> Int? {
        guard held.readableBytesView.last == 0x0A, let first = chunk.readableBytesView.first else { return nil }
        if first == 0x0A { return 1 }
        if first == 0x0D, chunk.readableBytes >= 2, chunk.readableBytesView.dropFirst().first == 0x0A { return 2 }
        return nil
    }

    /// The stream ended: what completes its last event (one that ends after a whole line but
    /// without the blank line), nil when nothing is held; `cut` when it ended mid-line (a reader
    /// would drop that event: treated as a lost connection).
    func finish() -> (rest: ByteBuffer?, cut: Bool) {
        var rest = ByteBuffer()
        swap(&rest, &held)
        guard rest.readableBytes > 0 else { return (nil, false) }
        guard rest.readableBytesView.last == 0x0A else { return (nil, true) }
        rest.writeString("\n")
        return (rest, false)
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
