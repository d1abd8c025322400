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
