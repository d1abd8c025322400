import LMXCore
import Testing

@Suite("TXT records are parsed leniently")
struct TXTRecordTests {
    @Test("a key without = is a boolean attribute, key= is an empty value")
    func booleanAndEmpty() {
        let txt = TXTRecord(strings: ["flag", "empty=", "k=v"])
        #expect(txt.attribute("flag")?.value == nil)
        #expect(txt.attribute("flag") != nil)
        #expect(txt.attribute("empty")?.value == [])
        #expect(txt["k"] == "v")
        #expect(txt["missing"] == nil)
    }

    @Test("the first occurrence of a key wins, compared case-insensitively")
    func duplicatesFirstWins() {
        let txt = TXTRecord(strings: ["path=/first", "PATH=/second", "path=/third"])
        #expect(txt["path"] == "/first")
        #expect(txt.attributes.count == 1)
    }

    @Test("binary values keep their exact bytes")
    func binaryValues() {
        let txt = TXTRecord(entries: [Array("bin=".utf8) + [0xFF, 0x00, 0x01, 0x3D]])
        #expect(txt.attribute("bin")?.value == [0xFF, 0x00, 0x01, 0x3D])
    }

    @Test("empty entries and entries starting with = are ignored")
    func ignoredEntries() {
        let txt = TXTRecord(entries: [[], Array("=novalue".utf8), Array("a=1".utf8)])
        #expect(txt.attributes.map(\.key) == ["a"])
    }

    @Test("path defaults to /.well-known/opta-lmx when absent, empty or unusable")
    func pathDefault() {
        #expect(TXTRecord().servicePath == "/.well-known/opta-lmx")
        #expect(TXTRecord(strings: ["service=opta-lmx"]).servicePath == "/.well-known/opta-lmx")
        #expect(TXTRecord(strings: ["path="]).servicePath == "/.well-known/opta-lmx")
        #expect(TXTRecord(strings: ["path"]).servicePath == "/.well-known/opta-lmx")
        #expect(TXTRecord(strings: ["path=/a\nb"]).servicePath == "/.well-known/opta-lmx")
        #expect(TXTRecord(entries: [Array("path=/".utf8) + [0xFF]]).servicePath == "/.well-known/opta-lmx")
    }

    @Test("path from TXT is used and always stays a path on the same server")
    func pathUsed() {
        #expect(TXTRecord(strings: ["path=/v1/discovery"]).servicePath == "/v1/discovery")
        #expect(TXTRecord(strings: ["path=custom"]).servicePath == "/custom")
    }

    @Test(
        "a TXT path that leaves the server's tree or names another server falls back to the default",
        arguments: [
            "path=http://elsewhere/x", "path=//elsewhere/x", "path=/v1/../admin/events", "path=..", "path=/a/%2e%2e/b",
            "path=/a%2Fb", "path=/x?admin_key=1", "path=/x#y", "path=/a\\b", "path=/u@evil", "path=/./x",
        ])
    func pathRefused(entry: String) {
        #expect(TXTRecord(strings: [entry]).servicePath == TXTRecord.defaultServicePath)
    }
}

@Suite("Avahi-compatible text forms")
struct DNSSDTextTests {
    // Captured from avahi-browse -rtp 0.8 on the test LAN.
    @Test("labels escape exactly like avahi_escape_label")
    func escapeLabel() {
        #expect(DNSSDText.escapeLabel("Local One") == "Local\\032One")
        #expect(
            DNSSDText.escapeLabel("Mono512.local My \"Box\" ünï\\\\x")
                == "Mono512\\.local\\032My\\032\\034Box\\034\\032\\195\\188n\\195\\175\\\\\\\\x")
        #expect(DNSSDText.escapeLabel("a-b_c09") == "a-b_c09")
    }

    @Test(
        "escaping round-trips any name",
        arguments: [
            "Mono512", "Mono512.local", "with space", "ünïcödé 🚀", "back\\slash", "semi;colon", "tab\there",
            String(repeating: "x", count: 63),
        ])
    func roundTrip(name: String) {
        #expect(DNSSDText.unescapeLabel(DNSSDText.escapeLabel(name)) == name)
    }

    @Test("TXT entries print like avahi_string_list_to_string, in reverse wire order")
    func quoteTXT() {
        let txt = TXTRecord(entries: [
            Array("a=1".utf8), Array("c=he said \"hi\"".utf8), Array("bin=".utf8) + [0xFF, 0x01, 0x7F, 0x7E, 0x09],
            Array("k\\=v".utf8),
        ])
        #expect(DNSSDText.quoteTXT(txt) == #""k\\=v" "bin=\255\001\#u{7F}~\009" "c=he said \"hi\"" "a=1""#)
    }
}
