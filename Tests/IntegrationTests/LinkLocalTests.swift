import Foundation
import LMXCore
import LMXStatusClient
import Testing

/// Two machines joined by a cable, a network without IPv4 (issue 66): the server's only address is
/// its IPv6 link-local one, usable only with the interface it is reached on as its zone.
@Suite("A server reachable only by an IPv6 link-local address (IPv6 mDNS on for the test)", .serialized)
struct LinkLocalTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    /// h2's link-local address on its test link.
    private func linkLocalOfH2() async throws -> String {
        let shown = try await Command.run(
            "/usr/sbin/ip",
            [
                "netns", "exec", bed["LMX_TESTBED_H2_NS"], "ip", "-6", "-o", "addr", "show", "dev", "lan0", "scope",
                "link",
            ])
        // "3: lan0    inet6 fe80::…/64 scope link \ valid_lft forever …"
        let field = shown.stdout.split(separator: " ").first { $0.hasPrefix("fe80:") }
        guard let address = field?.split(separator: "/").first else {
            throw TestBedMissing(detail: "h2 has no IPv6 link-local address on lan0: \(shown.stdout) \(shown.stderr)")
        }
        return String(address)
    }

    @Test(
        "announced with only its fe80 address: the agent's route carries the bridge as its zone, is probed ready, becomes active, and the gateway forwards to it"
    )
    func linkLocalOnly() async throws {
        for host in ["root", "h2"] {
            try await bed.control("restart-avahi", host, environment: ["LMX_TESTBED_IPV6": "yes"])
        }
        var failure: (any Error)?
        do {
            try await withResources {
                let tag = TestBed.tag()
                let address = try await linkLocalOfH2()
                let port = freePort()
                _ = try await LMXServer.start(
                    bed, on: .h2, port: port, instance: "cable-\(tag)", bind: address + "%lan0")
                // A host name with an AAAA record only, and the service on it: nothing but the
                // link-local address is announced.
                let hostName = "lmx-cable-\(tag).local"
                let record = LiveProcess(
                    "/usr/bin/avahi-publish", ["-a", "-R", hostName, address],
                    environment: ["DBUS_SYSTEM_BUS_ADDRESS": bed.bus(.h2)])
                try await record.start()
                guard await record.waitForLine(containing: "Established", timeout: 10) else {
                    throw TestBedMissing(detail: "avahi-publish -a \(address) failed: \(record.stderr)")
                }
                let service = LiveProcess(
                    "/usr/bin/avahi-publish",
                    [
                        "-s", "-H", hostName, "Cable \(tag)", "_opta-lmx._tcp", String(port),
                        "path=/.well-known/opta-lmx",
                        "service=opta-lmx",
                    ], environment: ["DBUS_SYSTEM_BUS_ADDRESS": bed.bus(.h2)])
                try await service.start()
                guard await service.waitForLine(containing: "Established", timeout: 10) else {
                    throw TestBedMissing(detail: "avahi-publish -s failed: \(service.stderr)")
                }

                let agent = try await AgentProcess.start(bed, config: config(window: 1))
                let expected = "http://[\(address)%25\(bed["LMX_TESTBED_BRIDGE"])]:\(port)"
                let route = await agent.waitForRoute(timeout: 15) { $0.baseURL == expected && $0.verdict == .ready }
                #expect(route != nil, "\(String(describing: try? agent.status().candidates))")
                let seconds = await agent.waitForActive(timeout: 10) { $0?.baseURL == expected }
                #expect(seconds != nil)
                print("figure: link-local-only server active through \(expected)")

                // The gateway reaches it on the same zone.
                let answer = try StatusClient(socketPath: agent.directory + "/gateway.sock", timeout: 10)
                    .request("GET", "/v1/models")
                #expect(answer.status == 200, "\(String(decoding: answer.body, as: UTF8.self))")
                #expect(String(decoding: answer.body, as: UTF8.self).contains("test/model"))
            }
        } catch {
            failure = error
        }
        // h2 first (as DiscoverTests' IPv6 test): a fresh root daemon then caches none of its AAAA records.
        for host in ["h2", "root"] { try await bed.control("restart-avahi", host) }
        if let failure { throw failure }
    }
}
