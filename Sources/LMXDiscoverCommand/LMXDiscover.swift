import ArgumentParser
import Dispatch
import LMXCore
import LMXDiscovery
import LMXProbe
import LMXSystem

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

public struct LMXDiscover: AsyncParsableCommand {
    public init() {}

    public static let configuration = CommandConfiguration(
        commandName: "lmx-discover",
        abstract:
            "List the Opta LMX servers on the local network (mDNS, through avahi-daemon) or in a DNS domain; say why none is found.",
        discussion: """
            Browses _opta-lmx._tcp until avahi-daemon reports that all cached and announced \
            servers were seen and every one is resolved, or until --timeout, then prints them.
            With --watch it keeps running and prints one JSON object per change.

            With --probe every server is also probed by the LMX contract (/healthz, the \
            discovery document, /readyz) and its verdict, version, instance_id, model count \
            and latency are added.

            With -d DOMAIN (not `local`) the servers listed in that unicast DNS domain are read \
            through this machine's name servers (wide-area DNS-SD, RFC 6763): PTR, SRV, TXT and \
            address records, as a site's DNS server holds them for servers on other subnets.

            --host ADDR[:PORT] asks one address by the LMX contract and shows what the server \
            says about itself (port 1234 when none is given): for a server nothing announces.

            --doctor checks why no server is found: avahi-daemon, every interface (a direct mDNS \
            question on it, whether the configuration leaves it out), the browse domains \
            (configured with -d, and those the network announces under the search domains), \
            the servers seen and the addresses named with --host; it prints each cause found, in \
            words, with the next step (--json: one object with stable cause codes).

            Exit status: 0 at least one server found (--doctor: a usable one), 1 none found, \
            2 (--doctor) none usable and the cause is named, 64 usage error, \
            69 avahi-daemon unreachable.
            """
    )

    @Flag(name: .long, help: "Print one JSON array of servers.")
    var json = false

    @Flag(
        name: [.customShort("p"), .long],
        help: "Print avahi-browse -rtp resolved lines (=;iface;proto;name;type;domain;host;address;port;txt).")
    var parsable = false

    // avahi-browse habits: `lmx-discover -rt`, `-art`, `-rtp` work as typed.
    @Flag(name: .customShort("r"), help: "Resolve (always done; accepted as in avahi-browse).")
    var resolve = false

    @Flag(
        name: .customShort("t"),
        help: "Exit after the listing (the default without --watch; accepted as in avahi-browse).")
    var terminate = false

    @Flag(
        name: .customShort("a"), help: "All services (lmx-discover browses its one type; accepted as in avahi-browse).")
    var allServices = false

    @Flag(
        name: .long,
        help: "Keep running; print one JSON object per event (added, updated, removed, daemon) until SIGINT or SIGTERM."
    )
    var watch = false

    @Option(name: .long, help: ArgumentHelp("Seconds to wait for a complete listing.", valueName: "seconds"))
    var timeout: Double = 3

    @Option(
        name: [.customShort("i"), .long],
        help: ArgumentHelp("Only use this interface (repeatable; globs like 'en*').", valueName: "name"))
    var interface: [String] = []

    @Option(name: .long, help: ArgumentHelp("Leave out this interface (repeatable; globs).", valueName: "name"))
    var excludeInterface: [String] = []

    @Flag(
        name: .long,
        help:
            "Also use container, VM and VPN interfaces (docker*, veth*, br-*, virbr*, tun*, tap*), left out by default."
    )
    var allInterfaces = false

    @Flag(name: .customShort("4"), help: "IPv4 only.")
    var ipv4Only = false

    @Flag(name: .customShort("6"), help: "IPv6 only.")
    var ipv6Only = false

    @Flag(
        name: .long,
        help: "Probe every server by the LMX contract and add verdict, version, instance_id, models and latency.")
    var probe = false

    @Option(name: .customLong("probe-timeout"), help: ArgumentHelp("Per-request probe timeout.", valueName: "seconds"))
    var probeTimeout: Double = 1.5

    @Option(name: .long, help: ArgumentHelp("The DNS-SD service type.", valueName: "type"))
    var type: String = BrowseConfiguration.defaultServiceType

