/// How long the gateway keeps an idle connection to a server for the next request, read from the
/// server's last answer on it.
///
/// A request sent just as the server closes an idle connection is lost, and a chat completion is
/// not sent again (it may have arrived), so a connection waits for less than the server keeps it:
/// - the server said how long (`Keep-Alive: timeout=N`, as Apache and Node.js send): a second less
///   (as undici does);
/// - Cloudflare's edge, which every tunnel's answers come through (they carry `CF-RAY` and
///   `Server: cloudflare`), keeps an idle HTTP/1.1 connection from a client for 400 s (its
///   documented limit): 300 s, so that the first request after a pause does not wait for a new
///   TCP and TLS handshake with the edge (two round trips over the internet);
/// - otherwise 4 s: servers that say nothing close idle connections after a few seconds (uvicorn,
///   which Opta LMX servers run on, after 5 s).
///
/// Fed one header at a time (names in any case, in any order); reading is total: a hint that does
/// not parse is ignored.
public struct UpstreamKeepAlive: Sendable, Equatable {
    /// Without a hint.
    public static let unknownSeconds = 4
    /// Behind Cloudflare's edge.
    public static let cloudflareSeconds = 300
    /// The longest the gateway keeps an idle connection, whatever a server says.
    public static let maxSeconds = 300

    /// The smallest `timeout` of the answer's `Keep-Alive` headers.
    private var hint: Int?
    private var rayID = false
    private var serverCloudflare = false

    public init() {}

    /// One header of the answer.
    public mutating func read(name: String, value: String) {
        // Lengths first: most headers are none of these three.
        switch name.utf8.count {
        case 10 where name.equalsASCIILowercased("keep-alive"):
            if let timeout = Self.timeout(in: value) { hint = min(hint ?? timeout, timeout) }
        case 6 where name.equalsASCIILowercased("cf-ray"):
            readRayID(present: !value.isEmpty)
        case 6 where name.equalsASCIILowercased("server"):
            readServer(isCloudflare: value.trimmingASCIIWhitespace().equalsASCIILowercased("cloudflare"))
        default:
            break
        }
    }

    /// A `Server` header (its value is `cloudflare`, ignoring case and the spaces around it, or
    /// not) and a `CF-RAY` header (it has a value, or not), read by the caller from the bytes:
    /// as ``read(name:value:)`` reads them, without their `String`s.
    public mutating func readServer(isCloudflare: Bool) { serverCloudflare = isCloudflare }
    /// The answer came through Cloudflare's edge (`CF-RAY`, or `Server: cloudflare`).
    public var throughCloudflare: Bool { rayID || serverCloudflare }
    public mutating func readRayID(present: Bool) { rayID = present }

    /// Seconds the connection may wait idle; 0: not kept.
    public var seconds: Int {
        if let hint { return min(max(hint - 1, 0), Self.maxSeconds) }
        if rayID && serverCloudflare { return Self.cloudflareSeconds }
        return Self.unknownSeconds
    }

    /// The `timeout` parameter of a `Keep-Alive` value (`timeout=5, max=100`): whole seconds, at
    /// most nine digits, optionally quoted; nil if there is none that parses.
    public static func timeout(in value: String) -> Int? {
        for parameter in value.split(separator: ",", maxSplits: 16, omittingEmptySubsequences: true) {
            guard let equals = parameter.firstIndex(of: "=") else { continue }
            let name = String(parameter[..<equals]).trimmingASCIIWhitespace()
            guard name.equalsASCIILowercased("timeout") else { continue }
            var number = String(parameter[parameter.index(after: equals)...]).trimmingASCIIWhitespace()
            if number.utf8.count >= 2, number.hasPrefix("\""), number.hasSuffix("\"") {
                number = String(number.dropFirst().dropLast())
            }
            guard (1...9).contains(number.utf8.count), number.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }),
                let seconds = Int(number)
            else { return nil }
            return seconds
        }
        return nil
    }
}
