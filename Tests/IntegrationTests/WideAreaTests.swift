import Foundation
import LMXCore
import Testing

/// Wide-area DNS-SD on the test LAN: a server on another routed subnet (no multicast between
/// them), listed in the site's DNS (dnsmasq in the router's namespace), found by the agent in h4
/// and by `lmx-discover -d`, followed when its record changes or goes; and the agent's own
/// discovery checks in `/v1/status` and `lmx-status` when nothing is usable.
@Suite("wide-area discovery on the real test LAN", .serialized)
struct WideAreaTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    @Test("the agent finds a server on another subnet through the site's DNS within 2 s and follows its record")
    func agentFollowsTheSitesDNS() async throws {
        try await withResources {
            let site = try await Site.up(bed)
            defer { site.down() }
            let tag = TestBed.tag()
            let port = Int.random(in: 30000...39999)
            let moved = port + 1
            let first = try await site.server(port: port, instance: "Far:\(port)")
            Resources.current?.keep(first)
            let second = try await site.server(port: moved, instance: "Far:\(port)")
            Resources.current?.keep(second)
            var dns = try await site.dns(records: [.init(name: "Far \(tag)", port: port)])

            // The browse domain is announced under the search domain (b._dns-sd._udp.site.test).
            let started = ContinuousClock.now
            let agent = try await AgentProcess.start(
                bed, config: #"{"trust": "lan"}"#, environment: ["LOCALDOMAIN": "site.test"], host: .h4)
            let found = await agent.waitForRoute(timeout: 10) {
                $0.baseURL == "http://\(Site.serverAddress):\(port)" && $0.announced
            }
            let seconds = (ContinuousClock.now - started).seconds
            let route = try #require(found, "not found through DNS: \(agent.process.stderr.suffix(2000))")
            print("wide-area: found \(seconds) s after the agent's start")
            #expect(seconds < 2, "found after \(seconds) s")
            #expect(route.foundBy == "DNS domain \(Site.domain)")
            #expect(route.source == .mdns)
            let status = try await Command.run(
                "\(TestBed.binDir)/lmx-status", ["--socket", agent.directory + "/agent.sock"])
            #expect(status.stdout.contains("mdns (DNS domain \(Site.domain))"), "\(status.stdout)")

            // The record moves to another port: followed (the zone's TTL is 1 s; asked again within 5 s).
            await dns.stop()
            dns = try await site.dns(records: [.init(name: "Far \(tag)", port: moved)])
            let movedAt = ContinuousClock.now
            let followed = await agent.waitForRoute(timeout: 12) {
                $0.baseURL == "http://\(Site.serverAddress):\(moved)" && $0.announced
            }
            #expect(followed != nil, "the changed record was not followed")
            print("wide-area: change followed in \((ContinuousClock.now - movedAt).seconds) s")

            // The record goes: the route is no longer announced.
            await dns.stop()
            dns = try await site.dns(records: [])
            Resources.current?.keep(dns)
            let goneAt = ContinuousClock.now
            let gone = await agent.waitForStatus(timeout: 12) { status in
                !status.candidates.flatMap(\.routes).contains {
                    $0.baseURL == "http://\(Site.serverAddress):\(moved)" && $0.announced
                }
            }
            #expect(gone != nil, "the removed record was not followed")
            print("wide-area: removal followed in \((ContinuousClock.now - goneAt).seconds) s")
        }
    }

    @Test("lmx-discover -d DOMAIN lists the servers of a unicast DNS domain, saying where they were found")
    func discoverInADomain() async throws {
        try await withResources {
            let site = try await Site.up(bed)
            defer { site.down() }
            let tag = TestBed.tag()
            let dns = try await site.dns(records: [.init(name: "Far \(tag)", port: 1234)])
            Resources.current?.keep(dns)
            let result = try await Command.run(
                "/usr/sbin/ip",
                ["netns", "exec", "lmxh4", "\(TestBed.binDir)/lmx-discover", "-d", Site.domain, "--json"],
                environment: ["LOCALDOMAIN": ""], timeout: 20)
            #expect(result.status == 0, "\(result.stderr)")
            let servers = try JSONDecoder().decode([ServerJSON].self, from: Data(result.stdout.utf8))
            // (dnsmasq hands names out in lower case.)
            let server = try #require(
                servers.first { $0.name.lowercased() == "far \(tag)".lowercased() }, "\(result.stdout)")
            #expect(server.domain == Site.domain)
            #expect(server.addresses == [Site.serverAddress])
            #expect(server.port == 1234)
            #expect(server.path == "/.well-known/opta-lmx")
            #expect(server.foundBy == "DNS domain \(Site.domain)")
        }
    }

    @Test("with nothing usable, the agent's discovery checks are in /v1/status and lmx-status")
    func agentSaysWhyNothingIsFound() async throws {
        try await withResources {
            // h4 on a bus without avahi-daemon: the cause is that, in words.
            let agent = try await AgentProcess.start(
                bed, environment: ["DBUS_SYSTEM_BUS_ADDRESS": bed.noAvahiBus], host: .h4)
            let status = await agent.waitForStatus(timeout: 15) { ($0.discoveryFindings ?? []).isEmpty == false }
            let findings = try #require(status?.discoveryFindings, "no findings in /v1/status")
            #expect(findings.contains { $0.cause == .daemonNotRunning })
            let text = try await Command.run(
                "\(TestBed.binDir)/lmx-status", ["--socket", agent.directory + "/agent.sock"])
            #expect(text.status == 1)
            #expect(text.stdout.contains("Why nothing is found"))
            #expect(text.stdout.contains("daemon-not-running"))
        }
    }

    @Test("docs/wide-area-discovery.md: the dnsmasq configuration, served as written, lists its server")
    func documentedConfigurationWorks() async throws {
        try await withResources {
            let page = try String(contentsOfFile: TestBed.repo + "/docs/wide-area-discovery.md", encoding: .utf8)
            let block = try #require(
                page.components(separatedBy: "```conf\n").dropFirst().first?.components(separatedBy: "```").first)
            let file = AgentProcess.makeDirectory() + "/opta-lmx.conf"
            try block.write(toFile: file, atomically: true, encoding: .utf8)
            let site = try await Site.up(bed)
            defer { site.down() }
            // The previous test's dnsmasq may still hold port 53 for a moment (a loaded machine
            // reaps it late): one that exits at once is started again.
            var dns: LiveProcess!
            for _ in 0..<10 {
                dns = LiveProcess(
                    "/usr/sbin/ip",
                    [
                        "netns", "exec", "lmxrt", "/usr/sbin/dnsmasq", "-k", "--no-resolv", "--no-hosts",
                        "--bind-interfaces",
                        "--listen-address=\(Site.dnsAddress)", "--port=53", "--user=root", "--group=root",
                        "--local=/example.com/", "--conf-file=\(file)",
                    ])
                try await dns.start()
                Resources.current?.keep(dns)
                try await Task.sleep(for: .milliseconds(500))
                if dns.isRunning { break }
            }
            var listed: CommandResult?
            for _ in 0..<20 {
                let result = try await Command.run(
                    "/usr/sbin/ip",
                    ["netns", "exec", "lmxh4", "\(TestBed.binDir)/lmx-discover", "-d", "lmx.example.com", "--json"],
                    environment: ["LOCALDOMAIN": ""], timeout: 20)
                if result.status == 0 {
                    listed = result
                    break
                }
                try await Task.sleep(for: .milliseconds(200))
            }
            let result = try #require(listed, "dnsmasq with the documented configuration listed nothing: \(dns.stderr)")
            let servers = try JSONDecoder().decode([ServerJSON].self, from: Data(result.stdout.utf8))
            #expect(servers.map { $0.name.lowercased() } == ["studio"])  // (names come in lower case)
            #expect(servers.first?.addresses == ["192.168.20.10"])
            #expect(servers.first?.port == 1234)
            #expect(servers.first?.host == "studio.lmx.example.com")
            #expect(servers.first?.txt["service"] == "opta-lmx")
            // The browse domain is announced under the search domain: the doctor finds it there.
            let doctor = try await Command.run(
                "/usr/sbin/ip",
                [
                    "netns", "exec", "lmxh4", "\(TestBed.binDir)/lmx-discover", "--doctor", "-i", "lan0", "--timeout",
                    "1",
                ],
                environment: ["LOCALDOMAIN": "example.com", "DBUS_SYSTEM_BUS_ADDRESS": bed.bus(.h4)], timeout: 30)
            #expect(
                doctor.stdout.contains("DNS domain lmx.example.com (announced under example.com)"), "\(doctor.stdout)")
        }
    }

    @Test("docs/wide-area-discovery.md: the zone file's records, served as written by NSD, list their server")
    func documentedZoneWorks() async throws {
        try await withResources {
            let page = try String(contentsOfFile: TestBed.repo + "/docs/wide-area-discovery.md", encoding: .utf8)
            let block = try #require(
                page.components(separatedBy: "```zone\n").dropFirst().first?.components(separatedBy: "```").first)
            let dir = AgentProcess.makeDirectory()
            // The zone's own SOA and NS records, which every zone has; then the page's records as written.
            try """
            $ORIGIN example.com.
            $TTL 60
            @    SOA  ns.example.com. admin.example.com. 1 3600 600 86400 60
            @    NS   ns
            ns   A    \(Site.dnsAddress)

            """.appending(block).write(toFile: dir + "/example.com.zone", atomically: true, encoding: .utf8)
            try """
            server:
              ip-address: \(Site.dnsAddress)
              port: 53
              zonesdir: "\(dir)"
              username: ""
              chroot: ""
              pidfile: "\(dir)/nsd.pid"
              database: ""
              xfrdfile: "\(dir)/xfrd.state"
              zonelistfile: "\(dir)/zone.list"
              logfile: "\(dir)/nsd.log"
            remote-control:
              control-enable: no
            zone:
              name: example.com
              zonefile: example.com.zone

            """.write(toFile: dir + "/nsd.conf", atomically: true, encoding: .utf8)
            let check = try await Command.run("/usr/sbin/nsd-checkzone", ["example.com", dir + "/example.com.zone"])
            #expect(check.status == 0, "\(check.stdout)\(check.stderr)")
            let site = try await Site.up(bed)
            defer { site.down() }
            let nsd = LiveProcess(
                "/usr/sbin/ip", ["netns", "exec", "lmxrt", "/usr/sbin/nsd", "-d", "-c", dir + "/nsd.conf"])
            try await nsd.start()
            Resources.current?.keep(nsd)
            var listed: CommandResult?
            for _ in 0..<25 {
                let result = try await Command.run(
                    "/usr/sbin/ip",
                    ["netns", "exec", "lmxh4", "\(TestBed.binDir)/lmx-discover", "-d", "lmx.example.com", "--json"],
                    environment: ["LOCALDOMAIN": ""], timeout: 20)
                if result.status == 0 {
                    listed = result
                    break
                }
                try await Task.sleep(for: .milliseconds(200))
            }
            let log = (try? String(contentsOfFile: dir + "/nsd.log", encoding: .utf8)) ?? ""
            let result = try #require(listed, "NSD with the documented zone listed nothing: \(nsd.stderr) \(log)")
            let servers = try JSONDecoder().decode([ServerJSON].self, from: Data(result.stdout.utf8))
            #expect(servers.map { $0.name.lowercased() } == ["studio"])  // (names come in lower case)
            #expect(servers.first?.addresses == ["192.168.20.10"])
            #expect(servers.first?.port == 1234)
            #expect(servers.first?.txt["path"] == "/.well-known/opta-lmx")
            let doctor = try await Command.run(
                "/usr/sbin/ip",
                [
                    "netns", "exec", "lmxh4", "\(TestBed.binDir)/lmx-discover", "--doctor", "-i", "lan0", "--timeout",
                    "1",
                ],
                environment: ["LOCALDOMAIN": "example.com", "DBUS_SYSTEM_BUS_ADDRESS": bed.bus(.h4)], timeout: 30)
            #expect(
                doctor.stdout.contains("DNS domain lmx.example.com (announced under example.com)"), "\(doctor.stdout)")
        }
    }
}
