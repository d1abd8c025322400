import LMXSystem

/// Why talking to the agent failed.
public enum StatusClientError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Nothing listens on the socket (no file, or a stale file from a daemon that is gone).
    case notRunning(socket: String, reason: String)
    /// Permission denied on the socket.
    case forbidden(socket: String)
    /// The daemon answered something that is not HTTP, or went away mid-answer.
    case protocolError(String)
    case timedOut
    /// The agent answered with an error (`reason` is the API's own explanation).
    case answered(status: Int, reason: String)

    public var description: String {
        switch self {
        case .notRunning(let socket, let reason): "lmx-agentd is not running (\(socket): \(reason))"
        case .forbidden(let socket): "permission denied on \(socket)"
        case .protocolError(let why): "unexpected answer from lmx-agentd: \(why)"
        case .timedOut: "lmx-agentd did not answer in time"
        case .answered(let status, let reason): "lmx-agentd answered \(status): \(reason)"
        }
    }
}

/// One HTTP answer from the agent.
public struct StatusResponse: Sendable {
    public var status: Int
    public var headers: [String: String]
    public var body: [UInt8]
}

/// A minimal HTTP/1.1 client over the agent's Unix socket: no event loop, no threads, so that
/// `lmx-status --url` costs a few milliseconds.
///
/// Kept by hand on purpose: async-http-client (used by the daemon) would start a NIO event loop
/// group and TLS machinery in every short-lived `lmx-status`, `lmx-pair` and shell-script call,
/// for one request over a local socket. This speaks only what the agent's socket answers:
/// `Connection: close`, Content-Length or chunked bodies, one deadline for the whole exchange.
public struct StatusClient: Sendable {
    public let socketPath: String
    public var timeout: Double

    public init(socketPath: String, timeout: Double = 5) {
        self.socketPath = socketPath
        self.timeout = timeout
    }

    /// The largest answer accepted (the agent's biggest, `/v1/status` with hundreds of servers,
    /// is far smaller).
    public static let maxBody = 16 << 20

    /// Performs one request and reads the whole answer, all within `timeout` seconds (connecting
    /// included: a full listen backlog waits at most that long).
    /// A JSON `body` is sent with its length.
    public func request(_ method: String = "GET", _ path: String, body: [UInt8] = []) throws(StatusClientError)
        -> StatusResponse
    {
        let socket = try connectSocket()
        let type = body.isEmpty ? "" : "Content-Type: application/json\r\n"
        try send(
            socket,
            Array(
                "\(method) \(path) HTTP/1.1\r\nHost: lmx-agent\r\nConnection: close\r\n\(type)Content-Length: \(body.count)\r\n\r\n"
                    .utf8) + body)
        // The whole exchange has one deadline: a peer that drips a byte at a time cannot hold us.
        var reader = Reader(socket: socket, deadline: SystemClock.monotonic() + timeout)
        let (status, headers) = try reader.readHead()
        var body: [UInt8] = []
        if headers["transfer-encoding"]?.lowercased().contains("chunked") == true {
            while let chunk = try reader.readChunk() {
                body += chunk
                guard body.count <= Self.maxBody else {
                    throw .protocolError("answer larger than \(Self.maxBody) bytes")
                }
            }
        } else if let raw = headers["content-length"] {
            guard let length = Int(raw.trimmingASCIISpaces), length >= 0, length <= Self.maxBody else {
                throw .protocolError("bad Content-Length")
            }
            body = try reader.read(count: length)
        } else {
            body = try reader.readToEnd(limit: Self.maxBody)
        }
        return StatusResponse(status: status, headers: headers, body: body)
    }

    /// Streams `/v1/watch`: calls `line` for every NDJSON line until the agent closes the stream
    /// or `line` returns false.
    public func stream(_ path: String, line: ([UInt8]) -> Bool) throws(StatusClientError) {
        let socket = try connectSocket(receiveTimeout: nil)
        try send(socket, Array("GET \(path) HTTP/1.1\r\nHost: lmx-agent\r\nConnection: close\r\n\r\n".utf8))
        var reader = Reader(socket: socket)
        let (status, headers) = try reader.readHead()
        guard status == 200 else { throw .protocolError("HTTP \(status)") }
        let chunked = headers["transfer-encoding"]?.lowercased().contains("chunked") == true
        var pending: [UInt8] = []
        while true {
            let data: [UInt8]?
            if chunked { data = try reader.readChunk() } else { data = try reader.readSome() }
            guard let data else { return }
            pending += data
            while let newline = pending.firstIndex(of: 0x0A) {
                let text = Array(pending[..<newline])
                pending.removeSubrange(...newline)
                if !line(text) { return }
            }
        }
    }

