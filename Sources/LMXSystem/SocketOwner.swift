import CLinux
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Who owns the other end of a loopback TCP connection: the kernel's socket tables, asked over
/// netlink (`NETLINK_SOCK_DIAG`, as `ss -e` does). On loopback the peer's socket is on this
/// machine, so its owner's uid is known exactly as `SO_PEERCRED` knows it for Unix sockets.
public enum SocketOwner {
    /// Netlink sockets kept between questions, each used by one question at a time: a socket
    /// costs three system calls to open, set up and close, on every connection the gateway
    /// accepts. Only a socket whose last answer was read whole comes back here.
    private static let kept = Mutex<[Int32]>([])
    private static let keptAtMost = 8
    /// Each question's number, echoed by the kernel in its answer.
    private static let questions = Atomic<UInt32>(0)

    /// The uid owning the TCP socket bound to `peer` and connected to `local` (both on this
    /// machine), or nil when the kernel does not say (not loopback, already closed).
    /// - Parameters: IPv4 or IPv6 addresses as 4 or 16 bytes, ports in host order.
    public static func uid(peer: (address: [UInt8], port: UInt16), local: (address: [UInt8], port: UInt16)) -> UInt32? {
        switch peerSocket(peer: peer, local: local) {
        case .held(let uid), .closed(let uid): uid
        case .absent, .unknown: nil
        }
    }

    /// What the kernel's tables say of the peer's socket of a TCP connection on this machine.
    public enum PeerSocket: Equatable, Sendable {
        /// A process holds it (its owner's uid).
        case held(uid: UInt32)
        /// Its process has closed it: the kernel finishes the connection alone (an orphan).
        case closed(uid: UInt32)
        /// The tables have no such socket (gone, or not on this machine).
        case absent
        /// The kernel could not be asked.
        case unknown
    }

    /// The socket bound to `peer` and connected to `local`, from the kernel's tables: whether a
    /// process still holds it. A client that has closed its connection and one that has only
    /// ended its side (`shutdown(SHUT_WR)`, still reading) both look the same from the
    /// connection itself until something is written to it; the peer's own socket tells them
    /// apart, when it is on this machine.
    /// - Parameters: IPv4 or IPv6 addresses as 4 or 16 bytes, ports in host order.
    public static func peerSocket(peer: (address: [UInt8], port: UInt16), local: (address: [UInt8], port: UInt16))
        -> PeerSocket
    {
        switch record(of: peer, to: local) {
        case .found(let record):
            // A socket no process holds any more has no inode (as `ss` shows it: `ino:0`).
            return record.idiag_inode == 0 ? .closed(uid: record.idiag_uid) : .held(uid: record.idiag_uid)
        case .absent: return .absent
        case .unknown: return .unknown
        }
    }

    /// Bytes the kernel still holds to send on this machine's socket bound to `local` and
    /// connected to `peer` (not yet sent, or sent and not acknowledged): nil when it does not say.
    /// A connection closed while the peer has not taken its answer, and the peer then sends, is
    /// reset, and the reset destroys what the peer had not read.
    /// - Parameters: IPv4 or IPv6 addresses as 4 or 16 bytes, ports in host order.
    public static func sendQueue(local: (address: [UInt8], port: UInt16), peer: (address: [UInt8], port: UInt16))
        -> Int?
    {
        guard case .found(let record) = record(of: local, to: peer) else { return nil }
        return Int(record.idiag_wqueue)
    }

    private enum Record {
        case found(inet_diag_msg)
        case absent
        case unknown
    }

    /// The kernel's record of the TCP socket bound to `source` and connected to `destination`
    /// (both IPv4, or both IPv6).
    private static func record(
        of source: (address: [UInt8], port: UInt16), to destination: (address: [UInt8], port: UInt16)
    ) -> Record {
        let family: UInt8
        switch (source.address.count, destination.address.count) {
        case (4, 4): family = UInt8(AF_INET)
        case (16, 16): family = UInt8(AF_INET6)
        default: return .unknown
        }
        guard let fd = kept.withLock({ $0.popLast() }) ?? openSocket() else { return .unknown }
        let (found, clean) = ask(fd, family: family, source: source, destination: destination)
        let keep =
            clean
            && kept.withLock { list in
                guard list.count < keptAtMost else { return false }
                list.append(fd)
                return true
            }
        if !keep { close(fd) }
        return found
    }

