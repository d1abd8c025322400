#if canImport(Glibc)
import Glibc
#endif

/// An IPv4 or IPv6 literal (`%zone` allowed on IPv6) and a port, as the socket calls take it.
public struct IPSocketAddress {
    private var storage = sockaddr_storage()
    public let length: socklen_t
    public let family: Int32

    /// nil when `host` is not an address literal.
    public init?(_ host: String, port: UInt16) {
        var literal = host
        var zone: UInt32 = 0
        if let percent = host.firstIndex(of: "%") {
            literal = String(host[..<percent])
            zone = if_nametoindex(String(host[host.index(after: percent)...]))
        }
        if literal.contains(":") {
            var a = sockaddr_in6()
            a.sin6_family = sa_family_t(AF_INET6)
            a.sin6_port = in_port_t(port).bigEndian
            a.sin6_scope_id = zone
            guard inet_pton(AF_INET6, literal, &a.sin6_addr) == 1 else { return nil }
            withUnsafeMutableBytes(of: &storage) { raw in withUnsafeBytes(of: a) { raw.copyMemory(from: $0) } }
            length = socklen_t(MemoryLayout<sockaddr_in6>.size)
            family = AF_INET6
        } else {
            var a = sockaddr_in()
            a.sin_family = sa_family_t(AF_INET)
            a.sin_port = in_port_t(port).bigEndian
            guard inet_pton(AF_INET, literal, &a.sin_addr) == 1 else { return nil }
            withUnsafeMutableBytes(of: &storage) { raw in withUnsafeBytes(of: a) { raw.copyMemory(from: $0) } }
            length = socklen_t(MemoryLayout<sockaddr_in>.size)
            family = AF_INET
        }
    }

    /// `body` with the address as a `sockaddr` and its length.
    public func withSockAddr<T>(_ body: (UnsafePointer<sockaddr>, socklen_t) throws -> T) rethrows -> T {
        try withUnsafePointer(to: storage) {
            try $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { try body($0, length) }
        }
    }
}
