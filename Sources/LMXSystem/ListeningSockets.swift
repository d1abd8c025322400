#if canImport(Glibc)
import Glibc
#endif

/// Who listens on a TCP port of this machine: the kernel's socket tables (`/proc/net/tcp`,
/// `/proc/net/tcp6`), read the way `ss -tlne` reads them. Used to say which user holds the
/// gateway's port when the agent cannot bind it.
public enum ListeningSockets {
    /// The uid of a socket listening on `port` (any local address) in the IPv4 (`ipv6: false`)
    /// or IPv6 table; nil when none is found or the table cannot be read.
    public static func owner(port: Int, ipv6: Bool) -> UInt32? {
        guard let bytes = try? FileSystem.read(ipv6 ? "/proc/net/tcp6" : "/proc/net/tcp", limit: 8 << 20) else {
            return nil
        }
        for line in String(decoding: bytes, as: UTF8.self).split(separator: "\n").dropFirst() {
            // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid ...
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count > 7, fields[3] == "0A" else { continue }  // TCP_LISTEN
            let local = fields[1].split(separator: ":")
            guard local.count == 2, let listened = Int(local[1], radix: 16), listened == port else { continue }
            if let uid = UInt32(fields[7]) { return uid }
        }
        return nil
    }
}

/// Whether a TCP port is free for a listener that will share it among its own sockets.
///
/// Sockets that set `SO_REUSEPORT` share a port with every earlier socket of the same user that
/// set it too: a second agent of that user would bind the port beside the first without an error,
/// and the kernel would hand each of them a share of the connections. A socket bound without
/// `SO_REUSEPORT` shares with nobody, so binding one first (and closing it, never listening)
/// says whether anyone holds the port, of whichever user.
public enum PortClaim {
    /// nil when `port` on the numeric address `host` can be bound by a socket that shares it
    /// with nobody (or `host` is not a numeric address: nothing is claimed); else the `errno` of
    /// the refusal (`EADDRINUSE`: someone listens there).
    public static func refusal(host: String, port: Int) -> Int32? {
        guard let address = IPSocketAddress(host, port: UInt16(truncatingIfNeeded: port)) else { return nil }
        let fd = socket(address.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return errno }
        defer { close(fd) }
        // Connections of an earlier run waiting out TIME_WAIT on the port do not hold it.
        var one: Int32 = 1
        _ = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        return address.withSockAddr { bind(fd, $0, $1) } == 0 ? nil : errno
    }
}
