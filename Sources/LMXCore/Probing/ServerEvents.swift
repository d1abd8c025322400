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
    /// The offset just past the last blank line (`\n\n`, `\n\r\n`, or `\r\r` of a stream whose
    /// lines end in CR alone, as the event-stream grammar allows) in `bytes`; nil when there is
    /// none. Searched from the end: in a stream of complete events it is found at once.
    public static func end(in bytes: UnsafeRawBufferPointer) -> Int? {
        var i = bytes.count - 1
        while i >= 1 {
            let byte = bytes[i]
            if byte == 0x0A {
                if bytes[i - 1] == 0x0A { return i + 1 }
                if i >= 2, bytes[i - 1] == 0x0D, bytes[i - 2] == 0x0A { return i + 1 }
            } else if byte == 0x0D, bytes[i - 1] == 0x0D {
                // (`\r\r\n` of a CR line end and a CRLF one: its LF then reads as one more blank
                // line, which dispatches nothing.)
                return i + 1
            }
            i -= 1
        }
        return nil
    }

    /// Where a stream's bytes stand between reads, for ``count(in:line:)``.
    public enum Line: Sendable, Hashable {
        /// Inside a line that is not empty.
        case midLine
        /// At the start of a line (the stream's start, or after a line end).
        case start
        /// Just after a CR: a LF now completes that CRLF, not one more line.
        case afterCR
    }

    /// How many events end in `bytes` (blank lines: lines end in LF, CRLF or CR alone, as the
    /// event-stream grammar says), given where the bytes before them left off (`line`, carried
    /// from chunk to chunk). One pass.
    public static func count(in bytes: UnsafeRawBufferPointer, line: inout Line) -> Int {
        var count = 0
        var state = line
        var index = 0
        while index < bytes.count {
            // Inside a line that is not empty (most of an event's bytes), words of eight bytes
            // with no line end are passed at once: nothing in them changes the count or the line.
            if state == .midLine {
                while bytes.count &- index >= 8 {
                    let word = ByteWord.word(bytes, at: index)
                    guard ByteWord.bytes(equalTo: 0x0A, in: word) | ByteWord.bytes(equalTo: 0x0D, in: word) == 0
                    else { break }
                    index &+= 8
                }
                guard index < bytes.count else { break }
            }
            switch bytes[index] {
            case 0x0A:
                // The LF of a CRLF ends nothing more.
                if state == .start { count += 1 }
                state = .start
            case 0x0D:
                if state != .midLine { count += 1 }
                state = .afterCR
            default:
                state = .midLine
            }
            index &+= 1
        }
        line = state
        return count
    }

    /// The same over an array (tests, small inputs).
    public static func end(in bytes: [UInt8]) -> Int? {
        bytes.withUnsafeBytes { end(in: $0) }
    }
}
