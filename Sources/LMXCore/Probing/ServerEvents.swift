#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// One event of a server's `/admin/events` stream (server-sent events).
public struct ServerEvent: Sendable, Hashable {
    public var type: String
    public var data: [UInt8]

    /// The model an event names (`model_loaded`, `model_unloaded`), whatever the field is called.
    public var model: String? {
        struct Fields: Decodable {
            var model_id: String?
            var model: String?
            var id: String?
            var name: String?
        }
        guard let fields = try? JSONDecoder().decode(Fields.self, from: Data(data)) else { return nil }
        return fields.model_id ?? fields.model ?? fields.id ?? fields.name
    }
}

/// Splits a server-sent event stream into events: `event:` and `data:` lines, a blank line
/// ends one; comments (`:`) and unknown fields are skipped. Lines end with LF or CRLF.
public struct ServerEventParser: Sendable {
    private var pending: [UInt8] = []
    private var type: String?
    private var data: [UInt8] = []
    private var hasData = false
    /// `pending` before this offset holds no newline (already searched).
    private var searched = 0
    /// An event larger than this is dropped (the server's are small JSON documents).
    public static let maxEventBytes = 256 * 1024

    public init() {}

    public mutating func feed(_ bytes: some Sequence<UInt8>) -> [ServerEvent] {
        var events: [ServerEvent] = []
        pending.append(contentsOf: bytes)
        // Lines are read by index and the consumed part dropped once: linear in the input, also
        // for a chunk of many thousand short lines.
        var start = 0
        defer {
            pending.removeSubrange(..<start)
            searched = pending.count
        }
        while let newline = pending[max(start, searched)...].firstIndex(of: 0x0A) {
            var line = pending[start..<newline]
            start = newline + 1
            if line.last == 0x0D { line.removeLast() }
            if line.isEmpty {
                if type != nil || hasData {
                    events.append(ServerEvent(type: type ?? "message", data: data))
                }
                type = nil
                data = []
                hasData = false
                continue
            }
            if line.first == UInt8(ascii: ":") { continue }
            let colon = line.firstIndex(of: UInt8(ascii: ":")) ?? line.endIndex
            let field = String(decoding: line[..<colon], as: UTF8.self)
            var value = colon < line.endIndex ? line[(colon + 1)...] : []
            if value.first == 0x20 { value.removeFirst() }
            switch field {
            case "event":
                type = String(decoding: value, as: UTF8.self)
            case "data":
                if hasData { data.append(0x0A) }
                data += value
                hasData = true
                if data.count > Self.maxEventBytes {
                    data = []
                    hasData = false
                    type = nil
                }
            default:
                break
            }
        }
        if pending.count - start > Self.maxEventBytes { start = pending.count }
        return events
    }
}

/// Where server-sent events end, for passing a stream on whole events at a time.
public enum EventBoundary {
    /// The offset just past the last blank line (`\n\n` or `\n\r\n`) in `bytes`; nil when there is
    /// none. Searched from the end: in a stream of complete events it is found at once.
    public static func end(in bytes: UnsafeRawBufferPointer) -> Int? {
        var i = bytes.count - 1
        while i >= 1 {
            if bytes[i] == 0x0A {
                if bytes[i - 1] == 0x0A { return i + 1 }
                if i >= 2, bytes[i - 1] == 0x0D, bytes[i - 2] == 0x0A { return i + 1 }
            }
            i -= 1
        }
        return nil
    }

    /// How many events end in `bytes` (blank lines: `\n\n` or `\n\r\n`), given whether the
    /// bytes before them ended a line (`afterNewline`, carried from chunk to chunk). One pass.
    public static func count(in bytes: UnsafeRawBufferPointer, afterNewline: inout Bool) -> Int {
        var count = 0
        var lineStart = afterNewline  // at the start of a line that is empty so far
        var index = 0
        while index < bytes.count {
            // Inside a line that is not empty (most of an event's bytes), words of eight bytes
            // with no line feed are passed at once: nothing in them changes the count or the line.
            if !lineStart {
                while bytes.count &- index >= 8,
                    ByteWord.bytes(equalTo: 0x0A, in: ByteWord.word(bytes, at: index)) == 0
                {
                    index &+= 8
                }
                guard index < bytes.count else { break }
            }
            let byte = bytes[index]
            if byte == 0x0A {
                if lineStart { count += 1 }
                lineStart = true
            } else if byte != 0x0D || !lineStart {
                lineStart = false
            }
            index &+= 1
        }
        afterNewline = lineStart
        return count
    }

    /// The same over an array (tests, small inputs).
    public static func end(in bytes: [UInt8]) -> Int? {
        bytes.withUnsafeBytes { end(in: $0) }
    }
}
