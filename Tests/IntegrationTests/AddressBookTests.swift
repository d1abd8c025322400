import Foundation
import LMXCore
import LMXStatusClient
import Testing

/// The desktop manager rewrites `lmx-connections.json` whenever its quick tunnel gets a new URL;
/// an agent following the file moves the pairing to the new tunnel by itself.
@Suite("Address book followed with inotify (real files, real tunnels)", .serialized)
struct AddressBookTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    /// Writes the file the way the desktop manager does: a temporary file renamed over it.
    private func write(_ text: String, to path: String) throws {
        let temporary = path + ".tmp"
        try text.write(toFile: temporary, atomically: false, encoding: .utf8)
        guard rename(temporary, path) == 0 else { throw CocoaError(.fileWriteUnknown) }
    }

    private func book(host: String, port: Int, tunnel: String) -> String {
        #"{"entries":[{"id":"\#(host):\#(port)","label":"Studio","host":"\#(host)","port":\#(port),"tunnelUrl":"\#(tunnel)","lastConnectedVia":"mdns"}]}"#
    }

    @Test("a rewritten tunnelUrl moves the same pairing to the new tunnel within 2 s; a broken file changes nothing")
    func followsTunnelChanges() async throws {
        try await withResources {
            let first = freePort()
            let second = freePort()
            let lanPort = freePort()
            _ = try await LMXServer.start(
                bed, on: .root, port: first, instance: "studio-tunnel", bind: "127.0.0.1", tls: true)
            _ = try await LMXServer.start(
                bed, on: .root, port: second, instance: "studio-tunnel", bind: "127.0.0.1", tls: true)
            let directory = AgentProcess.makeDirectory()
            try FileManager.default.createDirectory(atPath: directory + "/opta", withIntermediateDirectories: true)
            let path = directory + "/opta/lmx-connections.json"
            try write(book(host: "10.254.0.11", port: lanPort, tunnel: "https://127.0.0.1:\(first)"), to: path)
            let agent = try await AgentProcess.start(
                bed,
                config: config(extraCA: bed["LMX_TESTBED_TLS"] + "/ca.pem", top: #""address_books": ["\#(path)"]"#),
                arguments: ["--no-discovery"], directory: directory)
            #expect(
                await agent.waitForRoute(timeout: 8) {
                    $0.baseURL == "https://127.0.0.1:\(first)" && $0.verdict == .ready
                } != nil)
            let before = try JSONDecoder().decode(
                [PairingSummary].self, from: Data(try agent.client.request("GET", "/v1/pairings").body))
            #expect(before.count == 1)

            // cloudflared restarted: a new quick-tunnel URL for the same entry.
            let started = ContinuousClock.now
            try write(book(host: "10.254.0.11", port: lanPort, tunnel: "https://127.0.0.1:\(second)"), to: path)
            let moved = await agent.waitForRoute(timeout: 8) { $0.baseURL == "https://127.0.0.1:\(second)" }
            #expect(moved != nil)
            let seconds = (ContinuousClock.now - started).seconds
            print("figure: address book rewrite → pairing on the new tunnel in \(seconds) s")
            #expect(seconds <= 2)
            let after = try JSONDecoder().decode(
                [PairingSummary].self, from: Data(try agent.client.request("GET", "/v1/pairings").body))
            #expect(after.count == 1)
            #expect(after.first?.id == before.first?.id)
            #expect(after.first?.routes?.map(\.baseURL).contains("https://127.0.0.1:\(first)") == false)
            #expect(await agent.waitForActive(timeout: 8) { $0?.baseURL == "https://127.0.0.1:\(second)" } != nil)

            // A half-written or foreign file is refused with a log line; the pairing stays.
            try write(#"{"entries": [{"host": "10.254.0.11", "tunnelUrl": "http://plain.example"}]}"#, to: path)
            try await Task.sleep(for: .seconds(1))
            let kept = try JSONDecoder().decode(
                [PairingSummary].self, from: Data(try agent.client.request("GET", "/v1/pairings").body))
            #expect(kept.count == 1)
            #expect(kept.first?.routes?.map(\.baseURL).contains("https://127.0.0.1:\(second)") == true)
            #expect(agent.process.stderr.contains("address book not imported"))
        }
    }
}
