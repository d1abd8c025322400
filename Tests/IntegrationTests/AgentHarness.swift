import Foundation
import LMXCore
import LMXStatusClient
import LMXSystem
import Synchronization
import Testing

/// A real `lmx-agentd` process with its own socket, database and config in a temporary directory.
final class AgentProcess: Sendable {
    let directory: String
    let socket: String
    let database: String
    let configPath: String
    let process: LiveProcess

    var client: StatusClient { StatusClient(socketPath: socket, timeout: 5) }

    /// A memory figure of the agent's process from /proc/PID/status (`VmRSS`, `RssAnon`…), KiB;
    /// -1 when it cannot be read.
    func memoryKiB(_ field: String = "VmRSS") -> Int {
        guard case let pid = process.pid, pid > 0,
            let bytes = try? FileSystem.read("/proc/\(pid)/status", limit: 64 * 1024)
        else { return -1 }
        return HeapMemory.statusField(field, in: bytes) ?? -1
    }

    private init(directory: String, process: LiveProcess) {
        self.directory = directory
        self.socket = directory + "/agent.sock"
        self.database = directory + "/state/agent.db"
        self.configPath = directory + "/agent.json"
        self.process = process
    }

    /// A fresh directory for an agent's files.
    static func makeDirectory() -> String {
        let path = "/tmp/lmx-agent-test-\(TestBed.tag())"
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    /// Starts the daemon and waits until its socket answers.
    /// - Parameters:
    ///   - config: the JSON config file's content (`nil`: no file).
    ///   - directory: reuse a directory (a restart keeps the database).
    ///   - host: run it in a namespace host (its avahi-daemon and bus); its files stay here.
    static func start(
        _ bed: TestBed, config: String? = nil, arguments: [String] = [], directory: String? = nil,
        environment: [String: String] = [:], waitForSocket: Bool = true, host: TestBed.Host = .root
    ) async throws -> AgentProcess {
        let dir = directory ?? makeDirectory()
        if let config {
            try config.write(toFile: dir + "/agent.json", atomically: true, encoding: .utf8)
        }
        // LOCALDOMAIN empty: no search domains, so the agent asks no DNS server for the browse
        // domains a network announces (the machine's own resolvers are never asked in tests).
        var env = ["DBUS_SYSTEM_BUS_ADDRESS": bed.bus(host), "LMX_SOCKET": "", "LMX_DB": "", "LOCALDOMAIN": ""]
        env.merge(environment) { $1 }
        let binary = "\(TestBed.binDir)/lmx-agentd"
        let process = LiveProcess(
            host == .root ? binary : "/usr/sbin/ip",
            (host == .root ? [] : ["netns", "exec", bed["LMX_TESTBED_\(host.rawValue.uppercased())_NS"], binary])
                + [
                    "--socket", dir + "/agent.sock", "--db", dir + "/state/agent.db", "--config", dir + "/agent.json",
                    "--log-level", "debug",
                ]
                // Many agents run at once in the tests: only those that test the gateway take a port.
                + (arguments.contains { $0.hasPrefix("--gateway") || $0 == "--no-gateway" }
                    ? [] : ["--gateway", "off"])
                // The discovery checks ask the link directly only where a test says (never eth0).
                + (arguments.contains("--doctor-interface") ? [] : ["--doctor-interface", "lo"])
                + arguments,
            environment: env)
        let agent = AgentProcess(directory: dir, process: process)
        Resources.current?.keep(agent)
        if config == nil { try "".write(toFile: dir + "/agent.json", atomically: true, encoding: .utf8) }
        try await process.start()
        if waitForSocket {
            guard await process.waitFor(timeout: 10, { _ in agent.isServing }) else {
                await process.stop()
                throw TestBedMissing(detail: "lmx-agentd did not serve its socket: \(process.stderr)")
            }
        }
        return agent
    }

    /// Imports a pairing link through `lmx-pair` (a file, as a QR code's text would be saved),
    /// into this agent over its socket.
    func pair(_ link: String) async throws -> CommandResult {
        let file = directory + "/pairing.txt"
        try link.write(toFile: file, atomically: true, encoding: .utf8)
        return try await Command.run(
            "\(TestBed.binDir)/lmx-pair", [file, "--socket", socket, "--db", database],
            environment: ["LMX_SOCKET": "", "LMX_DB": ""])
    }

    var isServing: Bool { (try? client.request("GET", "/v1/status").status) == 200 }

    func status() throws -> StatusAPI.Status {
        let response = try client.request("GET", "/v1/status")
        return try JSONDecoder().decode(StatusAPI.Status.self, from: Data(response.body))
    }

    func active() -> StatusAPI.Active? {
        guard let response = try? client.request("GET", "/v1/active"), response.status == 200 else { return nil }
        return try? JSONDecoder().decode(StatusAPI.Active.self, from: Data(response.body))
    }

    /// Polls `/v1/active` every 20 ms until `predicate` holds; returns the seconds it took, or nil.
    func waitForActive(timeout: Double, _ predicate: (StatusAPI.Active?) -> Bool) async -> Double? {
        let start = ContinuousClock.now
        let deadline = start + .milliseconds(Int(timeout * 1000))
        while ContinuousClock.now < deadline {
            if predicate(active()) { return (ContinuousClock.now - start).seconds }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return nil
    }

    /// `endpoint.env` once it contains `text` (it is written off the manager, just after the
    /// status changes), or as it is after `timeout`.
    func endpointFile(containing text: String, timeout: Double = 2) async -> String {
        let path = directory + "/endpoint.env"
        let deadline = ContinuousClock.now + .milliseconds(Int(timeout * 1000))
        while true {
            let file = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
            if file.contains(text) || ContinuousClock.now >= deadline { return file }
            try? await Task.sleep(for: .milliseconds(10))
        }
    }

    /// Polls `/v1/status` until `predicate` holds; returns that status, or the last one read when
    /// `timeout` passes (so the caller's expectations fail on what was actually there).
    func waitForStatus(timeout: Double, _ predicate: (StatusAPI.Status) -> Bool) async -> StatusAPI.Status? {
        let deadline = ContinuousClock.now + .milliseconds(Int(timeout * 1000))
        var last: StatusAPI.Status?
        while ContinuousClock.now < deadline {
            last = try? status()
            if let last, predicate(last) { return last }
            try? await Task.sleep(for: .milliseconds(50))
        }
        return last
    }

    /// Waits until some route satisfies `predicate`.
    func waitForRoute(timeout: Double, _ predicate: (StatusAPI.RouteStatus) -> Bool) async -> StatusAPI.RouteStatus? {
        let status = await waitForStatus(timeout: timeout) { status in
            status.candidates.contains { $0.routes.contains(where: predicate) }
        }
        return status?.candidates.flatMap(\.routes).first(where: predicate)
    }

    func stop() async {
        await process.stop()
    }

    /// Stops the daemon and removes its files.
    func finish() async {
        await process.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

extension Duration {
    var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}

/// A test server speaking the LMX contract (`scripts/fixtures/lmx-test-server.py`) on a test host.
final class LMXServer: Sendable {
    let process: LiveProcess
    let address: String
    let port: Int

    var baseURL: String { "http://\(address):\(port)" }
    var routeID: String { "lan/\(address):\(port)" }

    private init(process: LiveProcess, address: String, port: Int) {
        self.process = process
        self.address = address
        self.port = port
    }

    /// Starts a server in namespace host `host` (`.root` runs on this machine), bound to its test
    /// address (or `bind`).
    static func start(
        _ bed: TestBed, on host: TestBed.Host, port: Int, instance: String? = nil, mode: String = "ready",
        bind: String? = nil, tls: Bool = false, rogueCertificate: Bool = false, requireAccess: (String, String)? = nil,
        count: Int = 1, apiKey: String? = nil, extra: [String] = []
    ) async throws -> LMXServer {
        let address = bind ?? bed.address(host)
        var arguments = [
            "\(TestBed.repo)/scripts/fixtures/lmx-test-server.py", "--bind", address, "--port", String(port), "--mode",
            mode,
        ]
        if let instance { arguments += ["--instance", instance] }
        if count > 1 { arguments += ["--count", String(count)] }
        if tls {
            let dir = bed["LMX_TESTBED_TLS"]
            let name = rogueCertificate ? "rogue" : "tunnel"
            arguments += ["--tls", "\(dir)/\(name).pem", "\(dir)/\(name).key"]
        }
        if let (id, secret) = requireAccess { arguments += ["--require-access", id, secret] }
        if let apiKey { arguments += ["--api-key", apiKey] }
        arguments += extra
        let process: LiveProcess
        switch host {
        case .root:
            process = LiveProcess("/usr/bin/python3", arguments)
        case .h1, .h2, .h4:
            let namespace = bed["LMX_TESTBED_\(host.rawValue.uppercased())_NS"]
            process = LiveProcess("/usr/sbin/ip", ["netns", "exec", namespace, "/usr/bin/python3"] + arguments)
        }
        try await process.start()
        guard await process.waitForLine(containing: "listening", timeout: 10) else {
            await process.stop()
            throw TestBedMissing(detail: "test server on \(host):\(port) did not start: \(process.stderr)")
        }
        return LMXServer(process: process, address: address, port: port)
    }

    /// Switches the server's behaviour (`ready`, `notready`, `overloaded`, `403`, `dead`, …).
    func set(_ command: String) async {
        let before = process.stdoutLines.filter { $0 == "ok \(command)" }.count
        process.send(command)
        _ = await process.waitFor(timeout: 5) { p in p.stdoutLines.filter { $0 == "ok \(command)" }.count > before }
    }

    /// Request lines seen so far: "REQ <path> <credential header names>".
    var requests: [String] { process.stdoutLines.filter { $0.hasPrefix("REQ ") } }

    func stop() async { await process.stop() }
}

/// Something a test starts and must stop, whatever happens.
protocol TestResource: Sendable {
    func release() async
}

extension AgentProcess: TestResource {
    func release() async { await finish() }
}

extension LMXServer: TestResource {
    func release() async { await stop() }
}

extension LiveProcess: TestResource {
    func release() async { await stop() }
}

/// Collects what a test started and stops it all, in reverse order, at the end of the test, even
/// when the test throws.
final class Resources: Sendable {
    /// The collector of the running test, if any: every process started under it is kept.
    @TaskLocal static var current: Resources?

    private let items = Mutex<[any TestResource]>([])

    @discardableResult
    func keep<T: TestResource>(_ resource: T) -> T {
        items.withLock { $0.append(resource) }
        return resource
    }

    func releaseAll() async {
        let all = items.withLock { items in
            defer { items = [] }
            return items
        }
        for item in all.reversed() { await item.release() }
    }
}

/// Runs `body` with a resource collector and releases everything afterwards.
func withResources(_ body: () async throws -> Void) async throws {
    let resources = Resources()
    do {
        try await Resources.$current.withValue(resources) { try await body() }
    } catch {
        await resources.releaseAll()
        throw error
    }
    await resources.releaseAll()
}

/// A v1 pairing link for the tunnel at `url` (percent-encoded as a generator writes it), with
/// `extra` query fields (`&key=…`).
func pairingLink(name: String, url: String, extra: String) -> String {
    let encoded = url.replacingOccurrences(of: ":", with: "%3A").replacingOccurrences(of: "/", with: "%2F")
    return "opta-lmx://pair?v=1&name=\(name)&url=\(encoded)\(extra)"
}
