/// Why no Opta LMX server is found, worked out from what was checked: avahi-daemon's view,
/// a direct mDNS question on each interface, unicast DNS domains, and probes of the servers seen
/// and of addresses the user named. Pure: the checks come in as ``DoctorObservations``, the
/// findings go out as a ``DoctorReport`` (`lmx-discover --doctor`, `lmx-status`, the dashboard).
public enum DiscoveryDoctor {
    public static func diagnose(_ observed: DoctorObservations) -> DoctorReport {
        var work = Work(observed: observed)
        work.run()
        return work.report
    }
}

/// The cause a finding names; the raw values are stable codes for scripts (`--json`).
public enum DoctorCause: String, Sendable, Hashable, Codable, CaseIterable {
    case daemonNotRunning = "daemon-not-running"
    case mdnsBlockedHere = "mdns-blocked-here"
    case announcementsFiltered = "announcements-filtered"
    case clientIsolation = "client-isolation"
    case otherSubnet = "other-subnet"
    case notInBrowseDomain = "not-in-browse-domain"
    case dnsUnanswered = "dns-unanswered"
    case interfaceExcluded = "interface-excluded"
    case portRefused = "port-refused"
    case portFiltered = "port-filtered"
    case serverUnreachable = "server-unreachable"
    case noMulticast = "no-multicast"
    case nothingAnnounced = "nothing-announced"
}

/// One conclusion: the cause in words and what to do next.
public struct DoctorFinding: Sendable, Hashable, Codable {
    public var cause: DoctorCause
    /// The interface it concerns, if one.
    public var interface: String?
    /// The server (instance name or `host:port`) it concerns, if one.
    public var server: String?
    public var says: String
    public var next: String

    public init(cause: DoctorCause, interface: String? = nil, server: String? = nil, says: String, next: String) {
        self.cause = cause
        self.interface = interface
        self.server = server
        self.says = says
        self.next = next
    }
}

/// What the doctor found: usable servers, per interface what was checked, and the findings.
public struct DoctorReport: Sendable, Hashable, Encodable {
    public struct Usable: Sendable, Hashable, Codable {
        public var name: String
        public var url: String
        /// "mDNS on eth0", "DNS domain example.lan", "the address given".
        public var foundBy: String

        enum CodingKeys: String, CodingKey {
            case name, url
            case foundBy = "found_by"
        }
    }

    public struct InterfaceReport: Sendable, Hashable, Codable {
        public var name: String
        public var checked: [String]
    }

    public var usable: [Usable] = []
    public var interfaces: [InterfaceReport] = []
    /// What was checked beyond the interfaces: avahi-daemon, DNS domains, named hosts.
    public var checked: [String] = []
    public var findings: [DoctorFinding] = []

    public init() {}

    enum CodingKeys: String, CodingKey {
        case usable, interfaces, checked, findings
        case exitStatus = "exit_status"
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(usable, forKey: .usable)
        try container.encode(interfaces, forKey: .interfaces)
        try container.encode(checked, forKey: .checked)
        try container.encode(findings, forKey: .findings)
        try container.encode(exitStatus.rawValue, forKey: .exitStatus)
    }

    /// The exit status of `lmx-discover --doctor`: 0 a usable server, 69 avahi-daemon
    /// unreachable, 2 a cause found, 1 nothing found and no cause seen.
    public var exitStatus: ExitStatus {
        if !usable.isEmpty { return .success }
        if findings.contains(where: { $0.cause == .daemonNotRunning }) { return .unavailable }
        if findings.contains(where: { $0.cause != .nothingAnnounced }) { return .causeFound }
        return .nothingFound
    }

