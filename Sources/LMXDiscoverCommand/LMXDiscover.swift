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
        abstract: "List the Opta LMX servers on the local network (mDNS, through avahi-daemon).",
        discussion: """
            Browses _opta-lmx._tcp until avahi-daemon reports that all cached and announced \
            servers were seen and every one is resolved, or until --timeout, then prints them.
            With --watch it keeps running and prints one JSON object per change.

            With --probe every server is also probed by the LMX contract (/healthz, the \
            discovery document, /readyz) and its verdict, version, instance_id, model count \
            and latency are added.

            Exit status: 0 at least one server found, 1 none found, 64 usage error, \
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

    public func validate() throws {
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

    public func run() async throws {
        do {
            if watch {
                try await runWatch()
            } else {
                try await runOnce()
            }
        } catch let error as DiscoveryError {
            Console.error("lmx-discover: \(error)")
            throw ExitCode((error.isDaemonUnavailable ? ExitStatus.unavailable : .nothingFound).rawValue)
        }
    }

    // MARK: One-shot listing

    private func runOnce() async throws {
        let configuration = browseConfiguration
        let seconds = timeout
        let servers = try await withThrowingTaskGroup(of: [DiscoveredServer]?.self) { group in
            group.addTask {
                var registry = ServerRegistry()
                for try await event in AvahiBrowser.events(configuration) {
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
            Console.error(
                "No \(type) servers found within \(Self.format(seconds)) s. Check that servers are up, that this machine is on their network, and that UDP port 5353 is not blocked."
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
        let configuration = browseConfiguration
        let watcher = Task {
            let encoder = DiscoveryJSON.encoder()
            var registry = ServerRegistry()
            for try await event in AvahiBrowser.events(configuration) {
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
