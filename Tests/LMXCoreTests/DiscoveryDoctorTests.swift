import Testing

@testable import LMXCore

/// The doctor's reasoning, from observations made up here (the checks themselves run on the test
/// LAN in IntegrationTests/DiscoveryDoctorTests).
@Suite("Discovery doctor")
struct DiscoveryDoctorTests {
    static let lan0 = InterfaceCheck(name: "lan0", up: true, multicast: true, ipv4: ["10.0.0.5/24"])

    static func server(
        _ name: String, address: String, port: UInt16 = 1234, interface: String = "lan0", index: Int32 = 2
    )
        -> DiscoveredServer
    {
        let id = ServiceInstanceID(name: name, type: "_opta-lmx._tcp", domain: "local")
        let key = RecordKey(instance: id, interface: NetworkInterface(index: index, name: interface), ipProtocol: .ipv4)
        return DiscoveredServer(
            id: id,
            records: [ResolvedRecord(key: key, hostName: "h.local", address: address, port: port, txt: TXTRecord())])
    }

    static let ready = ProbeReport(verdict: .ready, latency: 0.01)
    static let refused = ProbeReport(verdict: .down, latency: 0.01, detail: "connection refused")
    static let timedOut = ProbeReport(verdict: .down, latency: 1.5, detail: "timed out")

    static func host(_ hostPort: String, interface: String = "lan0", onLink: Bool = true, probe: ProbeReport)
        -> HostCheck
    {
        HostCheck(
            hostPort: hostPort, address: String(hostPort.split(separator: ":")[0]), interface: interface,
            onLink: onLink,
            probe: probe)
    }

    func causes(_ report: DoctorReport) -> [DoctorCause] { report.findings.map(\.cause) }

    @Test("an announced server that answers is usable: exit 0, no finding, found by mDNS on its interface")
    func usable() {
        let report = DiscoveryDoctor.diagnose(
            DoctorObservations(
                interfaces: [Self.lan0], sightings: [Self.server("Studio", address: "10.0.0.9")],
                direct: ["lan0": .success([DirectAnswerSummary(responder: "10.0.0.9", instances: ["Studio"])])],
                probes: ["10.0.0.9:1234": Self.ready]))
        #expect(report.findings.isEmpty)
        #expect(report.usable.map(\.foundBy) == ["mDNS on lan0"])
        #expect(report.exitStatus == .success)
    }

    @Test("avahi-daemon unreachable: its finding names servers that answer the direct question; exit 69")
    func daemonNotRunning() {
        let report = DiscoveryDoctor.diagnose(
            DoctorObservations(
                daemonProblem: "Daemon not running", interfaces: [Self.lan0],
                direct: ["lan0": .success([DirectAnswerSummary(responder: "10.0.0.9", instances: ["Studio"])])]))
        #expect(causes(report) == [.daemonNotRunning])
        #expect(report.findings[0].says.contains("Studio"))
        #expect(report.exitStatus == .unavailable)
    }

    @Test("heard by a direct question but not by avahi-daemon: UDP 5353 blocked here")
    func blockedHere() {
        let report = DiscoveryDoctor.diagnose(
            DoctorObservations(
                interfaces: [Self.lan0],
                direct: ["lan0": .success([DirectAnswerSummary(responder: "10.0.0.9", instances: ["Studio"])])],
                hosts: [Self.host("10.0.0.9:1234", probe: Self.ready)]))
        #expect(causes(report) == [.mdnsBlockedHere])
        #expect(report.findings[0].interface == "lan0")
        #expect(report.exitStatus == .success)  // usable at the address given
    }

    @Test("a named host on the subnet: answering means multicast filtered, silent means isolation, refused is named")
    func namedHostsOnTheLink() {
        func diagnose(_ probe: ProbeReport) -> DoctorReport {
            DiscoveryDoctor.diagnose(
                DoctorObservations(
                    interfaces: [Self.lan0], direct: ["lan0": .success([])],
                    hosts: [Self.host("10.0.0.9:1234", probe: probe)]))
        }
        #expect(causes(diagnose(Self.ready)) == [.announcementsFiltered])
        #expect(causes(diagnose(Self.timedOut)) == [.clientIsolation])
        #expect(diagnose(Self.timedOut).exitStatus == .causeFound)
        #expect(causes(diagnose(Self.refused)) == [.portRefused])
    }

