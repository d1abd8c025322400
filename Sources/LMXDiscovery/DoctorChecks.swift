import LMXCore
import LMXSystem

/// Runs the doctor's checks (avahi-daemon's view, a direct mDNS question per interface, unicast
/// DNS domains, probes) and hands them to ``DiscoveryDoctor``, which decides.
public struct DoctorChecks: Sendable {
    /// The interfaces whose results count (the configuration's).
    public var filter: InterfaceFilter
    /// The interfaces on which the direct mDNS question may be sent (`nil`: those of `filter`).
    public var askFilter: InterfaceFilter?
    /// Unicast DNS domains to browse besides those the network announces.
    public var browseDomains: [String]
    /// Whether to ask for the browse domains the network announces under its search domains.
    public var announcedDomains: Bool
    /// Addresses to ask directly (named by the user, or known to the agent).
    public var hosts: [HostPort]
    public var serviceType: String
    /// How long to listen: for avahi-daemon's listing and for direct answers.
    public var listen: Double

    public init(
        filter: InterfaceFilter, askFilter: InterfaceFilter? = nil, browseDomains: [String] = [],
        announcedDomains: Bool = true, hosts: [HostPort] = [],
        serviceType: String = BrowseConfiguration.defaultServiceType, listen: Double = 2
    ) {
        self.filter = filter
        self.askFilter = askFilter
        self.browseDomains = browseDomains
        self.announcedDomains = announcedDomains
        self.hosts = hosts
        self.serviceType = serviceType
        self.listen = listen
    }

    /// Checks everything at once and diagnoses.
    /// - Parameters:
    ///   - known: what recent probes found, by `host:port` (the agent's own): not probed again.
    ///   - probe: probes one plain-HTTP LAN base URL (`http://host:port`) by the contract; `nil`:
    ///     nothing is probed, only `known` is used.
    public func run(
        known: [String: ProbeReport] = [:], probe: (@Sendable (Route) async -> ProbeReport)?
    ) async -> DoctorReport {
        async let avahi = avahiView()
        async let wideArea = unicastDNSView()
        let links = RouteLookup.interfaces().links
        let interfaces = links.map {
            InterfaceCheck(name: $0.name, up: $0.up, multicast: $0.multicast, ipv4: $0.ipv4)
        }
        // The direct question goes out only on interfaces the configuration lets count.
        let asking = askFilter ?? filter
        let askable = links.filter {
            !$0.loopback && $0.up && $0.multicast && !$0.ipv4.isEmpty && filter.allows($0.name)
                && asking.allows($0.name)
        }
        let type = serviceType
        let listen = listen
        let direct = await withTaskGroup(of: (String, Result<[DirectAnswerSummary], DoctorCheckFailure>).self) {
            group in
            for link in askable {
                let source = String(link.ipv4[0].split(separator: "/")[0])
                group.addTask {
                    switch await DirectQuery.ask(from: source, type: type, wait: min(listen, 1.5)) {
                    case .success(let answers):
                        return (
                            link.name,
                            .success(
                                answers.map { DirectAnswerSummary(responder: $0.responder, instances: $0.instances) })
                        )
                    case .failure(let failure):
                        return (link.name, .failure(DoctorCheckFailure(failure.description)))
                    }
                }
            }
            var all: [String: Result<[DirectAnswerSummary], DoctorCheckFailure>] = [:]
            for await (name, result) in group { all[name] = result }
            return all
        }
        let (daemonProblem, mdnsServers) = await avahi
        let (domains, dnsServers, search, dnsServer) = await wideArea
        let sightings = mdnsServers + dnsServers

        // Probes: every announced server (once per address) and every named host, at once.
        var routes: [String: Route] = [:]
        for server in sightings {
            for record in server.records where record.port != 0 {
                let hostPort = ServerAddress.hostPort(record.address, port: record.port)
                routes[hostPort] = Route(
                    baseURL: "http://\(hostPort)", via: .lan, source: .mdns, name: server.name,
                    servicePath: record.txt.servicePath)
            }
        }
        let named = hosts
        for host in named {
            routes[host.description] = Route(
                baseURL: "http://\(host.description)", via: .lan, source: .manual, name: host.description)
        }
        let probes = await withTaskGroup(of: (String, ProbeReport).self) { group in
            if let probe {
                for (key, route) in routes where known[key] == nil { group.addTask { (key, await probe(route)) } }
            }
            var all = known
            for await (key, report) in group { all[key] = report }
            return all
        }
        let paths = RouteLookup.interfaces()
        let hostChecks = named.map { host -> HostCheck in
            let report = probes[host.description]
            guard IPSocketAddress(host.host, port: 9) != nil else {
                // A name: its path depends on what it resolves to; the probe says the rest.
                return HostCheck(
                    hostPort: host.description, address: host.host, interface: nil, onLink: false, probe: report)
            }
            switch RouteLookup.path(to: host.host, in: paths) {
            case .success(let path):
                return HostCheck(
                    hostPort: host.description, address: host.host, interface: path.interface, onLink: path.onLink,
                    probe: report)
            case .failure(let error):
                return HostCheck(
                    hostPort: host.description, address: host.host, interface: nil, onLink: false,
                    noRoute: error.reason, probe: report)
            }
        }
        let observed = DoctorObservations(
            daemonProblem: daemonProblem, interfaces: interfaces, filter: filter, sightings: sightings, direct: direct,
            domains: domains, searchDomains: search, dnsServer: dnsServer, hosts: hostChecks, probes: probes)
        return DiscoveryDoctor.diagnose(observed)
    }

