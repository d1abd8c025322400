import Foundation
import LMXCore
import Testing

/// `lmx-discover --doctor` and `--host` on the real test LAN, each scripted failure made for real:
/// avahi-daemon absent, UDP 5353 dropped by nftables on the client, multicast dropped by a
/// bridge-family rule between hosts, client isolation on the bridge, a server on another routed
/// subnet (with and without a DNS-SD browse domain), an interface left out by configuration, and
/// announced ports refused or filtered. The client is h4 (its own avahi-daemon on lan0); every
/// change to the LAN is undone before the test ends, also when it fails.
@Suite("discovery doctor on the real test LAN", .serialized)
struct DiscoveryDoctorTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    struct Report: Decodable {
        struct Usable: Decodable {
            var name: String
            var url: String
            var found_by: String
        }
        struct Finding: Decodable {
            var cause: String
            var interface: String?
            var server: String?
            var says: String
            var next: String
        }
        var usable: [Usable]
        var findings: [Finding]
        var checked: [String]
        var exit_status: Int32

        func finding(_ cause: String) -> Finding? { findings.first { $0.cause == cause } }
    }

    /// Runs `lmx-discover ARGS` in h4, with h4's avahi-daemon (or `bus`) and no search domains
    /// unless `searchDomains` names some.
    func discoverInH4(_ arguments: [String], bus: String? = nil, searchDomains: String = "") async throws
        -> CommandResult
    {
        try await Command.run(
            "/usr/sbin/ip", ["netns", "exec", bed["LMX_TESTBED_H4_NS"], "\(TestBed.binDir)/lmx-discover"] + arguments,
            environment: ["DBUS_SYSTEM_BUS_ADDRESS": bus ?? bed.bus(.h4), "LOCALDOMAIN": searchDomains], timeout: 30)
    }

    func doctor(_ arguments: [String], bus: String? = nil, searchDomains: String = "") async throws -> (
        CommandResult, Report
    ) {
        let result = try await discoverInH4(
            ["--doctor", "--json", "--timeout", "2"] + arguments, bus: bus, searchDomains: searchDomains)
        do {
            return (result, try JSONDecoder().decode(Report.self, from: Data(result.stdout.utf8)))
        } catch {
            Issue.record("lmx-discover --doctor printed no report (status \(result.status)): \(result.stderr)")
            throw error
        }
    }

    /// Runs a shell command as root and fails the test on error.
    @discardableResult
    func sh(_ command: String) async throws -> CommandResult {
        let result = try await Command.run("/bin/sh", ["-c", command], timeout: 20)
        #expect(result.status == 0, "\(command): \(result.stderr)")
        return result
    }

    static func port() -> Int { Int.random(in: 20000...29999) }

    // MARK: Scripted failures

    @Test("avahi-daemon not running: named, exit 69, and servers that answer the link directly are mentioned")
    func avahiNotRunning() async throws {
        let tag = TestBed.tag()
        let published = try await Publish.avahi(bed, on: .h1, name: "Doctor \(tag)", port: Self.port())
        defer { published.signal(SIGTERM) }
        let (result, report) = try await doctor(["-i", "lan0"], bus: bed.noAvahiBus)
        #expect(result.status == 69)
        let finding = try #require(report.finding("daemon-not-running"))
        #expect(finding.says.contains("avahi-daemon is not running"))
        #expect(finding.says.contains("Doctor \(tag)"))
        #expect(finding.next.contains("systemctl enable --now avahi-daemon"))
        let text = try await discoverInH4(["--doctor", "-i", "lan0", "--timeout", "2"], bus: bed.noAvahiBus)
        #expect(text.status == 69)
        #expect(text.stdout.contains("daemon-not-running"))
        #expect(text.stdout.contains("Next: start it"))
    }

    @Test("UDP 5353 dropped by nftables on this machine: the server answers a direct question, avahi hears nothing")
    func mdnsDroppedHere() async throws {
        let ns = bed["LMX_TESTBED_H4_NS"]
        try await sh(
            "ip netns exec \(ns) nft -f - <<'EOF'\ntable inet lmxdoctor {\n chain input {\n  type filter hook input priority 0;\n  udp dport 5353 drop\n }\n}\nEOF"
        )
        defer { _ = try? Command.runBlocking("ip netns exec \(ns) nft delete table inet lmxdoctor") }
        let tag = TestBed.tag()
        let port = Self.port()
        let server = try await LMXServer.start(bed, on: .h1, port: port)
        defer { Task { await server.stop() } }
        let published = try await Publish.avahi(bed, on: .h1, name: "Dropped \(tag)", port: port)
        defer { published.signal(SIGTERM) }
        let (result, report) = try await doctor(["-i", "lan0"])
        #expect(result.status == 2)
        let finding = try #require(report.finding("mdns-blocked-here"), "\(report.findings)")
        #expect(finding.interface == "lan0")
        #expect(finding.server?.contains("Dropped \(tag)") == true)
        #expect(finding.says.contains("UDP port 5353"))
        #expect(finding.next.contains("udp dport 5353 accept"))
    }

    @Test("announcements filtered on the way (bridge-family rule) while the server answers HTTP")
    func announcementsFilteredOnTheWay() async throws {
        try await sh(
            "nft -f - <<'EOF'\ntable bridge lmxdoctor {\n chain forwarding {\n  type filter hook forward priority 0;\n  udp dport 5353 drop\n }\n}\nEOF"
        )
        defer { _ = try? Command.runBlocking("nft delete table bridge lmxdoctor") }
        let tag = TestBed.tag()
        let port = Self.port()
        let server = try await LMXServer.start(bed, on: .h1, port: port)
        defer { Task { await server.stop() } }
        let published = try await Publish.avahi(bed, on: .h1, name: "Filtered \(tag)", port: port)
        defer { published.signal(SIGTERM) }
        let host = "\(bed.address(.h1)):\(port)"
        let (result, report) = try await doctor(["-i", "lan0", "--host", host])
        #expect(result.status == 0)  // usable at the address given
        let finding = try #require(report.finding("announcements-filtered"), "\(report.findings)")
        #expect(finding.server == host)
        #expect(finding.interface == "lan0")
        #expect(finding.says.contains("answers HTTP"))
        #expect(report.finding("client-isolation") == nil)
        #expect(report.finding("mdns-blocked-here") == nil)
    }

    @Test("Wi-Fi client isolation (bridge ports isolated): the server's address is unreachable too")
    func clientIsolation() async throws {
        try await sh("bridge link set dev lmxv1 isolated on && bridge link set dev lmxv4 isolated on")
        defer {
            _ = try? Command.runBlocking(
                "bridge link set dev lmxv1 isolated off; bridge link set dev lmxv4 isolated off")
        }
        let port = Self.port()
        let server = try await LMXServer.start(bed, on: .h1, port: port)
        defer { Task { await server.stop() } }
        let published = try await Publish.avahi(bed, on: .h1, name: "Isolated \(TestBed.tag())", port: port)
        defer { published.signal(SIGTERM) }
        let host = "\(bed.address(.h1)):\(port)"
        let (result, report) = try await doctor(["-i", "lan0", "--host", host])
        #expect(result.status == 2)
        let finding = try #require(report.finding("client-isolation"), "\(report.findings)")
        #expect(finding.server == host)
        #expect(finding.says.contains("client isolation"))
        #expect(report.finding("announcements-filtered") == nil)
    }

    @Test("an interface left out by configuration: the server announced there is named with the interface")
    func interfaceExcluded() async throws {
        let tag = TestBed.tag()
        let published = try await Publish.avahi(bed, on: .h1, name: "Excluded \(tag)", port: Self.port())
        defer { published.signal(SIGTERM) }
        let (result, report) = try await doctor(["--exclude-interface", "lan0"])
        #expect(result.status == 2)
        let finding = try #require(
            report.findings.first { $0.cause == "interface-excluded" && $0.server?.contains(tag) == true },
            "\(report.findings)")
        #expect(finding.interface == "lan0")
        #expect(finding.next.contains("--interface lan0"))
    }

    @Test("servers announced whose port is refused, or filtered by the server's firewall")
    func announcedPortRefusedOrFiltered() async throws {
        let ns = bed["LMX_TESTBED_H1_NS"]
        let tag = TestBed.tag()
        let refusedPort = Self.port()
        let filteredPort = refusedPort + 1
        let server = try await LMXServer.start(bed, on: .h1, port: filteredPort)
        defer { Task { await server.stop() } }
        try await sh(
            "ip netns exec \(ns) nft -f - <<'EOF'\ntable inet lmxdoctor {\n chain input {\n  type filter hook input priority 0;\n  tcp dport \(filteredPort) drop\n }\n}\nEOF"
        )
        defer { _ = try? Command.runBlocking("ip netns exec \(ns) nft delete table inet lmxdoctor") }
        let refused = try await Publish.avahi(bed, on: .h1, name: "Refused \(tag)", port: refusedPort)
        defer { refused.signal(SIGTERM) }
        let filtered = try await Publish.avahi(bed, on: .h1, name: "Filtered port \(tag)", port: filteredPort)
        defer { filtered.signal(SIGTERM) }
        let (result, report) = try await doctor(["-i", "lan0"])
        let refusal = try #require(
            report.findings.first { $0.cause == "port-refused" && $0.server == "Refused \(tag)" }, "\(report.findings)")
        #expect(refusal.says.contains("\(bed.address(.h1)):\(refusedPort)"))
        let filter = try #require(
            report.findings.first { $0.cause == "port-filtered" && $0.server == "Filtered port \(tag)" },
            "\(report.findings)")
        #expect(filter.next.contains("\(filteredPort)/tcp"))
        #expect(!report.usable.contains { $0.name.contains(tag) })
        #expect(result.status == 2 || !report.usable.isEmpty)
    }

    // MARK: Another subnet

    @Test("a server on another routed subnet: named without a browse domain, found through one with it")
    func otherSubnet() async throws {
        let site = try await Site.up(bed)
        defer { site.down() }
        let port = Self.port()
        let server = try await site.server(port: port)
        defer { Task { await server.stop() } }
        let host = "\(Site.serverAddress):\(port)"
        let dns = try await site.dns(records: [.init(name: "Far \(TestBed.tag())", port: port)])
        defer { Task { await dns.stop() } }

        // No browse domain (none configured, no search domain): named as a subnet problem.
        let (plain, bare) = try await doctor(["-i", "lan0", "--host", host])
        #expect(plain.status == 0)  // it answers at the address given
        let finding = try #require(bare.finding("other-subnet"), "\(bare.findings)")
        #expect(finding.says.contains("another subnet"))
        #expect(finding.next.contains("browse_domains"))

        // A browse domain that does not list it.
        let (_, missing) = try await doctor(["-i", "lan0", "--host", host, "-d", "empty.site.test"])
        #expect(missing.finding("not-in-browse-domain") != nil, "\(missing.findings)")
        #expect(missing.finding("other-subnet") == nil)

        // The site's zone lists it, and the network announces the browse domain: found there.
        let (found, report) = try await doctor(["-i", "lan0", "--host", host], searchDomains: "site.test")
        #expect(found.status == 0)
        #expect(report.usable.contains { $0.found_by == "DNS domain \(Site.domain)" }, "\(report.usable)")
        #expect(report.finding("other-subnet") == nil)
        #expect(report.finding("not-in-browse-domain") == nil)
    }

    // MARK: First contact without multicast

    @Test("--host asks one address by the contract and shows what the server says; lmx-pair --host pairs it")
    func hostFirstContact() async throws {
        let port = Self.port()
        let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "Contact:\(port)")
        defer { Task { await server.stop() } }
        let host = "\(bed.address(.h1)):\(port)"
        let text = try await Command.discover(["--host", host])
        #expect(text.status == 0, "\(text.stderr)")
        #expect(text.stdout.contains("http://\(host): an Opta LMX server, ready"))
        #expect(text.stdout.contains("instance_id  Contact:\(port)"))
        #expect(text.stdout.contains("lmx-pair --host \(host)"))
        let json = try await Command.discover(["--host", host, "--json"])
        let answers = try JSONDecoder().decode([HostAnswer].self, from: Data(json.stdout.utf8))
        #expect(answers.first?.instanceID == "Contact:\(port)")
        #expect(answers.first?.verdict == .ready)

        let nothing = try await Command.discover(["--host", "\(bed.address(.h1)):\(port + 1)"])
        #expect(nothing.status == 1)
        #expect(nothing.stdout.contains("no Opta LMX server"))

        let dir = AgentProcess.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let pair = try await Command.run(
            "\(TestBed.binDir)/lmx-pair",
            ["--host", host, "--db", dir + "/agent.db", "--socket", dir + "/agent.sock"])
        #expect(pair.status == 0, "\(pair.stderr)")
        #expect(pair.stdout.contains("Contact:\(port)"))
        let list = try await Command.run(
            "\(TestBed.binDir)/lmx-pair",
            ["list", "--json", "--db", dir + "/agent.db", "--socket", dir + "/agent.sock"])
        #expect(list.stdout.contains(host), "\(list.stdout)")
        let refused = try await Command.run(
            "\(TestBed.binDir)/lmx-pair",
            ["--host", "\(bed.address(.h1)):\(port + 1)", "--db", dir + "/agent.db", "--socket", dir + "/agent.sock"])
        #expect(refused.status == 65)
        #expect(refused.stderr.contains("no Opta LMX server answers there"))
    }
}

