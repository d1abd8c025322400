import LMXCore
import Testing

private let instance = ServiceInstanceID(name: "Mono512", type: "_opta-lmx._tcp", domain: "local")
private let bridge = NetworkInterface(index: 3, name: "lmxbr0")
private let loopback = NetworkInterface(index: 1, name: "lo")
private let wifi = NetworkInterface(index: 4, name: "wlan0")

private func key(_ interface: NetworkInterface, _ proto: IPProtocol = .ipv4, _ id: ServiceInstanceID = instance)
    -> RecordKey
{
    RecordKey(instance: id, interface: interface, ipProtocol: proto)
}

private func record(
    _ interface: NetworkInterface, _ address: String, proto: IPProtocol = .ipv4, port: UInt16 = 1234,
    txt: [String] = ["path=/.well-known/opta-lmx", "service=opta-lmx"]
) -> ResolvedRecord {
    ResolvedRecord(
        key: key(interface, proto), hostName: "Mono512.local", address: address, port: port,
        txt: TXTRecord(strings: txt))
}

@Suite("ServerRegistry merges sightings into servers")
struct ServerRegistryTests {
    @Test("a resolved sighting announces the server once")
    func added() {
        var registry = ServerRegistry()
        #expect(registry.apply(.found(key(bridge))).isEmpty)
        let events = registry.apply(.resolved(record(bridge, "10.0.0.5")))
        guard case .added(let server)? = events.first, events.count == 1 else {
            Issue.record("expected one added event, got \(events)")
            return
        }
        #expect(server.addresses == ["10.0.0.5"])
        #expect(server.servicePath == "/.well-known/opta-lmx")
    }

    @Test("one instance on several interfaces and protocols is one server with all addresses")
    func mergesInterfacesAndProtocols() {
        var registry = ServerRegistry()
        _ = registry.apply(.resolved(record(loopback, "127.0.0.1")))
        _ = registry.apply(.resolved(record(bridge, "10.0.0.5")))
        let events = registry.apply(.resolved(record(wifi, "fe80::1", proto: .ipv6)))
        #expect(registry.servers.count == 1)
        let server = registry.servers[0]
        #expect(server.addresses == ["10.0.0.5", "127.0.0.1", "fe80::1%wlan0"])
        #expect(server.interfaces == ["lmxbr0", "lo", "wlan0"])
        guard case .updated(_, let changes)? = events.first else {
            Issue.record("expected updated")
            return
        }
        #expect(changes == [.addresses, .interfaces])
    }

    @Test("resolving the same data again says nothing")
    func identicalResolveIsSilent() {
        var registry = ServerRegistry()
        _ = registry.apply(.resolved(record(bridge, "10.0.0.5")))
        #expect(registry.apply(.resolved(record(bridge, "10.0.0.5"))).isEmpty)
    }

    @Test("a TXT or port change is an update naming what changed")
    func txtAndPortChange() {
        var registry = ServerRegistry()
        _ = registry.apply(.resolved(record(bridge, "10.0.0.5")))
        let events = registry.apply(.resolved(record(bridge, "10.0.0.5", port: 8080, txt: ["path=/v1/discovery"])))
        guard case .updated(let server, let changes)? = events.first else {
            Issue.record("expected updated")
            return
        }
        #expect(changes == [.port, .txt])
        #expect(server.servicePath == "/v1/discovery")
    }

    @Test("losing one of two sightings updates; losing the last removes")
    func removal() {
        var registry = ServerRegistry()
        _ = registry.apply(.resolved(record(bridge, "10.0.0.5")))
        _ = registry.apply(.resolved(record(loopback, "127.0.0.1")))
        let first = registry.apply(.lost(key(loopback)))
        guard case .updated(let server, _)? = first.first else {
            Issue.record("expected updated")
            return
        }
        #expect(server.addresses == ["10.0.0.5"])
        let second = registry.apply(.lost(key(bridge)))
        guard case .removed(_, let reason)? = second.first else {
            Issue.record("expected removed")
            return
        }
        #expect(reason == .withdrawn)
        #expect(registry.servers.isEmpty)
    }

    @Test("a sighting that never resolved is never announced nor removed")
    func unresolvedIsSilent() {
        var registry = ServerRegistry()
        _ = registry.apply(.found(key(bridge)))
        #expect(registry.apply(.lost(key(bridge))).isEmpty)
        #expect(registry.servers.isEmpty)
    }

    @Test("the listing is settled after all-for-now once every sighting resolved or failed")
    func settled() {
        var registry = ServerRegistry()
        _ = registry.apply(.found(key(bridge)))
        _ = registry.apply(.found(key(loopback)))
        _ = registry.apply(.allForNow)
        #expect(!registry.isSettled)
        _ = registry.apply(.resolved(record(bridge, "10.0.0.5")))
        #expect(!registry.isSettled)
        _ = registry.apply(.resolveFailed(key(loopback), reason: "Timeout reached"))
        #expect(registry.isSettled)
        #expect(registry.servers.count == 1)
    }

    @Test("losing the daemon removes every server with reason daemon-lost, then re-adds on return")
    func daemonLost() {
        var registry = ServerRegistry()
        _ = registry.apply(.daemon(.running))
        _ = registry.apply(.resolved(record(bridge, "10.0.0.5")))
        _ = registry.apply(.allForNow)
        let lost = registry.apply(.daemon(.reconnecting))
        #expect(lost.count == 2)
        guard case .removed(_, .daemonLost)? = lost.first, case .daemon(.reconnecting)? = lost.last else {
            Issue.record("expected removed then reconnecting, got \(lost)")
            return
        }
        #expect(!registry.allForNow)
        #expect(registry.apply(.daemon(.waiting(reason: "avahi-daemon is not running"))).count == 1)
        #expect(registry.apply(.daemon(.running)) == [.daemon(.running)])
        guard case .added? = registry.apply(.resolved(record(bridge, "10.0.0.5"))).first else {
            Issue.record("expected added after reconnect")
            return
        }
    }

