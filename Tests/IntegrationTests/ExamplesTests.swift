import Foundation
import LMXCore
import Testing

/// Every file in `examples/`, run as a user would run it, against real agents and servers.
@Suite("examples/: each one runs against the real agent", .serialized)
struct ExamplesTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    private static var examples: String { TestBed.repo + "/examples" }
    private static func port() -> Int { Int.random(in: 40_000...49_999) }

    /// An agent with no mDNS and one manual LAN endpoint: a server on h1.
    private func agentWithServer(instance: String, config: String? = nil) async throws -> (AgentProcess, LMXServer) {
        let port = Self.port()
        let server = try await LMXServer.start(bed, on: .h1, port: port, instance: instance)
        let agent = try await AgentProcess.start(
            bed, config: config, arguments: ["--no-discovery", "--endpoint", server.baseURL])
        let seconds = await agent.waitForActive(timeout: 10) { $0?.baseURL == server.baseURL }
        #expect(seconds != nil, "the agent did not make \(server.baseURL) active")
        return (agent, server)
    }

    @Test(
        "active-endpoint.sh prints the endpoint (exit 0), the reason when there is none (1), and exits 69 without an agent"
    )
    func activeEndpointScript() async throws {
        try await withResources {
            // The commented config shipped as /etc/lmx/agent.json is what this agent runs with.
            let shipped = try String(contentsOfFile: Self.examples + "/agent.json", encoding: .utf8)
            let (agent, server) = try await agentWithServer(instance: "example-sh", config: shipped)
            let script = Self.examples + "/active-endpoint.sh"

            let found = try await Command.run(script, [], environment: ["LMX_SOCKET": agent.socket])
            #expect(found.status == 0, "stderr: \(found.stderr)")
            #expect(found.stdout.trimmingCharacters(in: .whitespacesAndNewlines).hasPrefix(server.baseURL + "/v1 lan "))

            await server.set("dead")
            #expect(await agent.waitForActive(timeout: 15) { $0 == nil } != nil)
            let none = try await Command.run(script, [], environment: ["LMX_SOCKET": agent.socket])
            #expect(none.status == 1)
            #expect(none.stderr.contains("no active endpoint"))
            #expect(none.stdout.isEmpty)

            let missing = try await Command.run(
                script, [], environment: ["LMX_SOCKET": agent.directory + "/nothing.sock"])
            #expect(missing.status == 69)
            #expect(missing.stderr.contains("nothing.sock"))
        }
    }

    @Test("openai_client.py finds the endpoint with lmx-status --url, lists the models and gets a chat reply")
    func openAIClient() async throws {
        try await withResources {
            let (agent, _) = try await agentWithServer(instance: "example-py")
            let environment = [
                "LMX_SOCKET": agent.socket, "LMX_STATUS": TestBed.binDir + "/lmx-status", "OPENAI_API_KEY": "",
            ]
            let result = try await Command.run(
                "/usr/bin/python3", [Self.examples + "/openai_client.py", "Say hello"], environment: environment)
            #expect(result.status == 0, "stderr: \(result.stderr)")
            #expect(result.stdout.contains("models: test/model"))
            #expect(result.stdout.contains("reply: Hello from example-py."))

            await agent.stop()
            let down = try await Command.run(
                "/usr/bin/python3", [Self.examples + "/openai_client.py"], environment: environment)
            #expect(down.status == 69)
            #expect(down.stderr.contains("lmx-agentd is not running"))
        }
    }

    @Test("watch.py prints the active endpoint, then each change from /v1/watch")
    func watcher() async throws {
        try await withResources {
            let (agent, server) = try await agentWithServer(instance: "example-watch")
            let watch = LiveProcess(
                "/usr/bin/python3", [Self.examples + "/watch.py", "--count", "1"],
                environment: ["LMX_SOCKET": agent.socket])
            try await watch.start()
            #expect(await watch.waitForLine(containing: "active: \(server.baseURL) via lan", timeout: 10))
            await server.set("dead")
            let status = try await watch.waitForExit(timeout: 20)
            #expect(status == 0, "stderr: \(watch.stderr)")
            let lines = watch.stdout.split(separator: "\n")
            #expect(lines.count == 2, "\(lines)")
            #expect(lines.last?.contains("active: none") == true)
        }
    }

    @Test("the sample pairing codes (checked in, and made afresh by make-codes.sh) decode, each to its format")
    func samplePairingCodes() async throws {
        let samples: [(file: String, format: String, url: String?, lan: String?)] = [
            ("v1-token.png", "v1-token", "https://quiet-river-1234.trycloudflare.com", "192.168.188.11:1234"),
            ("tunnel-url.png", "tunnel-url", "https://quiet-river-1234.trycloudflare.com", nil),
            ("connect-link.png", "connect-link", "https://quiet-river-1234.trycloudflare.com", "192.168.188.11:1234"),
            ("account-link.png", "pair-link", nil, "192.168.188.11:1234"),
            (
                "lmx-connections.json", "address-book", "https://quiet-river-1234.trycloudflare.com",
                "192.168.188.11:1234"
            ),
        ]
        let scratch = AgentProcess.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        // The checked-in codes, and the same codes made afresh by make-codes.sh.
        let remade = scratch + "/remade"
        let make = try await Command.run(Self.examples + "/pairing/make-codes.sh", [TestBed.binDir, remade])
        #expect(make.status == 0, "\(make.stderr)")
        try FileManager.default.copyItem(
            atPath: Self.examples + "/pairing/lmx-connections.json", toPath: remade + "/lmx-connections.json")
        for sample in samples.map({ (Self.examples + "/pairing/" + $0.file, $0) })
            + samples.map({ (remade + "/" + $0.file, $0) })
        {
            let (file, sample) = sample
            let result = try await Command.run(
                TestBed.binDir + "/lmx-pair",
                [file, "--dry-run", "--json", "--db", scratch + "/agent.db", "--socket", scratch + "/none.sock"])
            #expect(result.status == 0, "\(file): \(result.stderr)")
            let imported = try JSONDecoder().decode([PairingImportResult].self, from: Data(result.stdout.utf8))
            #expect(imported.first?.pairing.format.rawValue == sample.format, "\(file)")
            #expect(imported.first?.pairing.url == sample.url, "\(file)")
            #expect(imported.first?.pairing.lan == sample.lan, "\(file)")
        }
        #expect(!FileManager.default.fileExists(atPath: scratch + "/agent.db"), "--dry-run wrote a database")
    }

    @Test("demo.sh shows discovery, failover to WAN and return to LAN in under a minute, then cleans up")
    func demo() async throws {
        let before = Set((try? FileManager.default.contentsOfDirectory(atPath: "/tmp")) ?? []).filter {
            $0.hasPrefix("lmx-demo.")
        }
        // As from a shell: the test runner's threads block signals, and a spawned child inherits
        // that mask, so the demo starts through a wrapper that clears it.
        let unblocked =
            "import os, signal, sys; signal.pthread_sigmask(signal.SIG_SETMASK, []); os.execv(sys.argv[1], sys.argv[1:])"
        let result = try await Command.run(
            "/usr/bin/python3", ["-c", unblocked, Self.examples + "/demo.sh"],
            environment: ["LMX_BIN_DIR": TestBed.binDir],
            timeout: 120)
        #expect(result.status == 0, "stdout: \(result.stdout)\nstderr: \(result.stderr)")
        #expect(result.seconds < 60)
        let out = result.stdout
        #expect(out.contains("discovered: the agent uses http://127.0.0.1:1808"))
        #expect(out.contains("failover to WAN: https://localhost:18443"))
        #expect(out.contains("back on the LAN: http://127.0.0.1:1808"))
        // lmx-status --watch showed the moves as they happened.
        #expect(out.contains("Requests now go through the tunnel to Studio: Studio on the LAN is not answering"))
        #expect(out.contains("Requests now go on the LAN to Studio: Studio on the LAN has answered well for"))
        // Importing the pairing of the server in use moved nothing: no switch is told.
        #expect(!out.contains("no server answers"), "\(out)")
        // Nothing is left behind: no scratch folder, no process in the demo's namespace.
        let after = Set((try? FileManager.default.contentsOfDirectory(atPath: "/tmp")) ?? []).filter {
            $0.hasPrefix("lmx-demo.")
        }
        #expect(after.subtracting(before).isEmpty)
    }
}