extension Command {
    /// Runs a shell command to completion from synchronous code (cleanups in `defer`).
    @discardableResult
    static func runBlocking(_ command: String) throws -> Int32 {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", command]
        try process.run()
        process.waitUntilExit()
        return process.terminationStatus
    }
}

/// The routed second subnet of `testbed.sh site` and the site's DNS server (dnsmasq in the
/// router's namespace, listening on its LAN address only).
struct Site: Sendable {
    static let serverAddress = "10.252.0.2"
    static let dnsAddress = "10.254.0.2"
    static let domain = "lmx.site.test"

    struct Record: Sendable {
        var name: String
        var port: Int
        var target = "far.lmx.site.test"
    }

    static func up(_ bed: TestBed) async throws -> Site {
        let result = try await Command.run("\(TestBed.repo)/scripts/testbed.sh", ["site", "up"], timeout: 30)
        guard result.status == 0 else { throw TestBedMissing(detail: "testbed.sh site up failed: \(result.stderr)") }
        return Site()
    }

    func down() { _ = try? Command.runBlocking("'\(TestBed.repo)/scripts/testbed.sh' site down") }

    /// A test server on the other subnet.
    func server(port: Int, instance: String? = nil) async throws -> LiveProcess {
        var arguments = [
            "netns", "exec", "lmxs1", "/usr/bin/python3", "\(TestBed.repo)/scripts/fixtures/lmx-test-server.py",
            "--bind", Self.serverAddress, "--port", String(port), "--mode", "ready",
        ]
        if let instance { arguments += ["--instance", instance] }
        let process = LiveProcess("/usr/sbin/ip", arguments)
        try await process.start()
        guard await process.waitForLine(containing: "listening", timeout: 10) else {
            await process.stop()
            throw TestBedMissing(detail: "test server in lmxs1 did not start: \(process.stderr)")
        }
        return process
    }