    /// The report for people: findings first, then what was checked.
    public var text: String {
        var lines: [String] = []
        if usable.isEmpty {
            lines.append("No usable Opta LMX server found.")
        } else {
            for server in usable {
                lines.append("Usable: \(server.name) at \(server.url) (found by \(server.foundBy))")
            }
        }
        for finding in findings {
            let scope = [finding.interface.map { "on \($0)" }, finding.server].compactMap { $0 }.joined(separator: ", ")
            lines.append("")
            lines.append("* \(finding.cause.rawValue)\(scope.isEmpty ? "" : " (\(scope))"): \(finding.says)")
            lines.append("  Next: \(finding.next)")
        }
        lines.append("")
        lines.append("Checked:")
        for line in checked { lines.append("  \(line)") }
        for interface in interfaces {
            lines.append("  \(interface.name): \(interface.checked.joined(separator: "; "))")
        }
        return lines.joined(separator: "\n")
    }
}

// MARK: - The reasoning

private struct Work {
    let observed: DoctorObservations
    var report = DoctorReport()
    /// `host:port` of servers already explained or usable, and hosts that answered the direct
    /// question, so a named host is not explained twice.
    var explained = Set<String>()
    var responders = Set<String>()

    init(observed: DoctorObservations) { self.observed = observed }

    mutating func run() {
        checkDaemon()
        for interface in observed.interfaces { checkInterface(interface) }
        checkDomains()
        checkUnicastDNSServers()
        for host in observed.hosts { checkHost(host) }
        if report.usable.isEmpty && report.findings.isEmpty { nothingAtAll() }
    }

    // avahi-daemon

    mutating func checkDaemon() {
        guard let problem = observed.daemonProblem else {
            report.checked.append("avahi-daemon: running; it lists \(observed.sightings.count) server(s) in all")
            return
        }
        report.checked.append("avahi-daemon: not reachable (\(problem))")
        let answering = observed.direct.values.compactMap { try? $0.get() }.flatMap { $0 }.flatMap(\.instances)
        let evidence =
            answering.isEmpty
            ? "" : " Servers do answer on the network (\(list(answering))), so announcements are there to hear."
        report.findings.append(
            DoctorFinding(
                cause: .daemonNotRunning,
                says:
                    "avahi-daemon is not running (\(problem)): nothing on this machine hears mDNS announcements.\(evidence)",
                next:
                    "start it: `sudo systemctl enable --now avahi-daemon` (it needs the system D-Bus: `systemctl status dbus`); without systemd: `dbus-daemon --system --fork` then `avahi-daemon -D`."
            ))
    }

    // One interface

