import CLinux

#if canImport(Glibc)
import Glibc
#endif

/// Who owns the other end of a loopback TCP connection: the kernel's socket tables, asked over
/// netlink (`NETLINK_SOCK_DIAG`, as `ss -e` does). On loopback the peer's socket is on this
/// machine, so its owner's uid is known exactly as `SO_PEERCRED` knows it for Unix sockets.
public enum SocketOwner {
    /// The uid owning the TCP socket bound to `peer` and connected to `local` (both on this
    /// machine), or nil when the kernel does not say (not loopback, already closed).
    /// - Parameters: IPv4 or IPv6 addresses as 4 or 16 bytes, ports in host order.
    public static func uid(peer: (address: [UInt8], port: UInt16), local: (address: [UInt8], port: UInt16)) -> UInt32? {
        let family: UInt8
        switch (peer.address.count, local.address.count) {
        case (4, 4): family = UInt8(AF_INET)
        case (16, 16): family = UInt8(AF_INET6)
        default: return nil
        }
        let fd = socket(AF_NETLINK, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), NETLINK_SOCK_DIAG)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var wait = timeval(tv_sec: 0, tv_usec: 200_000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, socklen_t(MemoryLayout<timeval>.size))

        // One SOCK_DIAG_BY_FAMILY request: a netlink header, then the socket asked about. Its
        // source is the peer's socket's own end, its destination ours.
        struct Request {
            var header: nlmsghdr
            var body: inet_diag_req_v2
        }
        var request = Request(header: nlmsghdr(), body: inet_diag_req_v2())
        request.header.nlmsg_len = UInt32(MemoryLayout<Request>.size)
        request.header.nlmsg_type = UInt16(SOCK_DIAG_BY_FAMILY)
        request.header.nlmsg_flags = UInt16(NLM_F_REQUEST)
        request.body.sdiag_family = family
        request.body.sdiag_protocol = UInt8(IPPROTO_TCP)
        request.body.idiag_states = 0xFFF  // every state
        request.body.id.idiag_sport = peer.port.bigEndian
        request.body.id.idiag_dport = local.port.bigEndian
        withUnsafeMutableBytes(of: &request.body.id.idiag_src) { $0.copyBytes(from: peer.address) }
        withUnsafeMutableBytes(of: &request.body.id.idiag_dst) { $0.copyBytes(from: local.address) }
        request.body.id.idiag_cookie = (INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE)

        var kernel = sockaddr_nl()  // the kernel: pid 0, no groups
        kernel.nl_family = __kernel_sa_family_t(AF_NETLINK)
        let sent = withUnsafeBytes(of: &request) { bytes in
            withUnsafePointer(to: &kernel) { address in
                address.withMemoryRebound(to: sockaddr.self, capacity: 1) { to in
                    SystemCall.retrying {
                        sendto(fd, bytes.baseAddress, bytes.count, 0, to, socklen_t(MemoryLayout<sockaddr_nl>.size))
                    }
                }
            }
        }
        guard case .success(MemoryLayout<Request>.size) = sent else { return nil }
        var answer = [UInt8](repeating: 0, count: 8192)
        guard
            case .success(let n) = SystemCall.retrying({
                answer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            })
        else { return nil }
        let headerSize = MemoryLayout<nlmsghdr>.size
        guard n >= headerSize + MemoryLayout<inet_diag_msg>.size else { return nil }
        return answer.withUnsafeBytes { raw -> UInt32? in
            let header = raw.loadUnaligned(as: nlmsghdr.self)
            // NLMSG_ERROR or NLMSG_DONE: no such socket.
            guard header.nlmsg_type == UInt16(SOCK_DIAG_BY_FAMILY) else { return nil }
            return raw.loadUnaligned(fromByteOffset: lmx_nlmsg_hdrlen(), as: inet_diag_msg.self).idiag_uid
        }
    }
}