    @Option(
        name: [.customShort("d"), .long], help: ArgumentHelp("The browse domain (default: local).", valueName: "domain")
    )
    var domain: String?

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Ask this address by the LMX contract and show what the server says (repeatable; port 1234 when none).",
            valueName: "addr[:port]"))
    var host: [String] = []

    @Flag(name: .long, help: "Check why no server is found and say what to do; with --host, also ask those addresses.")
    var doctor = false

    public func validate() throws {
        if doctor && (watch || parsable || probe) {
            throw ValidationError("--doctor runs its own checks: --watch, --parsable and --probe do not apply to it.")
        }
        if !host.isEmpty && !doctor && (watch || parsable || probe) {
            throw ValidationError(
                "--host asks the addresses given: --watch, --parsable and --probe do not apply to it.")
        }
        for text in host {
            do { _ = try HostPort.parse(text, field: "--host", defaultPort: HostPort.defaultPort) } catch {
                throw ValidationError("\(error)")
            }
        }
        if json && parsable { throw ValidationError("--json and --parsable are different formats: choose one.") }
        if watch && parsable { throw ValidationError("--watch prints JSON lines; --parsable does not apply to it.") }
        if watch && terminate { throw ValidationError("-t (exit after the listing) and --watch exclude each other.") }
        if probe && (watch || parsable) {
            throw ValidationError("--probe applies to the table and --json listings only.")
        }
        guard probeTimeout.isFinite, probeTimeout > 0, probeTimeout <= 120 else {
            throw ValidationError("--probe-timeout must be between 0 and 120 seconds (got \(probeTimeout)).")
        }
        if ipv4Only && ipv6Only { throw ValidationError("-4 and -6 exclude each other: give at most one.") }
        guard timeout.isFinite, timeout > 0, timeout <= 3600 else {
            throw ValidationError("--timeout must be between 0 and 3600 seconds (got \(timeout)).")
        }
        let parts = type.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count >= 2, parts.allSatisfy({ $0.hasPrefix("_") && $0.count > 1 }),
            parts.last == "_tcp" || parts.last == "_udp"
        else {
            throw ValidationError("--type '\(type)' is not a DNS-SD service type such as _opta-lmx._tcp.")
        }
    }

    var browseConfiguration: BrowseConfiguration {
        let filter = InterfaceFilter(
            include: interface, exclude: excludeInterface, excludesVirtualInterfaces: !allInterfaces)
        return BrowseConfiguration(
            serviceType: type, domain: domain,
            ipProtocol: ipv4Only ? .ipv4 : (ipv6Only ? .ipv6 : nil),
            interfaces: filter, waitForDaemon: watch)
    }

    var hosts: [HostPort] {
        host.compactMap { try? HostPort.parse($0, field: "--host", defaultPort: HostPort.defaultPort) }
    }

    /// A unicast DNS domain (wide-area DNS-SD) rather than mDNS's `local`.
    var unicastDomain: String? {
        guard let domain, !domain.isEmpty else { return nil }
        let trimmed = domain.hasSuffix(".") ? String(domain.dropLast()) : domain
        return trimmed.lowercased() == "local" ? nil : trimmed
    }

    public func run() async throws {
        do {
            if doctor {
                try await runDoctor()
            } else if !host.isEmpty {
                try await runHosts()
            } else if watch {
                try await runWatch()
            } else {
                try await runOnce()
            }
        } catch let error as DiscoveryError {
            Console.error("lmx-discover: \(error)")
            throw ExitCode((error.isDaemonUnavailable ? ExitStatus.unavailable : .nothingFound).rawValue)
        }
    }

    // MARK: Doctor and first contact

    private func runDoctor() async throws {
        let filter = InterfaceFilter(
            include: interface, exclude: excludeInterface, excludesVirtualInterfaces: !allInterfaces)
        let checks = DoctorChecks(
            filter: filter, browseDomains: unicastDomain.map { [$0] } ?? [], hosts: hosts, serviceType: type,
            listen: min(timeout, 2))
        // A connection attempt gives up with the probe (a filtered port would otherwise hold the
        // client's shutdown until the connect timeout).
        let prober = try Prober(quickConnectTimeout: probeTimeout)
        let seconds = probeTimeout
        let report = await checks.run { route in await prober.probe(route, timeout: seconds, connectTimeout: 0) }
        await prober.shutdown()
        if json {
            let data = try DiscoveryJSON.encoder(pretty: true).encode(report)
            Console.out(String(decoding: data, as: UTF8.self))
        } else {
            Console.out(report.text)
        }
        throw ExitCode(report.exitStatus.rawValue)
    }

    private func runHosts() async throws {
        let prober = try Prober(quickConnectTimeout: probeTimeout)
        let seconds = probeTimeout
        let answers = await withTaskGroup(of: (Int, HostAnswer).self) { group in
            for (index, address) in hosts.enumerated() {
                group.addTask {
                    let route = Route(
                        baseURL: "http://\(address.description)", via: .lan, source: .manual, name: address.description)
                    return (
                        index,
                        HostAnswer(
                            address: address, report: await prober.probe(route, timeout: seconds, connectTimeout: 0))
                    )
                }
            }
            var all: [(Int, HostAnswer)] = []
            for await answer in group { all.append(answer) }
            return all.sorted { $0.0 < $1.0 }.map(\.1)
        }
        await prober.shutdown()
        if json {
            let data = try DiscoveryJSON.encoder(pretty: true).encode(answers)
            Console.out(String(decoding: data, as: UTF8.self))
        } else {
            Console.out(answers.map(\.text).joined(separator: "\n\n"))
        }
        if !answers.contains(where: \.isServer) { throw ExitCode(ExitStatus.nothingFound.rawValue) }
    }

    /// The browse events of the domain asked for: avahi-daemon's for `local`, unicast DNS for others.
    private func browseEvents() -> AsyncThrowingStream<BrowseEvent, any Error> {
        guard let unicastDomain else { return AvahiBrowser.events(browseConfiguration) }
        let events = WideAreaBrowser.events(domains: [unicastDomain], announced: false, type: type)
        return AsyncThrowingStream { continuation in
            let task = Task {
                for await event in events { continuation.yield(event) }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    // MARK: One-shot listing

    private func runOnce() async throws {
        let seconds = timeout
        let events = browseEvents()
        let servers = try await withThrowingTaskGroup(of: [DiscoveredServer]?.self) { group in
            group.addTask {
                var registry = ServerRegistry()
                for try await event in events {
                    _ = registry.apply(event)
                    if registry.isSettled { return registry.servers }
                }
                return registry.servers  // timed out: what was resolved so far
            }
            group.addTask {
                try await Task.sleep(for: .seconds(seconds))
                return nil
            }
            let first = try await group.next() ?? nil
            group.cancelAll()
            if let first { return first }
            return (try await group.next() ?? nil) ?? []
        }

        let probes = probe ? await Self.probeAll(servers, timeout: probeTimeout) : nil
        if json {
            let entries = servers.map { server -> ServerJSON in
                var entry = ServerJSON(server)
                if let report = probes?[server.id], let route = Route.lan(for: server) {
                    entry.probe = ServerJSON.ProbeJSON(url: route.baseURL, report: report)
                }
                return entry
            }
            let data = try DiscoveryJSON.encoder(pretty: true).encode(entries)
            Console.out(String(decoding: data, as: UTF8.self))
        } else if parsable {
            for server in servers { for line in ParsableFormat.lines(for: server) { Console.out(line) } }
        } else if servers.isEmpty {
            let place = unicastDomain.map { "in the DNS domain \($0)" } ?? "by mDNS"
            Console.error(
                "No \(type) servers found \(place) within \(Self.format(seconds)) s. `lmx-discover --doctor` checks why (add --host ADDR:PORT if you know a server's address)."
            )
        } else {
            Console.out(ServerTable.render(servers, probes: probes))
        }
        if servers.isEmpty { throw ExitCode(ExitStatus.nothingFound.rawValue) }
    }

    /// Probes every server at once through one pooled client.
    private static func probeAll(_ servers: [DiscoveredServer], timeout: Double) async -> [ServiceInstanceID:
        ProbeReport]
    {
        guard let prober = try? Prober() else { return [:] }
        let reports = await withTaskGroup(of: (ServiceInstanceID, ProbeReport)?.self) { group in
            for server in servers {
                guard let route = Route.lan(for: server) else { continue }
                group.addTask { (server.id, await prober.probe(route, timeout: timeout)) }
            }
            var reports: [ServiceInstanceID: ProbeReport] = [:]
            for await case (let id, let report)? in group { reports[id] = report }
            return reports
        }
        await prober.shutdown()
        return reports
    }

    private static func format(_ seconds: Double) -> String {
        seconds == seconds.rounded() ? String(Int(seconds)) : String(seconds)
    }

    // MARK: Watch

    private func runWatch() async throws {
        let events = browseEvents()
        let watcher = Task {
            let encoder = DiscoveryJSON.encoder()
            var registry = ServerRegistry()
            for try await event in events {
                for change in registry.apply(event) {
                    if case .daemon(.waiting(let reason)) = change {
                        Console.error(
                            "lmx-discover: waiting for avahi-daemon (\(reason)); start it with `systemctl start avahi-daemon`"
                        )
                    }
                    let line = DiscoveryEventJSON(change, time: Timestamp.iso8601(Date.now))
                    Console.out(String(decoding: try encoder.encode(line), as: UTF8.self))
                }
            }
        }
        let signals = StopSignals { watcher.cancel() }
        defer { signals.cancel() }
        try await watcher.value
    }
}
