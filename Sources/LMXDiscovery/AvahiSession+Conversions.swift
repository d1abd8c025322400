import CAvahi
import LMXCore

#if canImport(Glibc)
import Glibc
#endif
#if canImport(Dispatch)
import Dispatch
#endif

// Conversions between the Avahi client library's C types and the core's.
extension AvahiSession {
    /// The client library hands TXT over in wire order.
    static func entries(_ list: UnsafeMutablePointer<AvahiStringList>?) -> [[UInt8]] {
        var result: [[UInt8]] = []
        var node = list
        while let current = node {
            let size = avahi_string_list_get_size(current)
            if let text = avahi_string_list_get_text(current) {
                result.append(Array(UnsafeBufferPointer(start: text, count: size)))
            } else {
                result.append([])
            }
            node = avahi_string_list_get_next(current)
        }
        return result
    }

    func recordKey(
        _ interface: AvahiIfIndex, _ proto: AvahiProtocol,
        _ name: UnsafePointer<CChar>?, _ type: UnsafePointer<CChar>?, _ domain: UnsafePointer<CChar>?
    ) -> RecordKey? {
        guard let name, let type, let domain else { return nil }
        let ipProtocol: IPProtocol = proto == AvahiProtocol(AVAHI_PROTO_INET6) ? .ipv6 : .ipv4
        let instance = ServiceInstanceID(
            name: String(cString: name), type: String(cString: type), domain: String(cString: domain))
        return RecordKey(
            instance: instance, interface: NetworkInterface(index: interface, name: Self.interfaceName(interface)),
            ipProtocol: ipProtocol)
    }

    static func interfaceName(_ index: AvahiIfIndex) -> String {
        var buffer = [CChar](repeating: 0, count: Int(IF_NAMESIZE) + 1)
        guard index > 0, if_indextoname(UInt32(index), &buffer) != nil else { return "if\(index)" }
        return string(buffer)
    }

    static func string(_ buffer: [CChar]) -> String {
        String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    func avahiProtocol(_ ipProtocol: IPProtocol?) -> AvahiProtocol {
        switch ipProtocol {
        case .ipv4: AvahiProtocol(AVAHI_PROTO_INET)
        case .ipv6: AvahiProtocol(AVAHI_PROTO_INET6)
        case nil: AvahiProtocol(AVAHI_PROTO_UNSPEC)
        }
    }
}