    mutating func checkInterface(_ interface: InterfaceCheck) {
        var checked: [String] = []
        let name = interface.name
        let avahiHere = observed.sightings.filter { $0.records.contains { $0.key.interface.name == name } }
        let directHere = (try? observed.direct[name]?.get()) ?? []
        let directInstances = directHere.flatMap(\.instances)
        checked.append(interface.up ? "up" : "down")
        checked.append(interface.ipv4.isEmpty ? "no IPv4 address" : interface.ipv4.joined(separator: ", "))
        if !interface.isLoopback { checked.append(interface.multicast ? "multicast on" : "no multicast") }

        if !observed.filter.allows(name) {
            checked.append("left out by the configuration")
            let servers = unique(avahiHere.map(\.name) + directInstances)
            if !servers.isEmpty {
                let why =
                    InterfaceFilter.defaultExclusions.contains { Glob.matches($0, name) }
                        && observed.filter.include.isEmpty
                    ? "container, VM and VPN links (\(InterfaceFilter.defaultExclusions.joined(separator: ", "))) are left out by default"
                    : "the configuration's interface list leaves it out"
                report.findings.append(
                    DoctorFinding(
                        cause: .interfaceExcluded, interface: name, server: list(servers),
                        says: "\(list(servers)) announced on \(name), which is not used: \(why).",
                        next:
                            "if servers are really reached over \(name), name it: `lmx-discover --interface \(name)` (or --all-interfaces), and in the agent's configuration `\"interfaces\": [\"\(name)\", …]`."
                    ))
            }
            report.interfaces.append(.init(name: name, checked: checked))
            return
        }
        checked.append(
            observed.daemonProblem == nil
                ? "avahi-daemon lists \(avahiHere.count) server(s) here" : "avahi-daemon not asked (not running)")
        switch observed.direct[name] {
        case .success(let answers):
            checked.append(
                "direct mDNS question (224.0.0.251:5353): "
                    + (answers.isEmpty
                        ? "no answer"
                        : answers.map { "\($0.responder) lists \(list($0.instances))" }.joined(separator: ", ")))
        case .failure(let failure):
            checked.append("direct mDNS question not sent: \(failure.description)")
        case nil:
            if !interface.isLoopback {
                checked.append("direct mDNS question not sent (no IPv4 address or no multicast)")
            }
        }
        if !interface.isLoopback && interface.up && !interface.multicast && !interface.ipv4.isEmpty {
            report.findings.append(
                DoctorFinding(
                    cause: .noMulticast, interface: name,
                    says: "\(name) does not do multicast (no MULTICAST flag): mDNS cannot work over it.",
                    next:
                        "use another interface for the LAN, or `sudo ip link set \(name) multicast on` if it is a LAN link; servers reached over it need a browse domain or their address (`lmx-discover --host ADDR:PORT`)."
                ))
        }

        // Servers avahi-daemon lists here: are they usable?
        for server in avahiHere {
            let records = server.records.filter { $0.key.interface.name == name }
            guard let record = records.first(where: { $0.key.ipProtocol == .ipv4 }) ?? records.first else { continue }
            checkAnnounced(server, record: record, foundBy: "mDNS on \(name)", interface: name)
        }

        // Servers that answer a direct question but that avahi-daemon does not list.
        if observed.daemonProblem == nil {
            let heard = Set(avahiHere.map { $0.name.lowercased() })
            let missing = unique(directInstances.filter { !heard.contains($0.lowercased()) })
            if !missing.isEmpty {
                let from = list(directHere.filter { !$0.instances.isEmpty }.map(\.responder))
                for answer in directHere { responders.insert(answer.responder) }
                report.findings.append(
                    DoctorFinding(
                        cause: .mdnsBlockedHere, interface: name, server: list(missing),
                        says:
                            "\(list(missing)) answer(s) a direct mDNS question on \(name) (from \(from)), but avahi-daemon hears no announcement of it: UDP port 5353 coming in is dropped on this machine (its firewall), or avahi-daemon does not use \(name) (allow-interfaces / deny-interfaces in avahi-daemon.conf).",
                        next:
                            "let mDNS in: `sudo nft add rule inet filter input udp dport 5353 accept` (or `sudo ufw allow 5353/udp`, `sudo firewall-cmd --add-service=mdns --permanent && sudo firewall-cmd --reload`); check `allow-interfaces` in /etc/avahi/avahi-daemon.conf."
                    ))
            }
        }
        report.interfaces.append(.init(name: name, checked: checked))
    }

    /// An announced server: usable, or why not.
    mutating func checkAnnounced(
        _ server: DiscoveredServer, record: ResolvedRecord, foundBy: String, interface: String?
    ) {
        let hostPort = ServerAddress.hostPort(record.address, port: record.port)
        explained.insert(hostPort)
        guard let probe = observed.probes[hostPort] else { return }
        let printable = ServerTable.printable(server.name)
        if probe.verdict.isAlive || probe.verdict == .authRejected {
            if !report.usable.contains(where: { $0.url == "http://\(hostPort)" }) {
                report.usable.append(.init(name: printable, url: "http://\(hostPort)", foundBy: foundBy))
            }
            return
        }
        let detail = probe.detail ?? probe.verdict.rawValue
        switch Self.failureKind(probe) {
        case .refused:
            report.findings.append(
                DoctorFinding(
                    cause: .portRefused, interface: interface, server: printable,
                    says:
                        "\(printable) is announced (\(foundBy)) at \(hostPort), but nothing accepts connections on that port: the server is not running there, or it announces a port it does not listen on.",
                    next:
                        "start the server, or check the port it listens on against the one it announces (`lmx-discover --host \(record.address):PORT` asks another port)."
                ))
        case .silent:
            report.findings.append(
                DoctorFinding(
                    cause: .portFiltered, interface: interface, server: printable,
                    says:
                        "\(printable) is announced (\(foundBy)) at \(hostPort), but connections to that port get no answer (\(detail)): a firewall on the server or on the way drops TCP port \(record.port) while mDNS gets through.",
                    next:
                        "allow TCP port \(record.port) in on the server (e.g. `sudo ufw allow \(record.port)/tcp`, or the macOS firewall's setting for the server's app)."
                ))
        case .other:
            report.findings.append(
                DoctorFinding(
                    cause: .serverUnreachable, interface: interface, server: printable,
                    says: "\(printable) is announced (\(foundBy)) at \(hostPort), but the probe failed: \(detail).",
                    next: "`lmx-discover --host \(hostPort)` shows what answers there."))
        }
    }

