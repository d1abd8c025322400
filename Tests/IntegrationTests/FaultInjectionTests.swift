import Foundation
import LMXCore
import LMXStatusClient
import Testing

/// Faults repeated many times: crashes mid-write and avahi-daemon restarts.
@Suite("Fault injection: crashes mid-write, avahi-daemon restarts", .serialized)
struct FaultInjectionTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    private func integrity(_ database: String) async throws -> String {
        let check = try await Command.run(
            "/usr/bin/python3",
            [
                "-c",
                "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute('PRAGMA integrity_check').fetchone()[0])",
                database,
            ])
        return check.stdout.trimmingCharacters(in: .whitespacesAndNewlines) + check.stderr
    }

    @Test("lmx-agentd killed with SIGKILL 100 times while writing: 0 corrupt databases, every restart serves")
    func killDuringWrites() async throws {
        try await withResources {
            // Thirty configured endpoints that refuse at once: probes, statistics, health changes
            // and events are written continuously from the first milliseconds.
            let base = freePort()
            let endpoints = (0..<30).map { #"{"url": "http://127.0.0.1:\#(base + $0)"}"# }
            let directory = AgentProcess.makeDirectory()
            var corrupt = 0
            var rng = SystemRandomNumberGenerator()
            for run in 0..<100 {
                let agent = try await AgentProcess.start(
                    bed, config: config(endpoints: endpoints), arguments: ["--no-discovery"], directory: directory)
                try await Task.sleep(for: .milliseconds(Int.random(in: 10...150, using: &rng)))
                agent.process.signal(SIGKILL)
                _ = try await agent.process.waitForExit(timeout: 10)
                let result = try await integrity(agent.database)
                if result != "ok" {
                    corrupt += 1
                    Issue.record("run \(run): integrity_check says \(result)")
                }
            }
            #expect(corrupt == 0)
            let files = try FileManager.default.contentsOfDirectory(atPath: directory + "/state")
            #expect(!files.contains { $0.contains("corrupt") }, "a database was moved aside: \(files)")
            // The history survived the crashes: the last start still has the events of the earlier ones.
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: endpoints), arguments: ["--no-discovery"], directory: directory)
            let events = try agent.client.request("GET", "/v1/events?limit=5000")
            let list = try JSONDecoder().decode([StatusAPI.Event].self, from: Data(events.body))
            print("figure: 100 SIGKILLs mid-write: \(corrupt) corrupt databases, \(list.count) events kept")
            #expect(list.count >= 100)
        }
    }

    @Test("avahi-daemon restarted 20 times while the LAN server stays up: no failover, no flapping")
    func avahiRestarts() async throws {
        try await withResources {
            let wanPort = freePort()
            _ = try await LMXServer.start(
                bed, on: .root, port: wanPort, instance: "tunnel-\(wanPort)", bind: "127.0.0.1", tls: true)
            let port = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "steady-\(port)")
            _ = try await Publish.avahi(bed, on: .h1, name: "steady \(TestBed.tag())", port: port)
            let agent = try await AgentProcess.start(
                bed,
                config: config(endpoints: [wanEndpoint("https://127.0.0.1:\(wanPort)")], extraCA: caFile, trust: "lan"))
            #expect(await agent.waitForActive(timeout: 8) { $0?.baseURL == server.baseURL } != nil)
            try await Task.sleep(for: .seconds(1))
            let before = try agent.status().seq
            // What happened before the restarts (the tunnel may be active first, until mDNS has found
            // the LAN server) is not what this test is about.
            let earlier = try JSONDecoder().decode(
                [StatusAPI.Event].self, from: Data(agent.client.request("GET", "/v1/events?limit=1000").body))
            let lastBefore = earlier.map(\.id).max() ?? 0
            var away = 0
            for _ in 0..<20 {
                try await bed.control("restart-avahi", "root")
                // Watch the active endpoint through the restart.
                for _ in 0..<10 {
                    if agent.active()?.baseURL != server.baseURL { away += 1 }
                    try await Task.sleep(for: .milliseconds(50))
                }
            }
            #expect(away == 0, "the active endpoint left the LAN server \(away) times")
            let events = try agent.client.request("GET", "/v1/events?limit=1000")
            let list = try JSONDecoder().decode([StatusAPI.Event].self, from: Data(events.body))
            let switches = list.filter { $0.kind == "active" && $0.id > lastBefore }
            #expect(switches.isEmpty, "active endpoint changes during the restarts: \(switches.map(\.reason))")
            #expect(try agent.status().avahi == "running")
            print(
                "figure: 20 avahi-daemon restarts: \(switches.count) spurious switches, watch seq \(before) → \(try agent.status().seq)"
            )
        }
    }

    private var caFile: String { bed["LMX_TESTBED_TLS"] + "/ca.pem" }
}