    /// Whether `address` (4 or 16 bytes) is a loopback address: 127.0.0.0/8, `::1`, or an
    /// IPv4 loopback address mapped into IPv6. A connection from one has its peer's socket on
    /// this machine.
    public static func isLoopback(_ address: [UInt8]) -> Bool {
        switch address.count {
        case 4:
            return address[0] == 127
        case 16:
            if address[0..<15].allSatisfy({ $0 == 0 }) { return address[15] == 1 }
            let mapped = address[0..<10].allSatisfy { $0 == 0 } && address[10] == 0xFF && address[11] == 0xFF
            return mapped && address[12] == 127
        default:
            return false
        }
    }

    private static func openSocket() -> Int32? {
        let fd = socket(AF_NETLINK, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), NETLINK_SOCK_DIAG)
        guard fd >= 0 else { return nil }
        var wait = timeval(tv_sec: 0, tv_usec: 200_000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, socklen_t(MemoryLayout<timeval>.size))
        return fd
    }

    /// One question on `fd`: the answer, and whether the exchange ended cleanly (the socket has
    /// nothing left to read and can be asked again).
    private static func ask(
        _ fd: Int32, family: UInt8, source: (address: [UInt8], port: UInt16),
        destination: (address: [UInt8], port: UInt16)
    ) -> (Record, clean: Bool) {
        // One SOCK_DIAG_BY_FAMILY request: a netlink header, then the socket asked about (its own
        // end, and the end it is connected to).
        struct Request {
            var header: nlmsghdr
            var body: inet_diag_req_v2
        }
        let number = questions.add(1, ordering: .relaxed).newValue
        var request = Request(header: nlmsghdr(), body: inet_diag_req_v2())
        request.header.nlmsg_len = UInt32(MemoryLayout<Request>.size)
        request.header.nlmsg_type = UInt16(SOCK_DIAG_BY_FAMILY)
        request.header.nlmsg_flags = UInt16(NLM_F_REQUEST)
        request.header.nlmsg_seq = number
        request.body.sdiag_family = family
        request.body.sdiag_protocol = UInt8(IPPROTO_TCP)
        request.body.idiag_states = 0xFFF  // every state
        request.body.id.idiag_sport = source.port.bigEndian
        request.body.id.idiag_dport = destination.port.bigEndian
        withUnsafeMutableBytes(of: &request.body.id.idiag_src) { $0.copyBytes(from: source.address) }
        withUnsafeMutableBytes(of: &request.body.id.idiag_dst) { $0.copyBytes(from: destination.address) }
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
        guard case .success(MemoryLayout<Request>.size) = sent else { return (.unknown, false) }
        // One datagram answers (the socket's record, or an error): the one numbered as ours.
        // One left by an earlier question is skipped (there is none unless that question's
        // socket was kept by mistake: a socket is kept only after a clean exchange).
        // A record is about a hundred bytes, an error about as much: a buffer of 1 KiB on the
        // stack, never cleared (only the `n` bytes received are read; a longer datagram is cut,
        // and its rest dropped by the kernel). An array of 8 KiB cleared on every connection
        // cost about 8,000 instructions, a new connection's twentieth.
        return withUnsafeTemporaryAllocation(byteCount: 1024, alignment: 8) { answer -> (Record, clean: Bool) in
            for _ in 0..<4 {
                guard
                    case .success(let n) = SystemCall.retrying({ recv(fd, answer.baseAddress, answer.count, 0) })
                else { return (.unknown, false) }
                let bytes = UnsafeRawBufferPointer(rebasing: answer[..<min(n, answer.count)])
                guard bytes.count >= MemoryLayout<nlmsghdr>.size else { return (.unknown, false) }
                let header = bytes.loadUnaligned(as: nlmsghdr.self)
                guard header.nlmsg_seq == number else { continue }
                // NLMSG_ERROR or NLMSG_DONE: no such socket.
                guard header.nlmsg_type == UInt16(SOCK_DIAG_BY_FAMILY) else { return (.absent, true) }
                guard bytes.count >= Int(lmx_nlmsg_hdrlen()) + MemoryLayout<inet_diag_msg>.size else {
                    return (.unknown, false)
                }
                return (
                    .found(bytes.loadUnaligned(fromByteOffset: Int(lmx_nlmsg_hdrlen()), as: inet_diag_msg.self)), true
                )
            }
            return (.unknown, false)
        }
    }
}