    enum FailureKind { case refused, silent, other }

    static func failureKind(_ probe: ProbeReport) -> FailureKind {
        let detail = probe.detail ?? ""
        if detail.contains("refused") { return .refused }
        if detail.contains("timed out") || detail.contains("unreachable") || detail.contains("did not answer") {
            return .silent
        }
        return .other
    }

    // Unicast DNS

    mutating func checkDomains() {
        let server = observed.dnsServer.map { " (name server \($0))" } ?? ""
        if observed.domains.isEmpty {
            let search = observed.searchDomains.isEmpty ? "none" : observed.searchDomains.joined(separator: ", ")
            report.checked.append(
                "DNS-SD browse domains: none configured (browse_domains), none announced under the search domains (\(search))\(server)"
            )
        }
        for domain in observed.domains {
            let held =
                domain.failure.map { "nothing (\($0))" }
                ?? "\(domain.instances.count) server(s): \(list(domain.instances))"
            report.checked.append("DNS domain \(domain.domain) (\(domain.source))\(server): \(held)")
            if domain.unanswered {
                report.findings.append(
                    DoctorFinding(
                        cause: .dnsUnanswered, server: domain.domain,
                        says:
                            "no DNS server answered for the browse domain \(domain.domain)\(server): servers listed there cannot be found.",
                        next:
                            "check the name servers in /etc/resolv.conf (`resolvectl status`), and that the network reaches them."
                    ))
            }
        }
    }

    /// Servers read from unicast DNS: usable, or why not.
    mutating func checkUnicastDNSServers() {
        for server in observed.sightings where server.isFromUnicastDNS {
            guard let record = server.records.first(where: { $0.key.ipProtocol == .ipv4 }) ?? server.records.first
            else {
                continue
            }
            checkAnnounced(server, record: record, foundBy: server.foundBy, interface: nil)
        }
    }

    // Named hosts

