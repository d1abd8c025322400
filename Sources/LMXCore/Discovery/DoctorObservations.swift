/// What `lmx-discover --doctor` and the agent's doctor checked: the inputs of DiscoveryDoctor.

/// What the doctor checked.
public struct DoctorObservations: Sendable, Hashable {
    /// avahi-daemon: `nil` when running, else why it could not be reached.
    public var daemonProblem: String?
    public var interfaces: [InterfaceCheck]
    /// Which interfaces the configuration lets count.
    public var filter: InterfaceFilter
    /// Every server avahi-daemon reported, on every interface (the filter not applied).
    public var sightings: [DiscoveredServer]
    /// The direct mDNS question per interface name: answers, or why it could not be asked.
    public var direct: [String: Result<[DirectAnswerSummary], DoctorCheckFailure>]
    /// Unicast DNS domains browsed (configured and announced), with what each held.
    public var domains: [DomainCheck]
    /// The search domains of this machine's DNS configuration and the name server asked.
    public var searchDomains: [String]
    public var dnsServer: String?
    /// Addresses the user named (`--host`) or the agent knows (paired, configured).
    public var hosts: [HostCheck]
    /// Probes of announced servers, by `host:port`.
    public var probes: [String: ProbeReport]

    public init(
        daemonProblem: String? = nil, interfaces: [InterfaceCheck] = [], filter: InterfaceFilter = InterfaceFilter(),
        sightings: [DiscoveredServer] = [], direct: [String: Result<[DirectAnswerSummary], DoctorCheckFailure>] = [:],
        domains: [DomainCheck] = [], searchDomains: [String] = [], dnsServer: String? = nil, hosts: [HostCheck] = [],
        probes: [String: ProbeReport] = [:]
    ) {
        self.daemonProblem = daemonProblem
        self.interfaces = interfaces
        self.filter = filter
        self.sightings = sightings
        self.direct = direct
        self.domains = domains
        self.searchDomains = searchDomains
        self.dnsServer = dnsServer
        self.hosts = hosts
        self.probes = probes
    }
}

/// A failed check, in words.
public struct DoctorCheckFailure: Error, Sendable, Hashable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// One network interface as the doctor saw it.
public struct InterfaceCheck: Sendable, Hashable {
    public var name: String
    public var up: Bool
    public var multicast: Bool
    /// IPv4 addresses with prefix length: `10.0.0.5/24`.
    public var ipv4: [String]

    public init(name: String, up: Bool, multicast: Bool, ipv4: [String]) {
        self.name = name
        self.up = up
        self.multicast = multicast
        self.ipv4 = ipv4
    }

    public var isLoopback: Bool { name == "lo" }
}

/// One host's answer to the direct mDNS question.
public struct DirectAnswerSummary: Sendable, Hashable {
    public var responder: String
    public var instances: [String]
    public init(responder: String, instances: [String]) {
        self.responder = responder
        self.instances = instances
    }
}

/// One unicast DNS domain browsed.
public struct DomainCheck: Sendable, Hashable {
    public var domain: String
    /// Where the domain came from: "configured", or the search domain that announced it.
    public var source: String
    /// Instance names the domain lists.
    public var instances: [String]
    /// Why it listed nothing: "no such name", "no DNS server answered", …
    public var failure: String?
    /// The failure was that no DNS server answered (not that the records are missing).
    public var unanswered: Bool

    public init(domain: String, source: String, instances: [String], failure: String?, unanswered: Bool = false) {
        self.domain = domain
        self.source = source
        self.instances = instances
        self.failure = failure
        self.unanswered = unanswered
    }
}

/// An address the user named, with how this machine reaches it and what a probe found.
public struct HostCheck: Sendable, Hashable {
    /// `host:port` as given.
    public var hostPort: String
    public var address: String
    /// The interface a connection leaves by, and whether the address is on its subnet.
    public var interface: String?
    public var onLink: Bool
    /// Why there is no path at all (no route).
    public var noRoute: String?
    /// What a probe found; `nil` when it was not probed (nothing is concluded from its silence).
    public var probe: ProbeReport?

    public init(
        hostPort: String, address: String, interface: String?, onLink: Bool, noRoute: String? = nil,
        probe: ProbeReport?
    ) {
        self.hostPort = hostPort
        self.address = address
        self.interface = interface
        self.onLink = onLink
        self.noRoute = noRoute
        self.probe = probe
    }
}