    @Test("servers with different names stay apart, sorted by name")
    func separateInstances() {
        var registry = ServerRegistry()
        let other = ServiceInstanceID(name: "Another.box", type: "_opta-lmx._tcp", domain: "local")
        _ = registry.apply(.resolved(record(bridge, "10.0.0.5")))
        _ = registry.apply(
            .resolved(
                ResolvedRecord(
                    key: key(bridge, .ipv4, other), hostName: "a.local",
                    address: "10.0.0.6", port: 1, txt: TXTRecord())))
        #expect(registry.servers.map(\.name) == ["Another.box", "Mono512"])
    }
}

@Suite("Addresses and interfaces")
struct AddressAndFilterTests {
    @Test(
        "IPv6 link-local addresses carry the interface, others do not",
        arguments: [
            ("fe80::1", "fe80::1%eth1"), ("FE80::abcd", "FE80::abcd%eth1"), ("febf::1", "febf::1%eth1"),
            ("fec0::1", "fec0::1"), ("2001:db8::1", "2001:db8::1"), ("10.0.0.1", "10.0.0.1"),
            ("fe80::1%eth9", "fe80::1%eth9"),
        ])
    func scoped(input: String, expected: String) {
        #expect(ServerAddress.scoped(input, interface: "eth1") == expected)
    }

    @Test("a server announced only by IPv6 link-local addresses gets a route with its interface as the zone")
    func linkLocalOnly() throws {
        let uppercase = NetworkInterface(index: 7, name: "Eth1")
        let server = DiscoveredServer(
            id: instance,
            records: [record(uppercase, "fe80::1", proto: .ipv6), record(loopback, "fe80::9", proto: .ipv6)])
        let route = try #require(Route.lan(for: server))
        #expect(route.baseURL == "http://[fe80::1%25Eth1]:1234")
        #expect(route.base.ipLiteral == "fe80::1%Eth1")
        #expect(route.id == "lan/[fe80::1%25Eth1]:1234")
        // febf:: is link-local too (fe80::/10): never before an IPv4 or a global IPv6 address.
        let mixed = DiscoveredServer(
            id: instance,
            records: [
                record(bridge, "febf::2", proto: .ipv6), record(bridge, "2001:db8::5", proto: .ipv6),
            ])
        #expect(Route.lan(for: mixed)?.baseURL == "http://[2001:db8::5]:1234")
        let dual = DiscoveredServer(
            id: instance, records: [record(bridge, "fe80::2", proto: .ipv6), record(bridge, "10.0.0.5")])
        #expect(Route.lan(for: dual)?.baseURL == "http://10.0.0.5:1234")
        #expect(ServerAddress.urlEscapedZone("fe80::1%25x") == "fe80::1%2525x")
        #expect(ServerAddress.urlEscapedZone("2001:db8::1") == "2001:db8::1")
    }

    @Test("host:port brackets IPv6")
    func hostPort() {
        #expect(ServerAddress.hostPort("10.0.0.1", port: 1234) == "10.0.0.1:1234")
        #expect(ServerAddress.hostPort("fe80::1%lo", port: 1234) == "[fe80::1%lo]:1234")
    }

    @Test("container, VM and VPN interfaces are left out by default")
    func defaultExclusions() {
        let filter = InterfaceFilter()
        for name in ["docker0", "veth12ab", "br-5f3e", "virbr0", "tun0", "tap3"] { #expect(!filter.allows(name)) }
        for name in ["eth0", "enp3s0", "wlan0", "lo", "lmxbr0", "bridge0"] { #expect(filter.allows(name)) }
        #expect(InterfaceFilter.all.allows("docker0"))
    }

    @Test("naming interfaces with globs uses only those, even default-excluded ones")
    func includeGlobs() {
        let filter = InterfaceFilter(include: ["en*", "wl?n0", "docker0"])
        #expect(filter.allows("enp3s0"))
        #expect(filter.allows("wlan0"))
        #expect(filter.allows("docker0"))
        #expect(!filter.allows("eth0"))
        #expect(!filter.allows("lo"))
    }

    @Test("explicit exclusions apply with or without include patterns")
    func explicitExclusions() {
        #expect(!InterfaceFilter(include: ["en*"], exclude: ["enp9*"]).allows("enp9s0"))
        #expect(InterfaceFilter(include: ["en*"], exclude: ["enp9*"]).allows("enp3s0"))
        #expect(!InterfaceFilter(exclude: ["wlan0"]).allows("wlan0"))
        #expect(!InterfaceFilter(exclude: ["wlan0"]).allows("docker0"))
        #expect(InterfaceFilter(exclude: ["wlan0"], excludesVirtualInterfaces: false).allows("docker0"))
    }

    @Test(
        "glob character classes",
        arguments: [
            ("eth[0-2]", "eth1", true), ("eth[0-2]", "eth3", false), ("eth[!0]", "eth1", true),
            ("eth[!0]", "eth0", false),
            ("*", "", true), ("?", "", false), ("a*b*c", "aXbYc", true), ("a*b*c", "aXbY", false), ("[", "[", true),
        ])
    func globs(pattern: String, text: String, expected: Bool) {
        #expect(Glob.matches(pattern, text) == expected)
    }
}
