import CAvahi
import LMXCore
import Testing

@testable import LMXDiscovery

/// The Avahi adapter's conversions, on the real client library's types (the browse itself is
/// tested end to end against real avahi-daemons in IntegrationTests).
@Suite("Avahi adapter conversions")
struct ConversionTests {
    @Test("TXT entries come out byte for byte, binary and empty ones included, in the list's order")
    func txtEntries() {
        var list: UnsafeMutablePointer<AvahiStringList>? = nil
        let entries: [[UInt8]] = [Array("path=/v1".utf8), [0x62, 0x3D, 0x00, 0xFF], []]
        for entry in entries.reversed() {  // avahi_string_list_add prepends
            list = entry.withUnsafeBufferPointer { avahi_string_list_add_arbitrary(list, $0.baseAddress, $0.count) }
        }
        defer { avahi_string_list_free(list) }
        #expect(AvahiSession.entries(list) == entries)
        #expect(AvahiSession.entries(nil).isEmpty)
    }

    @Test("interface indexes become names; unknown ones stay recognisable")
    func interfaceNames() {
        #expect(AvahiSession.interfaceName(1) == "lo")
        #expect(AvahiSession.interfaceName(999_999) == "if999999")
        #expect(AvahiSession.interfaceName(-1) == "if-1")
    }
}
