import Foundation
import LMXCore
import Testing

/// The history as a real agent keeps it: a paired server (its LAN address on h1, its tunnel on
/// this machine's loopback) failing over and back; `/v1/history`'s switches at the very times of
/// the agent's events, `lmx-status --history` drawing them on 80 columns, and the history kept
/// through a SIGKILL and a restart.
@Suite("History of a real agent: /v1/history, lmx-status --history, a kill and a restart", .serialized)
struct HistoryAgentTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    func history(_ agent: AgentProcess, since: String = "1h") throws -> StatusAPI.History {
        let response = try agent.client.request("GET", "/v1/history?since=\(since)")
        #expect(response.status == 200, "\(String(decoding: response.body, as: UTF8.self))")
        return try JSONDecoder().decode(StatusAPI.History.self, from: Data(response.body))
    }

    func events(_ agent: AgentProcess) throws -> [StatusAPI.Event] {
        try JSONDecoder().decode(
            [StatusAPI.Event].self, from: Data(try agent.client.request("GET", "/v1/events?limit=1000").body))
    }

    @Test(
        "a failover and a return: the ribbons' switches are the agent's events, lmx-status --history draws them in 80 columns; a SIGKILL loses nothing recorded and the restart marks the gap"
    )
    func failoverAndReturn() async throws {
        try await withResources {
            let port = freePort()
            let tunnelPort = freePort()
            let instance = "history-\(port)"
            let lan = try await LMXServer.start(bed, on: .h1, port: port, instance: instance)
            let tunnel = try await LMXServer.start(
                bed, on: .root, port: tunnelPort, instance: instance, bind: "127.0.0.1", tls: true,
                requireAccess: ("id.access", "access-secret"))
            let config =
                #"{"interfaces": ["lmxbr0"], "health": {"stability_window": 1}, "extra_ca_file": "\#(bed["LMX_TESTBED_TLS"])/ca.pem"}"#
            let agent = try await AgentProcess.start(bed, config: config, arguments: ["--no-discovery"])
            let link = pairingLink(
                name: "Studio", url: "https://127.0.0.1:\(tunnelPort)",
                extra: "&cf_id=id.access&cf_secret=access-secret&instance=\(instance)&lan=\(bed.address(.h1))%3A\(port)"
            )
            let paired = try await agent.pair(link)
            #expect(paired.status == 0, "\(paired.stderr)")
            #expect(await agent.waitForActive(timeout: 15) { $0?.baseURL == lan.baseURL } != nil)
            #expect(await agent.waitForRoute(timeout: 15) { $0.via == .wan && $0.verdict == .ready } != nil)

            // Failover and return.
            await lan.set("dead")
            #expect(await agent.waitForActive(timeout: 15) { $0?.via == .wan } != nil)
            await lan.set("alive")
            #expect(await agent.waitForActive(timeout: 15) { $0?.baseURL == lan.baseURL } != nil)
            try await Task.sleep(for: .milliseconds(300))  // the store's writer is behind by a moment at most

            let switches = try history(agent).switches
            let told = try events(agent).filter { $0.kind == "active" }
            #expect(told.count >= 3, "\(told)")
            // The same instants, to the millisecond, the same ends.
            #expect(switches.map(\.at) == told.map(\.at), "history \(switches) events \(told)")
            #expect(switches.map(\.to) == told.map(\.to), "history \(switches) events \(told)")
            #expect(switches.map(\.cause) == told.compactMap(\.text))
            let answer = try history(agent)
            let lanRibbon = try #require(answer.routes.first { $0.via == .lan })
            // In use, left for the tunnel (before or as it was counted down), in use again.
            let used = lanRibbon.segments.map(\.active)
            #expect(used.firstIndex(of: false).map { used[$0...].contains(true) } == true, "\(lanRibbon.segments)")
            #expect(lanRibbon.segments.last?.active == true && lanRibbon.segments.last?.state == .ready)
            #expect(answer.routes.first { $0.via == .wan }?.segments.contains { $0.active } == true)
            #expect(answer.routes.allSatisfy { $0.server == instance })
            // The minute under way is in the answer before it is written: probe latency already.
            #expect(lanRibbon.latency.last.map { $0.probes > 0 && $0.p50MS != nil } == true, "\(lanRibbon.latency)")

            // The terminal's ribbons: the same history, 80 columns, one line per route.
            let status = "\(TestBed.binDir)/lmx-status"
            let drawn = try await Command.run(status, ["--history", "--since", "1h", "--socket", agent.socket])
            #expect(drawn.status == 0, "\(drawn.stderr)")
            let lines = drawn.stdout.split(separator: "\n").map(String.init)
            #expect(lines.allSatisfy { $0.count <= 80 }, "\(drawn.stdout)")
            #expect(lines.contains { $0.hasPrefix("Studio LAN ") } && lines.contains { $0.hasPrefix("Studio tunnel ") })
            // Switches are marked in the cell of their time (48 cells over the hour); the recent
            // ones fall in the last cells.
            let marks = try #require(lines.first { $0.hasPrefix("switches: \(switches.count)") }, "\(drawn.stdout)")
            let since = try #require(Timestamp.parse(answer.since))
            let until = try #require(Timestamp.parse(answer.until))
            for change in switches {
                let at = try #require(Timestamp.parse(change.at))
                // (The command asked a moment later: its window ends up to a few seconds on.)
                let cell = min(47, Int((at - since) / ((until - since) / 48)))
                let drawnCell = Array(marks.dropFirst(21)).enumerated().filter { $0.element == "^" }.map(\.offset)
                #expect(drawnCell.contains { abs($0 - cell) <= 1 }, "\(change.at) in \(marks)")
            }
            // Seconds of history in an hour's ribbon: its last cell only, ready (in use or not).
            let lanLine = try #require(lines.first { $0.hasPrefix("Studio LAN ") })
            #expect(
                lanLine.dropFirst(21).prefix(48).trimmingCharacters(in: .whitespaces).allSatisfy { "#=".contains($0) })
            let json = try await Command.run(status, ["--history", "--json", "--socket", agent.socket])
            let decoded = try JSONDecoder().decode(StatusAPI.History.self, from: Data(json.stdout.utf8))
            #expect(decoded.switches.map(\.at) == switches.map(\.at))
            let bad = try await Command.run(status, ["--history", "--since", "30d", "--socket", agent.socket])
            #expect(bad.status == 64 && bad.stderr.contains("8 days"), "\(bad.stderr)")

            // SIGKILL: nothing recorded is lost, the file is sound, and the restart marks the gap.
            agent.process.signal(SIGKILL)
            _ = await agent.process.waitFor(timeout: 5) { !$0.isRunning }
            let check = try await Command.run("/usr/bin/sqlite3", [agent.database, "PRAGMA integrity_check"])
            #expect(check.stdout == "ok\n", "\(check.stdout) \(check.stderr)")
            let again = try await AgentProcess.start(
                bed, config: config, arguments: ["--no-discovery"], directory: agent.directory)
            #expect(await again.waitForActive(timeout: 15) { $0?.baseURL == lan.baseURL } != nil)
            try await Task.sleep(for: .milliseconds(300))
            let after = try history(again)
            #expect(Array(after.switches.prefix(switches.count)).map(\.at) == switches.map(\.at))
            let restarted = try #require(after.routes.first { $0.via == .lan })
            #expect(restarted.segments.contains { $0.state == .stopped }, "\(restarted.segments)")
            #expect(restarted.segments.last?.state == .ready)
            await again.finish()
            await lan.stop()
            await tunnel.stop()
        }
    }
}
