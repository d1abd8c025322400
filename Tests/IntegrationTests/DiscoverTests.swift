import Foundation
import LMXCore
import Testing

/// `lmx-discover` against the real avahi-daemon and real LAN hosts in network namespaces.
/// Serialized: some tests restart the daemon every other test talks to.
@Suite("lmx-discover on the real test LAN", .serialized)
struct DiscoverTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    // MARK: Helpers

    private func servers(_ result: CommandResult, tag: String) throws -> [ServerJSON] {
        let all = try JSONDecoder().decode([ServerJSON].self, from: Data(result.stdout.utf8))
        return all.filter { $0.name.contains(tag) }
    }

    /// `avahi-browse -rtp` resolved lines for names containing `tag` (escaped form).
    private func avahiBrowseLines(tag: String) async throws -> Set<String> {
        // avahi-browse -r can wait a long time on a resolver for a service withdrawn by an earlier
        // test; such a run counts as "not seen yet" and the caller asks again.
        guard let result = try? await Command.run("/usr/bin/avahi-browse", ["-rtp", "_opta-lmx._tcp"], timeout: 8)
        else {
            return []
        }
        #expect(result.status == 0)
        return Set(
            result.stdout.split(separator: "\n").map(String.init).filter { $0.hasPrefix("=;") && $0.contains(tag) })
    }

    private func watch(bus: String? = nil, _ extra: [String] = []) async throws -> LiveProcess {
        var environment: [String: String] = [:]
        if let bus { environment["DBUS_SYSTEM_BUS_ADDRESS"] = bus }
        let process = LiveProcess("\(TestBed.binDir)/lmx-discover", ["--watch"] + extra, environment: environment)
        try await process.start()
        return process
    }

    private struct WatchLine: Decodable {
        var event: String
        var state: String?
        var reason: String?
        var changes: [String]?
        var server: ServerJSON?
    }

    private func events(_ process: LiveProcess) -> [WatchLine] {
        process.stdoutLines.compactMap { try? JSONDecoder().decode(WatchLine.self, from: Data($0.utf8)) }
    }

    private func count(_ process: LiveProcess, _ event: String, name: String) -> Int {
        events(process).filter { $0.event == event && $0.server?.name == name }.count
    }

    // MARK: Finding servers

    @Test(
        "servers on this host and on two LAN hosts are all found; JSON, table and --parsable agree with avahi-browse -rtp"
    )
    func findsEveryHostAndAgreesWithAvahiBrowse() async throws {
        let tag = TestBed.tag()
        let local = try await Publish.avahi(bed, on: .root, name: "Local \(tag)", port: 4321)
        let first = try await Publish.avahi(bed, on: .h1, name: "Studio \(tag)", port: 1234)
        let second = try await Publish.avahi(
            bed, on: .h2, name: "Mono512.local \(tag)", port: 1235,
            txt: ["path=/v1/discovery", "service=opta-lmx", "extra"])
        defer { for p in [local, first, second] { p.signal(SIGTERM) } }

        let json = try await Command.discover(["--json"])
        #expect(json.status == 0)
        let found = try servers(json, tag: tag)
        #expect(found.map(\.name).sorted() == ["Local \(tag)", "Mono512.local \(tag)", "Studio \(tag)"])
        let byName = Dictionary(uniqueKeysWithValues: found.map { ($0.name, $0) })
        #expect(Set(byName["Local \(tag)"]?.addresses ?? []) == [bed.address(.root), "127.0.0.1"])
        #expect(byName["Studio \(tag)"]?.addresses == [bed.address(.h1)])
        #expect(byName["Mono512.local \(tag)"]?.addresses == [bed.address(.h2)])
        #expect(byName["Mono512.local \(tag)"]?.port == 1235)
        #expect(byName["Mono512.local \(tag)"]?.path == "/v1/discovery")
        #expect(byName["Studio \(tag)"]?.path == "/.well-known/opta-lmx")

        // --parsable is line-for-line what avahi-browse -rtp prints.
        let avahi = try await avahiBrowseLines(tag: tag)
        let parsable = try await Command.discover(["--parsable"])
        #expect(parsable.status == 0)
        let ours = Set(parsable.stdout.split(separator: "\n").map(String.init).filter { $0.contains(tag) })
        #expect(ours == avahi)
        #expect(avahi.count == 4)  // Local on lo and lmxbr0, the two LAN hosts on lmxbr0
        // The flags avahi-browse users type work as typed: -rtp, -art -p, -d local.
        for flags in [["-rtp"], ["-art", "-p"], ["-p", "-d", "local"]] {
            let typed = try await Command.discover(flags)
            #expect(typed.status == 0, "\(flags)")
            #expect(
                Set(typed.stdout.split(separator: "\n").map(String.init).filter { $0.contains(tag) }) == avahi,
                "\(flags)")
        }

        // JSON carries the same records as avahi-browse: name, interface, address, port, TXT.
        let fromJSON = Set(
            found.flatMap { server in
                server.records.map { record in
                    let txt = TXTRecord(entries: server.txtRaw.map { Array(Data(base64Encoded: $0)!) })
                    return [
                        "=", record.interface, record.protocol.rawValue, DNSSDText.escapeLabel(server.name),
                        server.type,
                        server.domain, record.host, record.address, String(record.port), DNSSDText.quoteTXT(txt),
                    ].joined(separator: ";")
                }
            })
        #expect(fromJSON == avahi)

        // The table shows every server with all of its endpoints.
        let table = try await Command.discover([])
        #expect(table.status == 0)
        let lines = table.stdout.split(separator: "\n").map(String.init)
        #expect(lines.first?.hasPrefix("NAME") == true)
        for server in found {
            let row = try #require(lines.first { $0.hasPrefix(server.name + " ") })
            for address in server.addresses { #expect(row.contains("\(address):\(server.port)")) }
            #expect(row.contains(server.path))
        }
    }

    @Test("names with dots, spaces, UTF-8 and 63-byte labels round-trip exactly")
    func unusualNames() async throws {
        let tag = TestBed.tag()
        let names = [
            "Mono512.local.\(tag)",
            "Studio Mac — ünïcödé 🚀 \(tag)",
            "semi;colon \"quoted\" back\\slash \(tag)",
            String(repeating: "x", count: 63 - tag.utf8.count - 1) + "-" + tag,  // 63 bytes, the label maximum
        ]
        #expect(names.last?.utf8.count == 63)
        var publishers: [LiveProcess] = []
        defer { for p in publishers { p.signal(SIGTERM) } }
        for (i, name) in names.enumerated() {
            publishers.append(try await Publish.avahi(bed, on: i % 2 == 0 ? .h1 : .h2, name: name, port: 2000 + i))
        }
        let found = try servers(try await Command.discover(["--json"]), tag: tag)
        #expect(Set(found.map(\.name)) == Set(names))
        let avahi = try await avahiBrowseLines(tag: tag)
        let parsable = try await Command.discover(["--parsable"])
        #expect(Set(parsable.stdout.split(separator: "\n").map(String.init).filter { $0.contains(tag) }) == avahi)
        #expect(avahi.count == names.count)
    }

    @Test("TXT with 20 keys, binary values and no path: every byte kept, path defaulted")
    func unusualTXT() async throws {
        let tag = TestBed.tag()
        let keys = (1...20).map { "key\($0)=value \($0)" }
        let publisher = try await Publish.zeroconf(
            bed, name: "TXT \(tag)", ttl: 120,
            txt: keys + ["bin=hex:ff00017f80fe", "flag"])
        defer { publisher.signal(SIGKILL) }
        let found = try servers(try await Command.discover(["--json"]), tag: tag)
        let server = try #require(found.first)
        #expect(server.path == "/.well-known/opta-lmx")
        for i in 1...20 { #expect(server.txt["key\(i)"] == .some("value \(i)")) }
        #expect(server.txt["flag"] == .some(nil))
        let raw = server.txtRaw.compactMap { Data(base64Encoded: $0) }
        #expect(raw.contains(Data("bin=".utf8) + Data([0xFF, 0x00, 0x01, 0x7F, 0x80, 0xFE])))
        #expect(raw.count == 22)
        let avahi = try await avahiBrowseLines(tag: tag)
        let parsable = try await Command.discover(["--parsable"])
        #expect(Set(parsable.stdout.split(separator: "\n").map(String.init).filter { $0.contains(tag) }) == avahi)
    }

    @Test("200 services published at once are all listed")
    func twoHundredServices() async throws {
        let tag = "Bulk\(TestBed.tag())"
        try await bed.control("publish-bulk", "200", tag)
        defer { Task { try? await bed.control("unpublish-bulk") } }
        // Wait until avahi-browse itself sees all of them, then one listing must have them all.
        var seen = 0
        for _ in 0..<30 where seen < 200 {
            seen = try await avahiBrowseLines(tag: tag).count
            if seen < 200 { try await Task.sleep(for: .milliseconds(300)) }
        }
        #expect(seen == 200)
        let result = try await Command.discover(["--json", "--timeout", "10"])
        let found = try servers(result, tag: tag)
        #expect(found.count == 200)
        #expect(Set(found.map(\.port)).count == 200)
        #expect(found.allSatisfy { $0.addresses == [bed.address(.h2)] })
        try await bed.control("unpublish-bulk")
    }

    // MARK: Selection

    @Test("interfaces are chosen by name and glob; -4 keeps IPv4")
    func interfaceSelection() async throws {
        let tag = TestBed.tag()
        let local = try await Publish.avahi(bed, on: .root, name: "Iface \(tag)")
        defer { local.signal(SIGTERM) }
        func interfaces(_ arguments: [String]) async throws -> [String] {
            try servers(try await Command.discover(["--json"] + arguments), tag: tag).first?.interfaces ?? []
        }
        #expect(try await interfaces([]) == [bed["LMX_TESTBED_BRIDGE"], "lo"])
        #expect(try await interfaces(["--interface", "lo"]) == ["lo"])
        #expect(try await interfaces(["--interface", "lmx*"]) == [bed["LMX_TESTBED_BRIDGE"]])
        #expect(try await interfaces(["--exclude-interface", "lmxbr?"]) == ["lo"])
        #expect(try await interfaces(["-4"]) == [bed["LMX_TESTBED_BRIDGE"], "lo"])
        #expect(try await interfaces(["--interface", "*", "--exclude-interface", "lo"]) == [bed["LMX_TESTBED_BRIDGE"]])
        let none = try await Command.discover(["--interface", "nonexistent0", "--timeout", "2"])
        #expect(none.status == 1)
    }

    @Test("over IPv6: link-local addresses carry %interface, -6 keeps IPv6, a dual-stack host keeps its IPv4 address")
    func ipv6() async throws {
        // Switch the root and h2 daemons to IPv4 + IPv6 (still only lo and the test links).
        for host in ["root", "h2"] {
            try await bed.control("restart-avahi", host, environment: ["LMX_TESTBED_IPV6": "yes"])
        }
        var failure: (any Error)?
        do {
            let tag = TestBed.tag()
            let publisher = try await Publish.avahi(bed, on: .h2, name: "Dual \(tag)")
            defer { publisher.signal(SIGTERM) }
            let bridge = bed["LMX_TESTBED_BRIDGE"]
            var both: ServerJSON?
            for _ in 0..<10 where both == nil {
                let server = try servers(try await Command.discover(["--json"]), tag: tag).first
                if let server, server.addresses.count == 2 {
                    both = server
                } else {
                    try await Task.sleep(for: .milliseconds(300))
                }
            }
            let dual = try #require(both)
            #expect(dual.addresses.first == bed.address(.h2))
            let v6 = try #require(dual.addresses.last)
            #expect(v6.lowercased().hasPrefix("fe80:") && v6.hasSuffix("%\(bridge)"))
            #expect(Set(dual.records.map(\.protocol)) == [.ipv4, .ipv6])

            let onlySix = try servers(try await Command.discover(["--json", "-6"]), tag: tag)
            #expect(onlySix.first?.addresses == [v6])
            let onlyFour = try servers(try await Command.discover(["--json", "-4"]), tag: tag)
            #expect(onlyFour.first?.addresses == [bed.address(.h2)])

            let table = try await Command.discover(["-6"])
            #expect(table.stdout.contains("[\(v6)]:1234"))
        } catch {
            failure = error
        }
        // h2 first: once it publishes no AAAA record, a fresh root daemon caches none of its old ones
        // (avahi-browse would otherwise resolve later IPv4 sightings to that stale IPv6 address).
        for host in ["h2", "root"] { try await bed.control("restart-avahi", host) }
        if let failure { throw failure }
    }

    // MARK: Exit codes

    @Test("no server found exits 1 with a hint")
    func noneFound() async throws {
        let result = try await Command.discover(["--type", "_lmx-nothing._tcp", "--timeout", "2"])
        #expect(result.status == 1)
        #expect(result.stderr.contains("No _lmx-nothing._tcp servers found"))
        #expect(result.seconds < 2.5)
        let json = try await Command.discover(["--type", "_lmx-nothing._tcp", "--json", "--timeout", "2"])
        #expect(json.status == 1)
        #expect(json.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "[\n\n]" || json.stdout.contains("[]"))
    }

    @Test(
        "usage errors exit 64",
        arguments: [
            ["--json", "--parsable"], ["--timeout", "-1"], ["--type", "opta-lmx"], ["-4", "-6"],
            ["--watch", "--parsable"], ["--bogus"], ["--watch", "-t"],
        ])
    func usageErrors(arguments: [String]) async throws {
        let result = try await Command.discover(arguments)
        #expect(result.status == 64)
        #expect(!result.stderr.isEmpty)
    }

    @Test("avahi-daemon not running: exit 69 within 1 s, saying how to start it")
    func daemonUnreachable() async throws {
        for bus in [bed.noAvahiBus, "unix:path=/nonexistent/system_bus_socket"] {
            let result = try await Command.discover([], bus: bus)
            #expect(result.status == 69)
            #expect(result.stderr.contains("avahi-daemon is not reachable"))
            #expect(result.stderr.contains("systemctl start avahi-daemon"))
            #expect(result.seconds < 1)
        }
    }

    // MARK: Watching

    @Test("--watch: a killed publisher is removed within 2 s")
    func killedPublisherRemoved() async throws {
        let tag = TestBed.tag()
        let name = "Killed \(tag)"
        let watcher = try await watch()
        defer { watcher.signal(SIGKILL) }
        let publisher = try await Publish.avahi(bed, on: .h1, name: name)
        #expect(await watcher.waitFor(timeout: 5) { _ in count(watcher, "added", name: name) == 1 })
        let killed = ContinuousClock.now
        await publisher.stop(signal: SIGKILL)
        #expect(await watcher.waitFor(timeout: 2) { _ in count(watcher, "removed", name: name) == 1 })
        let elapsed = ContinuousClock.now - killed
        #expect(elapsed < .seconds(2))
        #expect(events(watcher).first { $0.event == "removed" && $0.server?.name == name }?.reason == "withdrawn")
    }

    @Test("--watch: a short-TTL publisher that dies without goodbye is removed after its TTL")
    func shortTTLWithoutGoodbye() async throws {
        let tag = TestBed.tag()
        let name = "Vanish \(tag)"
        let ttl = 4
        let watcher = try await watch()
        defer { watcher.signal(SIGKILL) }
        let publisher = try await Publish.zeroconf(bed, name: name, ttl: ttl, txt: ["path=/.well-known/opta-lmx"])
        #expect(await watcher.waitFor(timeout: 5) { _ in count(watcher, "added", name: name) == 1 })
        let killed = ContinuousClock.now
        await publisher.stop(signal: SIGKILL)  // no goodbye packet
        try await Task.sleep(for: .milliseconds(500))
        #expect(count(watcher, "removed", name: name) == 0, "removed before the TTL ran out: that would be a goodbye")
        #expect(await watcher.waitFor(timeout: Double(ttl) + 4) { _ in count(watcher, "removed", name: name) == 1 })
        let elapsed = ContinuousClock.now - killed
        #expect(elapsed < .seconds(ttl + 4))
    }

    @Test("--watch: a TXT change in place is an update naming txt")
    func txtUpdate() async throws {
        let tag = TestBed.tag()
        let name = "Update \(tag)"
        let watcher = try await watch()
        defer { watcher.signal(SIGKILL) }
        let publisher = try await Publish.zeroconf(bed, name: name, ttl: 120, txt: ["path=/.well-known/opta-lmx"])
        defer { publisher.signal(SIGKILL) }
        #expect(await watcher.waitFor(timeout: 5) { _ in count(watcher, "added", name: name) == 1 })
        // python-zeroconf re-announces the first TXT for about 2 s after registering; an update
        // inside that burst races with it at the publisher, so change it after the burst.
        try await Task.sleep(for: .milliseconds(2500))
        publisher.send("update path=/v1/discovery service=opta-lmx")
        #expect(await watcher.waitFor(timeout: 5) { _ in count(watcher, "updated", name: name) >= 1 })
        let update = try #require(events(watcher).last { $0.event == "updated" && $0.server?.name == name })
        #expect(update.changes?.contains("txt") == true)
        #expect(update.server?.path == "/v1/discovery")
    }

    @Test("--watch survives an avahi-daemon restart: reconnects, re-emits each server once, no crash")
    func daemonRestart() async throws {
        let tag = TestBed.tag()
        let name = "Steady \(tag)"
        let publisher = try await Publish.avahi(bed, on: .h1, name: name)
        defer { publisher.signal(SIGTERM) }
        let watcher = try await watch()
        defer { watcher.signal(SIGKILL) }
        #expect(await watcher.waitFor(timeout: 5) { _ in count(watcher, "added", name: name) == 1 })

        try await bed.control("restart-avahi", "root")
        #expect(await watcher.waitFor(timeout: 10) { _ in count(watcher, "added", name: name) == 2 })
        try await Task.sleep(for: .seconds(2))  // anything duplicated would show up by now
        #expect(watcher.isRunning)
        let lines = events(watcher)
        let states = lines.filter { $0.event == "daemon" }.compactMap(\.state)
        #expect(states.first == "running")
        #expect(states.contains("reconnecting"))
        #expect(states.last == "running")
        let afterReconnect = lines.drop { !($0.event == "daemon" && $0.state == "reconnecting") }
        #expect(afterReconnect.filter { $0.event == "added" && $0.server?.name == name }.count == 1)
        #expect(lines.filter { $0.event == "removed" && $0.server?.name == name }.map(\.reason) == ["daemon-lost"])
        await watcher.stop(signal: SIGINT)
        #expect(!watcher.isRunning)
    }

    @Test("--watch waits for an absent daemon, says so on stderr, and stops cleanly on SIGTERM")
    func watchWaitsForDaemon() async throws {
        for (bus, reason) in [
            (bed.noAvahiBus, "avahi-daemon is not running"),
            ("unix:path=/nonexistent/system_bus_socket", "system D-Bus unreachable"),
        ] {
            let watcher = try await watch(bus: bus)
            #expect(await watcher.waitFor(timeout: 3) { _ in events(watcher).contains { $0.state == "waiting" } })
            #expect(events(watcher).first?.reason?.contains(reason) == true)
            // stderr is written first, but read by another reader than stdout: wait for it too.
            #expect(await watcher.waitFor(timeout: 3) { $0.stderr.contains("waiting for avahi-daemon") })
            try await Task.sleep(for: .milliseconds(1500))
            #expect(watcher.isRunning)
            watcher.signal(SIGTERM)
            let status = try await watcher.waitForExit(timeout: 3)
            #expect(status == 0)
        }
    }
}
