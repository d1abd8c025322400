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

/// What the user named is what is followed (issue 66): a folder made after the start, a file
/// rewritten in place, a folder replaced under the path, a link pointed elsewhere; and SIGHUP
/// reads the files again, as the log promises.
@Suite("Address book followed by its name, whatever its path does (real files, inotify, SIGHUP)", .serialized)
struct AddressBookPathTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    private func book(tunnel: String) -> String {
        #"{"entries":[{"id":"10.254.0.11:1234","label":"Studio","host":"10.254.0.11","port":1234,"tunnelUrl":"\#(tunnel)"}]}"#
    }

    /// The desktop manager's way: a temporary file renamed over the name.
    private func replace(_ path: String, with text: String) throws {
        try text.write(toFile: path + ".tmp", atomically: false, encoding: .utf8)
        guard rename(path + ".tmp", path) == 0 else { throw CocoaError(.fileWriteUnknown) }
    }

    /// An editor's way: the same file opened, truncated and written.
    private func rewriteInPlace(_ path: String, with text: String) throws {
        let handle = try #require(FileHandle(forWritingAtPath: path))
        try handle.truncate(atOffset: 0)
        try handle.write(contentsOf: Data(text.utf8))
        try handle.close()
    }

    private func tunnels(_ agent: AgentProcess) -> Set<String> {
        guard let response = try? agent.client.request("GET", "/v1/pairings"), response.status == 200,
            let pairings = try? JSONDecoder().decode([PairingSummary].self, from: Data(response.body))
        else { return [] }
        return Set(pairings.flatMap { $0.routes?.map(\.baseURL) ?? [] })
    }

    /// Seconds until the pairing's tunnel is `url`, or nil after `timeout`.
    private func waitForTunnel(_ agent: AgentProcess, _ url: String, timeout: Double = 3) async -> Double? {
        let start = ContinuousClock.now
        while (ContinuousClock.now - start).seconds < timeout {
            if tunnels(agent).contains(url) { return (ContinuousClock.now - start).seconds }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return nil
    }

    @Test(
        "folder made after the start, file rewritten in place, folder replaced underneath, link retargeted: each imported within 2 s"
    )
    func followsTheName() async throws {
        try await withResources {
            let directory = AgentProcess.makeDirectory()
            let folder = directory + "/later/opta"
            let path = folder + "/lmx-connections.json"
            let agent = try await AgentProcess.start(
                bed, arguments: ["--no-discovery", "--address-book", path], directory: directory)
            let tunnel = { (n: Int) in "https://127.0.0.1:\(40_000 + n)" }

            // 1. The folder (two levels) and the file appear after the start.
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            try replace(path, with: book(tunnel: tunnel(1)))
            let made = await waitForTunnel(agent, tunnel(1))
            print("figure: address book in a folder made after the start → imported in \(made ?? -1) s")
            #expect(made != nil && made! <= 2, "\(agent.process.stderr)")

            // 2. Rewritten in place (truncated and written, no rename).
            try rewriteInPlace(path, with: book(tunnel: tunnel(2)))
            let inPlace = await waitForTunnel(agent, tunnel(2))
            #expect(inPlace != nil && inPlace! <= 2)

            // 3. The folder renamed away and made again under the same name.
            try FileManager.default.moveItem(atPath: folder, toPath: folder + ".old")
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            try replace(path, with: book(tunnel: tunnel(3)))
            let underneath = await waitForTunnel(agent, tunnel(3))
            #expect(underneath != nil && underneath! <= 2)
            // The old folder is no longer what the name means: its changes are not read.
            try replace(folder + ".old/lmx-connections.json", with: book(tunnel: tunnel(9)))

            // 4. The name becomes a link into another folder; that file rewritten; the link retargeted.
            let elsewhere = directory + "/elsewhere"
            try FileManager.default.createDirectory(atPath: elsewhere, withIntermediateDirectories: true)
            try book(tunnel: tunnel(4)).write(toFile: elsewhere + "/a.json", atomically: false, encoding: .utf8)
            try book(tunnel: tunnel(6)).write(toFile: elsewhere + "/b.json", atomically: false, encoding: .utf8)
            try FileManager.default.createSymbolicLink(
                atPath: path + ".link", withDestinationPath: elsewhere + "/a.json")
            guard rename(path + ".link", path) == 0 else { throw CocoaError(.fileWriteUnknown) }
            #expect(await waitForTunnel(agent, tunnel(4)) != nil)
            try rewriteInPlace(elsewhere + "/a.json", with: book(tunnel: tunnel(5)))
            #expect(await waitForTunnel(agent, tunnel(5)) != nil, "the link's target is followed in its own folder")
            try FileManager.default.createSymbolicLink(
                atPath: path + ".link", withDestinationPath: "../../elsewhere/b.json")
            guard rename(path + ".link", path) == 0 else { throw CocoaError(.fileWriteUnknown) }
            #expect(await waitForTunnel(agent, tunnel(6)) != nil, "a retargeted link is read at once")
            #expect(!tunnels(agent).contains(tunnel(9)))
        }
    }

    @Test("SIGHUP reads the address book again: a pairing removed since comes back from the file")
    func sighupRereads() async throws {
        try await withResources {
            let directory = AgentProcess.makeDirectory()
            let path = directory + "/lmx-connections.json"
            try replace(path, with: book(tunnel: "https://127.0.0.1:40100"))
            let agent = try await AgentProcess.start(
                bed, arguments: ["--no-discovery", "--address-book", path], directory: directory)
            #expect(await waitForTunnel(agent, "https://127.0.0.1:40100") != nil)
            let response = try agent.client.request("GET", "/v1/pairings")
            let id = try #require(try JSONDecoder().decode([PairingSummary].self, from: Data(response.body)).first?.id)
            #expect(try agent.client.request("DELETE", "/v1/pairings/\(id)").status == 200)
            #expect(tunnels(agent).isEmpty)
            agent.process.signal(SIGHUP)
            #expect(await waitForTunnel(agent, "https://127.0.0.1:40100") != nil)
        }
    }
}
