#if canImport(Glibc)
import Glibc
#endif

/// How this machine reaches an address right now, as the kernel's routing table says: the
/// interface and local address a connection would leave from, whether the address is on that
/// interface's own subnet (no router in between), and whether the interface has a carrier.
public struct LocalPath: Sendable, Hashable, CustomStringConvertible {
    public var interface: String
    public var source: String
    public var onLink: Bool
    public var running: Bool

    public init(interface: String, source: String, onLink: Bool, running: Bool) {
        self.interface = interface
        self.source = source
        self.onLink = onLink
        self.running = running
    }

    public var description: String {
        "\(onLink ? "on-link on" : "routed via") \(interface) from \(source)\(running ? "" : " (no carrier)")"
    }
}

/// Route lookups without sending a packet: connecting a UDP socket makes the kernel choose a
/// route and a source address, which `getsockname` then tells.
public enum RouteLookup {
    /// The interfaces and their addresses, read once for a batch of lookups.
    public struct Interfaces: Sendable {
        struct Entry: Sendable {
            var name: String
            var flags: UInt32
            var address: [UInt8]
            var mask: [UInt8]
        }
        var entries: [Entry] = []

        /// No interfaces.
        public init() {}

        /// Every interface once, in the order listed, with its state and IPv4 addresses
        /// (`10.0.0.5/24`).
        public var links: [(name: String, up: Bool, multicast: Bool, loopback: Bool, ipv4: [String])] {
            var order: [String] = []
            var byName: [String: (up: Bool, multicast: Bool, loopback: Bool, ipv4: [String])] = [:]
            for entry in entries {
                if byName[entry.name] == nil {
                    order.append(entry.name)
                    byName[entry.name] = (
                        entry.flags & UInt32(IFF_UP) != 0 && entry.flags & UInt32(IFF_RUNNING) != 0,
                        entry.flags & UInt32(IFF_MULTICAST) != 0, entry.flags & UInt32(IFF_LOOPBACK) != 0, []
                    )
                }
                if entry.address.count == 4 {
                    let prefix = entry.mask.reduce(0) { $0 + $1.nonzeroBitCount }
                    byName[entry.name]?.ipv4.append("\(text(entry.address))/\(prefix)")
                }
            }
            return order.compactMap { name in byName[name].map { (name, $0.up, $0.multicast, $0.loopback, $0.ipv4) } }
        }

        /// The addresses of interfaces that are up with a carrier (loopback aside): when this is
        /// unchanged, so is every way out of this machine that does not depend on routes alone.
        public var usable: Set<String> {
            Set(
                entries.filter { $0.flags & UInt32(IFF_RUNNING) != 0 && $0.flags & UInt32(IFF_LOOPBACK) == 0 }
                    .map { "\($0.name) \(text($0.address))/\(text($0.mask))" })
        }
    }

    /// Reads every interface address (`getifaddrs`).
    public static func interfaces() -> Interfaces {
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0, let first = list else { return Interfaces() }
        defer { freeifaddrs(list) }
        var result = Interfaces()
        var cursor: UnsafeMutablePointer<ifaddrs>? = first
        while let item = cursor {
            defer { cursor = item.pointee.ifa_next }
            guard let address = item.pointee.ifa_addr, let name = item.pointee.ifa_name,
                let bytes = rawAddress(address)
            else { continue }
            let maskPointer: UnsafeMutablePointer<sockaddr>? = item.pointee.ifa_netmask
            let mask = maskPointer.flatMap { rawAddress($0) } ?? [UInt8](repeating: 0xff, count: bytes.count)
            result.entries.append(
                .init(name: String(cString: name), flags: item.pointee.ifa_flags, address: bytes, mask: mask))
        }
        return result
    }

    /// The path a connection to `host` (an IPv4 or IPv6 literal, `%zone` allowed) would take now.
    /// - Returns: `nil` with the kernel's reason when there is no route at all.
    public static func path(to host: String, in interfaces: Interfaces) -> Result<LocalPath, SystemError> {
        guard let address = IPSocketAddress(host, port: 9) else {
            return .failure(SystemError("not an address: \(host)", code: EINVAL))
        }
        let fd = socket(address.family, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return .failure(SystemError("socket")) }
        defer { close(fd) }
        let connected = address.withSockAddr { connect(fd, $0, $1) }
        guard connected == 0 else { return .failure(SystemError("no route to \(host)")) }
        var local = sockaddr_storage()
        var localLength = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let named = withUnsafeMutablePointer(to: &local) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &localLength) }
        }
        guard named == 0,
            let source = withUnsafePointer(
                to: &local, { $0.withMemoryRebound(to: sockaddr.self, capacity: 1, rawAddress) }),
            let destination = address.withSockAddr({ pointer, _ in rawAddress(pointer) })
        else { return .failure(SystemError("no source address for \(host)")) }
        let sourceText = text(source)
        guard let entry = interfaces.entries.first(where: { $0.address == source }) else {
            return .success(LocalPath(interface: "?", source: sourceText, onLink: false, running: true))
        }
        let onLink = zip(zip(destination, source), entry.mask).allSatisfy { pair, mask in pair.0 & mask == pair.1 & mask
        }
        let running = entry.flags & UInt32(IFF_UP) != 0 && entry.flags & UInt32(IFF_RUNNING) != 0
        return .success(LocalPath(interface: entry.name, source: sourceText, onLink: onLink, running: running))
    }

    /// The address bytes of an IPv4 or IPv6 socket address.
    private static func rawAddress(_ address: UnsafePointer<sockaddr>) -> [UInt8]? {
        switch Int32(address.pointee.sa_family) {
        case AF_INET:
            return address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
                withUnsafeBytes(of: $0.pointee.sin_addr) { Array($0) }
            }
        case AF_INET6:
            return address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) {
                withUnsafeBytes(of: $0.pointee.sin6_addr) { Array($0) }
            }
        default:
            return nil
        }
    }

    private static func text(_ bytes: [UInt8]) -> String {
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        let family = bytes.count == 4 ? AF_INET : AF_INET6
        _ = bytes.withUnsafeBytes { inet_ntop(family, $0.baseAddress, &buffer, socklen_t(buffer.count)) }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