    @Test("a named host behind a router: other subnet without a domain, not listed with one, nothing when DNS lists it")
    func otherSubnet() {
        let far = Self.host("10.9.0.2:1234", onLink: false, probe: Self.ready)
        let bare = DiscoveryDoctor.diagnose(DoctorObservations(interfaces: [Self.lan0], hosts: [far]))
        #expect(causes(bare) == [.otherSubnet])
        let domain = DomainCheck(
            domain: "lmx.example.com", source: "configured", instances: [], failure: "no such name")
        let missing = DiscoveryDoctor.diagnose(
            DoctorObservations(interfaces: [Self.lan0], domains: [domain], hosts: [far]))
        #expect(causes(missing) == [.notInBrowseDomain])
        let id = ServiceInstanceID(name: "Far", type: "_opta-lmx._tcp", domain: "lmx.example.com")
        let record = ResolvedRecord(
            key: RecordKey(instance: id, interface: .unicastDNS, ipProtocol: .ipv4), hostName: "far.lmx.example.com",
            address: "10.9.0.2", port: 1234, txt: TXTRecord())
        let listed = DiscoveryDoctor.diagnose(
            DoctorObservations(
                interfaces: [Self.lan0], sightings: [DiscoveredServer(id: id, records: [record])], domains: [domain],
                hosts: [far], probes: ["10.9.0.2:1234": Self.ready]))
        #expect(listed.findings.isEmpty)
        #expect(listed.usable.first?.foundBy == "DNS domain lmx.example.com")
    }

    @Test("a server announced on an interface the configuration leaves out is named with the interface")
    func excludedInterface() {
        let docker = InterfaceCheck(name: "docker0", up: true, multicast: true, ipv4: ["172.17.0.1/16"])
        let report = DiscoveryDoctor.diagnose(
            DoctorObservations(
                interfaces: [Self.lan0, docker],
                sightings: [Self.server("Box", address: "172.17.0.2", interface: "docker0", index: 5)],
                direct: ["lan0": .success([])]))
        #expect(causes(report) == [.interfaceExcluded])
        #expect(report.findings[0].interface == "docker0")
        #expect(report.findings[0].says.contains("left out by default"))
    }

    @Test("announced ports: refused and filtered are told apart")
    func announcedPorts() {
        let report = DiscoveryDoctor.diagnose(
            DoctorObservations(
                interfaces: [Self.lan0],
                sightings: [
                    Self.server("Off", address: "10.0.0.9", port: 1),
                    Self.server("Walled", address: "10.0.0.9", port: 2),
                ],
                direct: ["lan0": .success([])],
                probes: ["10.0.0.9:1": Self.refused, "10.0.0.9:2": Self.timedOut]))
        #expect(Set(causes(report)) == [.portRefused, .portFiltered])
        #expect(report.exitStatus == .causeFound)
    }

    @Test("nothing anywhere: one finding saying so, exit 1; the text report leads with the findings")
    func nothing() {
        let report = DiscoveryDoctor.diagnose(
            DoctorObservations(interfaces: [Self.lan0], direct: ["lan0": .success([])]))
        #expect(causes(report) == [.nothingAnnounced])
        #expect(report.exitStatus == .nothingFound)
        #expect(report.text.hasPrefix("No usable Opta LMX server found."))
        #expect(report.text.contains("Next: "))
        #expect(report.text.contains("lan0: up; 10.0.0.5/24; multicast on"))
    }

    @Test("browse_domains: DNS names, a trailing dot dropped; anything else is an error naming the key")
    func browseDomainsConfiguration() throws {
        let parsed = try AgentConfiguration.parse(
            Array(#"{"browse_domains": ["lmx.example.com."], "browse_announced_domains": false}"#.utf8), file: "a.json")
        #expect(parsed.browseDomains == ["lmx.example.com"])
        #expect(parsed.browseAnnouncedDomains == false)
        #expect(AgentConfiguration().browseAnnouncedDomains)
        #expect(throws: ConfigurationError.self) {
            try AgentConfiguration.parse(Array(#"{"browse_domains": ["not a domain"]}"#.utf8), file: "a.json")
        }
        do {
            _ = try AgentConfiguration.parse(Array(#"{"browse_domains": ["x y"]}"#.utf8), file: "a.json")
        } catch {
            #expect(error.description.contains("browse_domains"))
        }
    }
}
