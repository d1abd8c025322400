import CLinux
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Tells when this machine's links, addresses or routes change: an rtnetlink socket subscribed
/// to the kernel's link, IPv4/IPv6 address and route groups. Messages are only counted by kind;
/// what changed is read afterwards from the interfaces and the routing table themselves
/// (``RouteLookup``), which stays right however the kernel batches its messages.
public final class NetworkMonitor {
    public let descriptor: Int32

    /// What arrived since the last read.
    public struct Change: Sendable, Equatable {
        /// An address was added or a link changed (possibly came up): worth asking mDNS again.
        public var linkOrAddressUp = false
        /// Anything at all changed (or messages were lost: treated as a change).
        public var any = false
    }

    /// - Throws: when netlink is unavailable (a sandbox without `AF_NETLINK`).
    public init() throws(SystemError) {
        let fd = socket(
            AF_NETLINK, Int32(SOCK_RAW.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue),
            NETLINK_ROUTE)
        guard fd >= 0 else { throw SystemError("cannot open a netlink socket") }
        var address = sockaddr_nl()
        address.nl_family = __kernel_sa_family_t(AF_NETLINK)
        address.nl_groups = lmx_rtnetlink_groups()
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_nl>.size))
            }
        }
        guard bound == 0 else {
            let code = errno
            close(fd)
            throw SystemError("cannot subscribe to the kernel's network changes", code: code)
        }
        descriptor = fd
    }

    deinit { close(descriptor) }

    /// Reads every message waiting (never blocks).
    public func drain() -> Change {
        var change = Change()
        var buffer = [UInt8](repeating: 0, count: 32 * 1024)
        while true {
            let received = SystemCall.retrying {
                buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            }
            guard case .success(let n) = received else {
                // ENOBUFS: the kernel dropped messages; the state is read afresh anyway.
                if case .failure(let error) = received, error == .noBufferSpace {
                    change = Change(linkOrAddressUp: true, any: true)
                    continue
                }
                return change
            }
            guard n > 0 else { return change }
            var offset = 0
            let headerSize = MemoryLayout<nlmsghdr>.size
            while offset + headerSize <= n {
                let header = buffer.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: offset, as: nlmsghdr.self) }
                let length = Int(header.nlmsg_len)
                guard length >= headerSize else { break }
                change.any = true
                if header.nlmsg_type == UInt16(RTM_NEWLINK) || header.nlmsg_type == UInt16(RTM_NEWADDR) {
                    change.linkOrAddressUp = true
                }
                offset += lmx_nlmsg_align(length)
            }
        }
    }
}