    private func connectSocket(receiveTimeout: Double? = -1) throws(StatusClientError) -> UnixStream {
        guard let address = UnixSocketAddress(socketPath) else {
            throw .notRunning(socket: socketPath, reason: "path too long")
        }
        do {
            return try UnixStream(
                connectingTo: address, sendTimeout: timeout,
                receiveTimeout: receiveTimeout == -1 ? timeout : receiveTimeout)
        } catch {
            switch error {
            case .forbidden: throw .forbidden(socket: socketPath)
            case .timedOut: throw .timedOut
            case .notListening(let reason): throw .notRunning(socket: socketPath, reason: reason)
            case .other(let reason): throw .protocolError(reason)
            }
        }
    }

    private func send(_ socket: UnixStream, _ bytes: [UInt8]) throws(StatusClientError) {
        guard socket.send(bytes) else { throw .protocolError("the connection closed while sending") }
    }
}

/// Buffered reads with just enough HTTP/1.1 parsing for the agent's answers.
private struct Reader {
    let socket: UnixStream
    /// Monotonic seconds after which reading fails with `.timedOut` (nil: a stream, no end).
    let deadline: Double?
    var buffer: [UInt8] = []
    var eof = false

    init(socket: UnixStream, deadline: Double? = nil) {
        self.socket = socket
        self.deadline = deadline
    }

    mutating func fill() throws(StatusClientError) -> Bool {
        guard !eof else { return false }
        if let deadline, SystemClock.monotonic() > deadline { throw .timedOut }
        switch socket.receive() {
        case .data(let bytes):
            buffer += bytes
            return true
        case .end:
            eof = true
            return false
        case .timedOut:
            throw .timedOut
        case .failed(let why):
            throw .protocolError("read failed: \(why)")
        }
    }

    mutating func readLine() throws(StatusClientError) -> String {
        while true {
            if let index = buffer.firstIndex(of: 0x0A) {
                var line = Array(buffer[..<index])
                buffer.removeSubrange(...index)
                if line.last == 0x0D { line.removeLast() }
                return String(decoding: line, as: UTF8.self)
            }
            guard buffer.count < 65_536 else { throw .protocolError("header line too long") }
            guard try fill() else { throw .protocolError("the connection closed early") }
        }
    }

    mutating func readHead() throws(StatusClientError) -> (Int, [String: String]) {
        let statusLine = try readLine()
        let parts = statusLine.split(separator: " ", maxSplits: 2)
        guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), let status = Int(parts[1]) else {
            throw .protocolError("not an HTTP answer")
        }
        var headers: [String: String] = [:]
        while true {
            let line = try readLine()
            if line.isEmpty { break }
            guard let colon = line.firstIndex(of: ":") else { continue }
            let name = line[..<colon].lowercased()
            let value = line[line.index(after: colon)...].drop { $0 == " " }
            headers[name] = String(value)
        }
        return (status, headers)
    }

    mutating func read(count: Int) throws(StatusClientError) -> [UInt8] {
        guard count >= 0 else { throw .protocolError("negative length") }
        while buffer.count < count {
            guard try fill() else { throw .protocolError("the answer was cut short") }
        }
        let result = Array(buffer[..<count])
        buffer.removeFirst(count)
        return result
    }

    mutating func readToEnd(limit: Int) throws(StatusClientError) -> [UInt8] {
        while try fill() {
            guard buffer.count <= limit else { throw .protocolError("answer larger than \(limit) bytes") }
        }
        defer { buffer = [] }
        return buffer
    }

    /// Whatever is available next; `nil` at the end of the stream.
    mutating func readSome() throws(StatusClientError) -> [UInt8]? {
        if buffer.isEmpty, !(try fill()) { return nil }
        defer { buffer = [] }
        return buffer
    }

    /// The next chunk of a chunked body; `nil` after the last one.
    mutating func readChunk() throws(StatusClientError) -> [UInt8]? {
        let sizeLine = try readLine()
        let digits = (sizeLine.split(separator: ";").first ?? "").trimmingASCIISpaces
        guard !digits.isEmpty, digits.count <= 8, digits.allSatisfy(\.isHexDigit), let size = Int(digits, radix: 16),
            size <= StatusClient.maxBody
        else {
            throw .protocolError("bad chunk size")
        }
        if size == 0 {
            _ = try? readLine()
            return nil
        }
        let data = try read(count: size)
        _ = try readLine()
        return data
    }
}

extension StringProtocol {
    var trimmingASCIISpaces: String {
        let bytes = Array(utf8)
        var start = 0
        var end = bytes.count
        while start < end, bytes[start] == 0x20 || bytes[start] == 0x09 { start += 1 }
        while end > start, bytes[end - 1] == 0x20 || bytes[end - 1] == 0x09 { end -= 1 }
        return String(decoding: bytes[start..<end], as: UTF8.self)
    }
}
