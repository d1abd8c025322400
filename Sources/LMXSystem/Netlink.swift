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

    // <linux/rtnetlink.h>, stable kernel ABI (not exported by the Glibc module).
    private static let netlinkRoute: Int32 = 0
    private static let groups: UInt32 = 0x1 /* LINK */ | 0x10 /* IPV4_IFADDR */ | 0x40 /* IPV4_ROUTE */
        | 0x100 /* IPV6_IFADDR */ | 0x400 /* IPV6_ROUTE */
    private static let newLink: UInt16 = 16, newAddress: UInt16 = 20

    /// `struct sockaddr_nl`.
    private struct NetlinkAddress {
        var family: UInt16 = UInt16(AF_NETLINK)
        var pad: UInt16 = 0
        var pid: UInt32 = 0
        var groups: UInt32
    }

    /// - Throws: when netlink is unavailable (a sandbox without `AF_NETLINK`).
    public init() throws(SystemError) {
        let fd = socket(AF_NETLINK, Int32(SOCK_RAW.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), Self.netlinkRoute)
        guard fd >= 0 else { throw SystemError("cannot open a netlink socket") }
        var address = NetlinkAddress(groups: Self.groups)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<NetlinkAddress>.size)) }
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
            let n = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if n < 0 {
                // ENOBUFS: the kernel dropped messages; the state is read afresh anyway.
                if errno == ENOBUFS { change = Change(linkOrAddressUp: true, any: true); continue }
                return change
            }
            guard n > 0 else { return change }
            var offset = 0
            // Each message: struct nlmsghdr { u32 len; u16 type; u16 flags; u32 seq; u32 pid }.
            while offset + 16 <= n {
                let length = buffer.withUnsafeBytes { Int($0.loadUnaligned(fromByteOffset: offset, as: UInt32.self)) }
                let type = buffer.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: offset + 4, as: UInt16.self) }
                guard length >= 16 else { break }
                change.any = true
                if type == Self.newLink || type == Self.newAddress { change.linkOrAddressUp = true }
                offset += (length + 3) & ~3
            }
        }
    }
}
