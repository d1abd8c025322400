import LMXCore
import Testing

@testable import LMXDiscovery

/// DNS messages as libresolv's parser reads them for DNS-SD (the queries themselves go to a real
/// dnsmasq on the test LAN in IntegrationTests/WideAreaTests).
@Suite("Unicast DNS messages")
struct UnicastDNSTests {
    /// A name in wire form.
    static func name(_ labels: [String]) -> [UInt8] {
        labels.flatMap { [UInt8($0.utf8.count)] + Array($0.utf8) } + [0]
    }

    static func record(owner: [UInt8], type: UInt16, ttl: UInt32 = 120, data: [UInt8]) -> [UInt8] {
        owner + [UInt8(type >> 8), UInt8(type & 0xff), 0, 1]
            + [UInt8(ttl >> 24), UInt8((ttl >> 16) & 0xff), UInt8((ttl >> 8) & 0xff), UInt8(ttl & 0xff)]
            + [UInt8(data.count >> 8), UInt8(data.count & 0xff)] + data
    }

    /// A response to `_opta-lmx._tcp.lmx.test PTR`: the PTR (its target compressed against the
    /// question), the SRV (owner and target compressed), the TXT and the host's A record.
    static func response() -> [UInt8] {
        var message: [UInt8] = [0x12, 0x34, 0x84, 0x00, 0, 1, 0, 2, 0, 0, 0, 2]
        message += name(["_opta-lmx", "_tcp", "lmx", "test"]) + [0, 12, 0, 1]
        let instance = [UInt8(10)] + Array("Far Studio".utf8) + [0xC0, 12]  // "Far Studio" + pointer to the question
        message += record(owner: [0xC0, 12], type: 12, data: instance)
        let instanceOffset = UInt8(message.count - instance.count)
        let target = name(["far", "lmx", "test"])
        message += record(owner: [0xC0, instanceOffset], type: 33, ttl: 30, data: [0, 0, 0, 0, 0x04, 0xD2] + target)
        message += record(
            owner: [0xC0, instanceOffset], type: 16, data: [5] + Array("path=".utf8) + [0] + [3] + Array("a=b".utf8))
        message += record(owner: name(["far", "lmx", "test"]), type: 1, data: [10, 252, 0, 2])
        return message
    }

    @Test(
        "browse domains the network announces: each once, in the order found, at most maxAnnouncedDomains (a DNS server listing hundreds does not have each browsed every refresh)"
    )
    func announcedDomainsBounded() {
        let many = (0..<500).map { "d\($0).site.test" }
        let domains = WideAreaBrowser.announced([nil, ["A.site.test", "a.site.test", ""], many])
        #expect(domains?.count == WideAreaBrowser.maxAnnouncedDomains)
        #expect(domains?.prefix(2) == ["A.site.test", "d0.site.test"])
        #expect(WideAreaBrowser.announced([nil, nil]) == nil, "no answer at all: nothing known")
        #expect(WideAreaBrowser.announced([[]]) == [])
    }

    @Test("PTR, SRV, TXT and A come out with exact labels, port, entries and address; compression followed")
    func parsesDNSSDRecords() throws {
        let records = UnicastDNS.parse(Self.response())
        #expect(records.count == 4)
        guard case .pointer(let instance) = records[0].data else { throw Failure("no PTR") }
        #expect(records[0].owner == "_opta-lmx._tcp.lmx.test")
        #expect(instance.firstLabel == "Far Studio")
        #expect(instance.parentText == "_opta-lmx._tcp.lmx.test")
        #expect(instance.text == "Far\\032Studio._opta-lmx._tcp.lmx.test")
        guard case .service(_, _, let port, let target) = records[1].data else { throw Failure("no SRV") }
        #expect(records[1].owner == instance.text.lowercased())
        #expect(records[1].ttl == 30)
        #expect(port == 1234)
        #expect(target.plainText == "far.lmx.test")
        guard case .text(let entries) = records[2].data else { throw Failure("no TXT") }
        #expect(entries == [Array("path=".utf8), [], Array("a=b".utf8)])
        #expect(records[3].data == .address("10.252.0.2"))
        #expect(DNSName.firstLabel(ofText: instance.text.lowercased()) == "far studio")
    }

    @Test("truncated and mutated messages never trap; what cannot be read is left out")
    func hostileMessages() {
        let message = Self.response()
        for length in 0..<message.count { _ = UnicastDNS.parse(Array(message.prefix(length))) }
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<2000 {
            var mutated = message
            for _ in 0..<3 { mutated[Int.random(in: 0..<mutated.count, using: &generator)] = .random(in: 0...255) }
            _ = UnicastDNS.parse(mutated)
        }
        // A pointer loop in a name.
        var loop = Self.response()
        loop[loop.count - 20] = 0xC0
        _ = UnicastDNS.parse(loop)
    }

    @Test("the direct mDNS question is one PTR question for TYPE.local from an ordinary port")
    func directQuestion() {
        let question = DirectQuery.question("_opta-lmx._tcp")
        #expect(Array(question[4..<6]) == [0, 1])  // one question
        #expect(Array(question[12...]) == Self.name(["_opta-lmx", "_tcp", "local"]) + [0, 12, 0, 1])
        let parsed = UnicastDNS.parse(question)
        #expect(parsed.isEmpty)  // a question has no records
    }

    struct Failure: Error {
        let text: String
        init(_ text: String) { self.text = text }
    }
}