    /// Everything avahi-daemon lists within `listen` seconds, on every interface; or why it
    /// cannot be asked.
    func avahiView() async -> (String?, [DiscoveredServer]) {
        let configuration = BrowseConfiguration(serviceType: serviceType, interfaces: .all)
        let seconds = listen
        do {
            return try await withThrowingTaskGroup(of: (String?, [DiscoveredServer])?.self) { group in
                let registry = RegistryBox()
                group.addTask {
                    for try await event in AvahiBrowser.events(configuration) {
                        if await registry.apply(event) { break }
                    }
                    return (nil, await registry.servers)
                }
                group.addTask {
                    try await Task.sleep(for: .seconds(seconds))
                    return nil
                }
                let first = try await group.next() ?? nil
                group.cancelAll()
                if let first { return first }
                return (nil, await registry.servers)
            }
        } catch let error as DiscoveryError {
            return (error.detail, [])
        } catch {
            return ("\(error)", [])
        }
    }

    /// The configured and announced browse domains and what each holds.
    func unicastDNSView() async -> ([DomainCheck], [DiscoveredServer], [String], String?) {
        let configuration = UnicastDNS.configuration()
        let search = configuration.searchDomains.filter { !$0.isEmpty }
        var sources: [(String, String)] = browseDomains.map { ($0, "configured") }
        if announcedDomains {
            for domain in search {
                for found in await WideAreaBrowser.announcedDomains(searchDomains: [domain]) {
                    sources.append((found, "announced under \(domain)"))
                }
            }
        }
        var seen = Set<String>()
        sources = sources.filter { seen.insert($0.0.lowercased()).inserted }
        let type = serviceType
        let browses = await withTaskGroup(of: (Int, DomainBrowse).self) { group in
            for (index, source) in sources.enumerated() {
                group.addTask { (index, await WideAreaBrowser.browse(domain: source.0, type: type)) }
            }
            var all: [(Int, DomainBrowse)] = []
            for await item in group { all.append(item) }
            return all.sorted { $0.0 < $1.0 }.map(\.1)
        }
        var checks: [DomainCheck] = []
        var registry = ServerRegistry()
        for (browse, source) in zip(browses, sources) {
            for record in browse.records {
                _ = registry.apply(.found(record.key))
                _ = registry.apply(.resolved(record))
            }
            let names = Array(Set(browse.records.map(\.key.instance.name))).sorted()
            checks.append(
                DomainCheck(
                    domain: browse.domain, source: source.1, instances: names,
                    failure: browse.failure.map { "\($0)" }, unanswered: browse.failure == .noAnswer))
        }
        return (checks, registry.servers, search, configuration.server)
    }
}

/// A registry shared by the browse task and the one that reads it when time is up.
private actor RegistryBox {
    var registry = ServerRegistry()

    /// Applies one event; `true` once the listing is complete.
    func apply(_ event: BrowseEvent) -> Bool {
        _ = registry.apply(event)
        return registry.isSettled
    }

    var servers: [DiscoveredServer] { registry.servers }
}