    mutating func checkHost(_ host: HostCheck) {
        let alive = host.probe.map { $0.verdict.isAlive || $0.verdict == .authRejected } ?? false
        let via = host.interface.map { host.onLink ? "on \($0)'s subnet" : "routed via \($0)" } ?? "no route"
        let probed =
            host.probe.map { "probe: \($0.verdict.rawValue)\($0.detail.map { " (\($0))" } ?? "")" } ?? "not probed"
        report.checked.append("\(host.hostPort): \(via); \(probed)")
        if alive, !report.usable.contains(where: { $0.url.hasSuffix("//\(host.hostPort)") }) {
            report.usable.append(
                .init(name: host.hostPort, url: "http://\(host.hostPort)", foundBy: "the address given"))
        }
        guard !explained.contains(host.hostPort), !responders.contains(host.address) else { return }
        if let noRoute = host.noRoute {
            report.findings.append(
                DoctorFinding(
                    cause: .serverUnreachable, server: host.hostPort,
                    says: "this machine has no route to \(host.address) (\(noRoute)).",
                    next: "join the server's network (or VPN), or reach it through its tunnel (pair its QR code)."))
            return
        }
        guard let interface = host.interface else { return }
        if host.onLink {
            // The interface finding says it; and an unprobed address proves nothing by its silence.
            guard observed.filter.allows(interface), let probe = host.probe else { return }
            if alive {
                report.findings.append(
                    DoctorFinding(
                        cause: .announcementsFiltered, interface: interface, server: host.hostPort,
                        says:
                            "the server at \(host.hostPort) answers HTTP on \(interface), but no announcement of it arrives here, neither through avahi-daemon nor to a direct mDNS question: the network between you drops multicast (an access point or switch filtering mDNS, IGMP snooping without a querier).",
                        next:
                            "let mDNS through on the access point or switch (turn off multicast filtering or 'multicast to unicast' conversion, enable mDNS/Bonjour forwarding); meanwhile pair it by address: `lmx-pair --host \(host.hostPort)`."
                    ))
            } else if Self.failureKind(probe) == .refused {
                report.findings.append(
                    DoctorFinding(
                        cause: .portRefused, interface: interface, server: host.hostPort,
                        says:
                            "\(host.address) is reachable on \(interface), but nothing accepts connections on port \(host.hostPort.split(separator: ":").last ?? ""): the server is not running there.",
                        next: "start the server, or check its port."))
            } else {
                report.findings.append(
                    DoctorFinding(
                        cause: .clientIsolation, interface: interface, server: host.hostPort,
                        says:
                            "\(host.address) is on \(interface)'s subnet but does not answer at all (\(probe.detail ?? "no answer")) and announces nothing here: the network keeps its clients apart (Wi-Fi client isolation, 'AP isolation', guest networks), or the server is off.",
                        next:
                            "connect this machine and the server to a network without client isolation (or turn it off on the access point); or reach the server through its tunnel (pair its QR code)."
                    ))
            }
            return
        }
        // On another subnet: mDNS does not cross the router.
        let domains = observed.domains.map(\.domain)
        let fromDNS = observed.sightings.contains { $0.isFromUnicastDNS && $0.addresses.contains(host.address) }
        if fromDNS { return }
        if domains.isEmpty {
            report.findings.append(
                DoctorFinding(
                    cause: .otherSubnet, interface: interface, server: host.hostPort,
                    says:
                        "\(host.address) is on another subnet (routed via \(interface)): mDNS announcements do not cross routers, and no DNS-SD browse domain is set up to find it\(alive || host.probe == nil ? "" : "; it does not answer either (\(host.probe?.detail ?? "no answer"))").",
                    next:
                        "list the server in your site's DNS and browse that domain (`lmx-discover -d DOMAIN`, `\"browse_domains\"` in the agent's configuration; see docs/wide-area-discovery.md), or pair it by address: `lmx-pair --host \(host.hostPort)`."
                ))
        } else {
            report.findings.append(
                DoctorFinding(
                    cause: .notInBrowseDomain, interface: interface, server: host.hostPort,
                    says:
                        "\(host.address) is on another subnet (routed via \(interface)), and the browse domain(s) \(list(domains)) do not list a server at that address.",
                    next:
                        "add the server's PTR, SRV, TXT and A records to the zone (docs/wide-area-discovery.md), or pair it by address: `lmx-pair --host \(host.hostPort)`."
                ))
        }
    }

    mutating func nothingAtAll() {
        let asked = observed.interfaces.filter { observed.filter.allows($0.name) && !$0.isLoopback }.map(\.name)
        report.findings.append(
            DoctorFinding(
                cause: .nothingAnnounced,
                says:
                    "no Opta LMX server announces itself here (asked avahi-daemon\(asked.isEmpty ? "" : " and the link directly on \(list(asked))")\(observed.domains.isEmpty ? "" : " and the DNS domains \(list(observed.domains.map(\.domain)))")).",
                next:
                    "check that the server runs and announces itself; if you know its address: `lmx-discover --doctor --host ADDR:PORT` (that tells why it is not found) or `lmx-pair --host ADDR:PORT`."
            ))
    }

    // Helpers

    func unique(_ values: [String]) -> [String] {
        var seen = Set<String>()
        return values.filter { seen.insert($0.lowercased()).inserted }
    }

    func list(_ values: [String]) -> String {
        unique(values).map { ServerTable.printable($0) }.joined(separator: ", ")
    }
}