    /// dnsmasq serving the site's zone: `b._dns-sd._udp.site.test` names the browse domain
    /// `lmx.site.test` (RFC 6763 §11), which lists `records` (PTR, SRV, TXT) and the host's address.
    func dns(records: [Record], ttl: Int = 1) async throws -> LiveProcess {
        var arguments = [
            "netns", "exec", "lmxrt", "/usr/sbin/dnsmasq", "-k", "--no-resolv", "--no-hosts", "--bind-interfaces",
            "--listen-address=\(Self.dnsAddress)", "--port=53", "--user=root", "--group=root", "--local-ttl=\(ttl)",
            "--log-facility=-", "--local=/site.test/", "--ptr-record=b._dns-sd._udp.site.test,\(Self.domain)",
            "--host-record=far.\(Self.domain),\(Self.serverAddress)",
        ]
        for record in records {
            let instance = "\(record.name)._opta-lmx._tcp.\(Self.domain)"
            arguments += [
                "--ptr-record=_opta-lmx._tcp.\(Self.domain),\(instance)",
                "--srv-host=\(instance),\(record.target),\(record.port)",
                "--txt-record=\(instance),path=/.well-known/opta-lmx,service=opta-lmx",
            ]
        }
        let process = LiveProcess("/usr/sbin/ip", arguments)
        try await process.start()
        // Ready once it says it started (its socket is bound by then) and answers from h4.
        if await process.waitForLine(containing: "started, version", timeout: 10) {
            for _ in 0..<20 {
                let probe = try await Command.run(
                    "/usr/sbin/ip", ["netns", "exec", "lmxh4", "getent", "hosts", "far.\(Self.domain)"], timeout: 15)
                if probe.status == 0 { return process }
                try await Task.sleep(for: .milliseconds(100))
            }
        }
        await process.stop()
        throw TestBedMissing(detail: "dnsmasq in lmxrt did not answer: \(process.stderr)")
    }
}
