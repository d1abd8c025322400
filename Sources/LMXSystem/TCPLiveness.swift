#if canImport(Glibc)
import Glibc
#endif

/// The kernel's own watch over a TCP connection's peer: keepalive probes while the connection is
/// quiet, and a bound on how long sent data may go unacknowledged. A server that is busy (a long
/// prompt's prefill, slow health answers) still acknowledges them from its kernel; one that
/// vanished without a word (a cut link, a powered-off machine) does not, and the connection fails
/// after `idle + interval × count` seconds of silence — the stream is judged by its own
/// connection, not by probes of other connections.
public struct TCPLiveness: Sendable, Hashable {
    /// Seconds of silence before the first keepalive probe.
    public var idle: Int32
    /// Seconds between keepalive probes.
    public var interval: Int32
    /// Unanswered probes after which the connection fails.
    public var count: Int32

    public init(idle: Int32, interval: Int32, count: Int32) {
        self.idle = idle
        self.interval = interval
        self.count = count
    }

    /// On the LAN: a silent peer is found within 5 s.
    public static let lan = TCPLiveness(idle: 2, interval: 1, count: 3)
    /// Through a tunnel (its edge answers for the server; the Internet may lose a few packets).
    public static let wan = TCPLiveness(idle: 10, interval: 5, count: 3)

    /// Seconds of silence after which a peer that answers nothing is given up.
    public var giveUpSeconds: Int32 { idle + interval * count }

    /// The `IPPROTO_TCP`-level options and values that set this (beside `SO_KEEPALIVE` = 1),
    /// including `TCP_USER_TIMEOUT` (milliseconds) so that data sent into a black hole fails as
    /// soon.
    public var tcpOptions: [(name: Int32, value: Int32)] {
        [
            (Int32(TCP_KEEPIDLE), idle), (Int32(TCP_KEEPINTVL), interval), (Int32(TCP_KEEPCNT), count),
            (Int32(TCP_USER_TIMEOUT), giveUpSeconds * 1000),
        ]
    }
}
