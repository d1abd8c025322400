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
        let fd = socket(AF_NETLINK, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 4 /* NETLINK_SOCK_DIAG */)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var wait = timeval(tv_sec: 0, tv_usec: 200_000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, socklen_t(MemoryLayout<timeval>.size))

        // struct nlmsghdr (16) + struct inet_diag_req_v2 (56).
        var request = [UInt8](repeating: 0, count: 72)
        func put32(_ value: UInt32, at offset: Int) { withUnsafeBytes(of: value.littleEndian) { request.replaceSubrange(offset..<offset + 4, with: $0) } }
        put32(72, at: 0)  // nlmsg_len
        request[4] = 20  // nlmsg_type: SOCK_DIAG_BY_FAMILY (20)
        request[6] = 1  // nlmsg_flags: NLM_F_REQUEST
        request[16] = family  // sdiag_family
        request[17] = UInt8(IPPROTO_TCP)  // sdiag_protocol
        put32(0xFFF, at: 20)  // idiag_states: every state
        // inet_diag_sockid: source is the peer's socket's own end, destination ours.
        request[24] = UInt8(peer.port >> 8)
        request[25] = UInt8(peer.port & 0xFF)
        request[26] = UInt8(local.port >> 8)
        request[27] = UInt8(local.port & 0xFF)
        request.replaceSubrange(28..<28 + peer.address.count, with: peer.address)
        request.replaceSubrange(44..<44 + local.address.count, with: local.address)
        put32(0xFFFF_FFFF, at: 64)  // idiag_cookie: INET_DIAG_NOCOOKIE
        put32(0xFFFF_FFFF, at: 68)

        // struct sockaddr_nl (not imported into Swift): the kernel, pid 0, no groups.
        var kernel = [UInt8](repeating: 0, count: 12)
        kernel[0] = UInt8(AF_NETLINK & 0xFF)
        let sent = kernel.withUnsafeBytes { raw in
            sendto(fd, request, request.count, 0, raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(raw.count))
        }
        guard sent == request.count else { return nil }
        var answer = [UInt8](repeating: 0, count: 8192)
        let n = answer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        // nlmsghdr (16), then struct inet_diag_msg: family, state, timer, retrans, sockid (48),
        // expires, rqueue, wqueue, uid (at 64).
        guard n >= 16 + 72 else { return nil }
        let type = UInt16(answer[4]) | UInt16(answer[5]) << 8
        guard type == 20 else { return nil }  // NLMSG_ERROR (2) or NLMSG_DONE (3): no such socket
        return answer.withUnsafeBytes { UInt32(littleEndian: $0.loadUnaligned(fromByteOffset: 16 + 64, as: UInt32.self)) }
    }
}
