import Foundation
import LMXCore
import LMXStatusClient
import Testing

// lmx-agentd end to end, what it tells: lmx-status, endpoint.env, the journal, the status API
// against its OpenAPI document, metrics, watch clients, SIGHUP, systemd.
extension AgentTests {
    @Test("lmx-status: --url, the table, --json, and exit codes 0, 1 and 69")
    func lmxStatus() async throws {
        try await withResources {
            let port = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "status-\(port)")
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [#"{"url": "http://10.254.0.11:\#(port)", "name": "Studio"}"#]),
                arguments: ["--no-discovery"])
            #expect(await agent.waitForActive(timeout: 5) { $0 != nil } != nil)
            let status = "\(TestBed.binDir)/lmx-status"
            let url = try await Command.run(status, ["--url", "--socket", agent.socket])
            #expect(url.status == 0)
            #expect(url.stdout == "http://10.254.0.11:\(port)\n")
            let table = try await Command.run(status, ["--socket", agent.socket])
            #expect(table.status == 0)
            #expect(
                table.stdout.hasPrefix("Active: Studio on the LAN at http://10.254.0.11:\(port), ready since"),
                "\(table.stdout)")
            #expect(table.stdout.contains("STATE") && !table.stdout.contains("VERDICT"))
            #expect(table.stdout.contains("* Studio"))
            let json = try await Command.run(status, ["--json"], environment: ["LMX_SOCKET": agent.socket])
            let decoded = try JSONDecoder().decode(StatusAPI.Status.self, from: Data(json.stdout.utf8))
            #expect(decoded.active?.instanceID == "status-\(port)")

            await server.set("dead")
            #expect(await agent.waitForActive(timeout: 10) { $0 == nil } != nil)
            let none = try await Command.run(status, ["--url", "--socket", agent.socket])
            #expect(none.status == 1)
            #expect(none.stdout.isEmpty)
            #expect(none.stderr.contains("no server is usable now: "), "\(none.stderr)")
            // The history in sentences (`text`), the codes beside them; the log says the same.
            let events = try JSONDecoder().decode(
                [StatusAPI.Event].self, from: Data(try agent.client.request("GET", "/v1/events").body))
            let told = events.compactMap(\.text)
            #expect(told.count == events.count && !told.isEmpty, "\(events)")
            let lost = events.last { $0.kind == "active" }
            #expect(
                lost?.to == nil && lost?.text?.hasPrefix("No server is usable now: Studio on the LAN ") == true,
                "\(told)")
            #expect(told.contains("Studio on the LAN is ready."), "\(told)")
            for text in told { #expect(agent.process.stderr.contains(text), "not in the log: \(text)") }

            let missing = try await Command.run(status, ["--url", "--socket", agent.directory + "/nothing.sock"])
            #expect(missing.status == 69)
            #expect(missing.stderr.contains("lmx-agentd is not running"))
            #expect(missing.stderr.contains("systemctl start lmx-agentd"))
        }
    }

    @Test(
        "lmx-status --wait returns as soon as an endpoint is usable, 1 on timeout, 69 with no agent; endpoint.env follows the active endpoint"
    )
    func waitAndEndpointFile() async throws {
        try await withResources {
            let port = freePort()
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [#"{"url": "http://10.254.0.11:\#(port)", "name": "Later"}"#]),
                arguments: ["--no-discovery"])
            let status = "\(TestBed.binDir)/lmx-status"
            let envPath = agent.directory + "/endpoint.env"

            // Nothing answers: --wait=1 gives up with 1 after about a second, naming the reason.
            let timedOut = try await Command.run(status, ["--wait=1", "--url", "--socket", agent.socket])
            #expect(timedOut.status == 1)
            #expect(timedOut.stdout.isEmpty)
            #expect(timedOut.stderr.contains("no server usable after 1 s"))
            #expect(timedOut.seconds >= 0.9 && timedOut.seconds < 3)
            let before = try String(contentsOfFile: envPath, encoding: .utf8)
            #expect(before.contains("LMX_ACTIVE='0'\n"))
            #expect(before.contains("LMX_BASE_URL=''\n"))

            // A waiter started first returns once the server comes up and is probed good.
            async let waited = Command.run(status, ["--wait", "--url", "--socket", agent.socket])
            try await Task.sleep(for: .seconds(1.5))
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "wait-\(port)")
            let result = try await waited
            #expect(result.status == 0)
            #expect(result.stdout == "http://10.254.0.11:\(port)\n")
            #expect(result.seconds >= 1.5 && result.seconds < 12)

            let file = await agent.endpointFile(containing: "LMX_ACTIVE='1'\n")
            #expect(file.contains("LMX_ACTIVE='1'\n"))
            #expect(file.contains("LMX_BASE_URL='http://10.254.0.11:\(port)'\n"))
            #expect(file.contains("OPENAI_BASE_URL='http://10.254.0.11:\(port)/v1'\n"))
            #expect(file.contains("LMX_INSTANCE_ID='wait-\(port)'\n"))
            let mode = (try FileManager.default.attributesOfItem(atPath: envPath)[.posixPermissions] as? Int) ?? 0
            #expect(mode == 0o644)
            // A shell reads it as it is.
            let sourced = try await Command.run(
                "/bin/sh", ["-c", ". \"$0\" && printf '%s %s' \"$LMX_VIA\" \"$OPENAI_BASE_URL\"", envPath])
            #expect(sourced.stdout == "lan http://10.254.0.11:\(port)/v1")

            await server.set("dead")
            #expect(await agent.waitForActive(timeout: 10) { $0 == nil } != nil)
            let after = await agent.endpointFile(containing: "LMX_ACTIVE='0'\n")
            #expect(after.contains("LMX_ACTIVE='0'\n"))

            // No agent at all: 69 once the wait is over.
            let missing = try await Command.run(status, ["--wait=1", "--socket", agent.directory + "/nothing.sock"])
            #expect(missing.status == 69)
            #expect(missing.seconds >= 0.9)

            // A clean stop removes the file: no daemon, no answer.
            await agent.stop()
            #expect(!FileManager.default.fileExists(atPath: envPath))
        }
    }

    @Test(
        "under systemd's journal (JOURNAL_STREAM matches stderr) lines carry <N> priorities and no timestamp; elsewhere the usual format"
    )
    func journalPriorities() async throws {
        let directory = AgentProcess.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let log = directory + "/stderr"
        // A warning at start: an address book that is not one.
        try "not an address book".write(toFile: directory + "/book.json", atomically: true, encoding: .utf8)
        let script = """
            : > "$1"; export JOURNAL_STREAM="$(stat -c '%d:%i' "$1")"
            exec "$2" --no-discovery --gateway off --socket "$3/agent.sock" --db "$3/agent.db" --config /dev/null \\
                --address-book "$3/book.json" 2>>"$1"
            """
        let agent = LiveProcess("/bin/sh", ["-c", script, "sh", log, "\(TestBed.binDir)/lmx-agentd", directory])
        try await agent.start()
        _ = await agent.waitFor(timeout: 5) { _ in
            ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").contains("not imported")
        }
        await agent.stop()
        let lines = try String(contentsOfFile: log, encoding: .utf8).split(separator: "\n").map(String.init)
        #expect(lines.contains { $0.hasPrefix("<6>starting") })
        #expect(lines.contains { $0.hasPrefix("<4>address book not imported") })
        #expect(
            lines.allSatisfy { $0.range(of: #"^<[0-7]>"#, options: .regularExpression) != nil }, "\(lines.prefix(3))")
        #expect(!lines.contains { $0.range(of: #"\d{4}-\d\d-\d\dT\d\d:"#, options: .regularExpression) != nil })

        // Not the journal (JOURNAL_STREAM names another file): timestamps, no prefixes.
        let other = directory + "/other"
        let plain = LiveProcess(
            "/bin/sh",
            [
                "-c",
                "JOURNAL_STREAM=1:1 exec \"$1\" --no-discovery --gateway off --socket \"$2/b.sock\" --db \"$2/b.db\" --config /dev/null 2>\"$3\"",
                "sh", "\(TestBed.binDir)/lmx-agentd", directory, other,
            ])
        try await plain.start()
        _ = await plain.waitFor(timeout: 5) { _ in
            ((try? String(contentsOfFile: other, encoding: .utf8)) ?? "").contains("starting")
        }
        await plain.stop()
        let text = try String(contentsOfFile: other, encoding: .utf8)
        #expect(text.range(of: #"^\d{4}-\d\d-\d\dT"#, options: .regularExpression) != nil)
        #expect(!text.contains("<6>"))
    }

    @Test(
        "every answer of the status API matches docs/openapi.yaml (scripts/checks/check-openapi.py against a running daemon)"
    )
    func openAPI() async throws {
        try await withResources {
            let port = freePort()
            _ = try await LMXServer.start(bed, on: .h1, port: port, instance: "openapi-\(port)")
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [#"{"url": "http://10.254.0.11:\#(port)", "name": "Studio"}"#]),
                arguments: ["--no-discovery"])
            #expect(await agent.waitForActive(timeout: 5) { $0 != nil } != nil)
            let check = try await Command.run(
                bed["LMX_TESTBED_PYTHON"],
                [
                    "\(TestBed.repo)/scripts/checks/check-openapi.py", agent.socket,
                    "https://quiet-river-1234.trycloudflare.com?key=made-up-admin-key",
                ])
            #expect(check.status == 0, "\(check.stderr)")
            #expect(check.stdout.contains("match docs/openapi.yaml"))
            #expect(!agent.process.stderr.contains("made-up-admin-key"))
            // The check can fail: a document that lost a field the daemon sends is caught.
            let stale = agent.directory + "/stale.yaml"
            let edit = try await Command.run(
                bed["LMX_TESTBED_PYTHON"],
                [
                    "-c",
                    "import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); del d['components']['schemas']['Active']['properties']['route_id']; d['components']['schemas']['Active']['required'].remove('route_id'); yaml.safe_dump(d, open(sys.argv[2], 'w'))",
                    "\(TestBed.repo)/docs/openapi.yaml", stale,
                ])
            #expect(edit.status == 0, "\(edit.stderr)")
            let caught = try await Command.run(
                bed["LMX_TESTBED_PYTHON"],
                [
                    "\(TestBed.repo)/scripts/checks/check-openapi.py", agent.socket,
                    "https://quiet-river-1234.trycloudflare.com", "--spec", stale,
                ])
            #expect(caught.status == 1)
            #expect(caught.stderr.contains("route_id"))
        }
    }

    @Test(
        "/metrics (socket and --metrics-address) parses with the Prometheus client's parser; lmx_build_info; histograms count every probe"
    )
    func metrics() async throws {
        try await withResources {
            let port = freePort()
            let metricsPort = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "metrics-\(port)")
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [#"{"url": "http://10.254.0.11:\#(port)", "name": "Studio"}"#]),
                arguments: ["--no-discovery", "--metrics-address", "127.0.0.1:\(metricsPort)"])
            #expect(await agent.waitForActive(timeout: 5) { $0 != nil } != nil)
            // Probes slower than the largest bucket (10 s) cannot be made here; 12 s ones at 2 s
            // timeouts cannot either: slow answers of 300 ms land in the 0.5 s bucket instead.
            await server.set("slow 300")
            try await Task.sleep(for: .seconds(2))
            await server.set("ready")
            let socketText = String(decoding: try agent.client.request("GET", "/metrics").body, as: UTF8.self)
            let tcp = try await Command.run("/usr/bin/curl", ["-s", "http://127.0.0.1:\(metricsPort)/metrics"])
            for text in [socketText, tcp.stdout] {
                let stdin = agent.directory + "/metrics.txt"
                try text.write(toFile: stdin, atomically: true, encoding: .utf8)
                let check = try await Command.run(
                    "/bin/sh",
                    [
                        "-c", "\"$0\" \"$1\" < \"$2\"", bed["LMX_TESTBED_PYTHON"],
                        "\(TestBed.repo)/scripts/checks/check-metrics.py", stdin,
                    ])
                #expect(check.status == 0, "\(check.stderr)")
                for name in [
                    "lmx_build_info", "lmx_probes", "lmx_probe_duration_seconds", "lmx_routes", "lmx_candidates",
                    "lmx_active_via",
                    "lmx_active_switches", "lmx_store_pending_writes", "lmx_watch_clients", "lmx_gateway_requests",
                ] {
                    #expect(check.stdout.split(separator: "\n").contains { $0 == name }, "\(name) missing")
                }
            }
            #expect(socketText.contains("lmx_build_info{version=\"\(StatusAPI.version)\"} 1"))
            #expect(socketText.contains("lmx_routes{verdict=\"ready\"} 1"))
            #expect(socketText.contains("lmx_candidates 1"))
            #expect(socketText.contains("lmx_active_via{via=\"lan\"} 1"))
        }
    }

    @Test("200 watch clients all get every change in order while garbage and half-sent requests get errors")
    func watchClientsAndGarbage() async throws {
        try await withResources {
            let port = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port)
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [#"{"url": "http://10.254.0.11:\#(port)"}"#]),
                arguments: ["--no-discovery"])
            #expect(await agent.waitForActive(timeout: 5) { $0 != nil } != nil)

            let load = LiveProcess(
                "/usr/bin/python3",
                [
                    "\(TestBed.repo)/scripts/fixtures/watch-load.py", "--socket", agent.socket, "--clients", "200",
                    "--seconds", "12",
                ])
            try await load.start()
            #expect(await load.waitForLine(containing: "connected 200", timeout: 10))
            // Changes: the server goes down and comes back twice.
            for _ in 0..<2 {
                await server.set("dead")
                _ = await agent.waitForActive(timeout: 8) { $0 == nil }
                await server.set("alive")
                _ = await agent.waitForActive(timeout: 8) { $0 != nil }
            }
            let garbage = LiveProcess(
                "/usr/bin/python3",
                ["\(TestBed.repo)/scripts/fixtures/watch-load.py", "--socket", agent.socket, "--garbage"])
            try await garbage.start()
            let garbageStatus = try await garbage.waitForExit(timeout: 30)
            #expect(garbageStatus == 0, "\(garbage.stdout) \(garbage.stderr)")
            let status = try await load.waitForExit(timeout: 30)
            #expect(status == 0, "\(load.stdout) \(load.stderr)")
            let summary = load.stdoutLines.last ?? ""
            // "ok clients=200 lines=N last_seq=S": every client saw the same gap-free sequence.
            #expect(summary.hasPrefix("ok clients=200"), "\(load.stdout)")
            #expect(agent.isServing)

            // Resuming: ?since=N replays the lines after N; a number the agent never had gives a snapshot.
            let last = try agent.status().seq
            #expect(last >= 3)
            var resumed: [StatusAPI.WatchLine] = []
            try agent.client.stream("/v1/watch?since=\(last - 2)") { bytes in
                if let line = try? JSONDecoder().decode(StatusAPI.WatchLine.self, from: Data(bytes)) {
                    resumed.append(line)
                }
                return resumed.count < 2
            }
            #expect(resumed.map(\.seq) == [last - 1, last])
            var fresh: StatusAPI.WatchLine?
            try agent.client.stream("/v1/watch?since=999999") { bytes in
                fresh = try? JSONDecoder().decode(StatusAPI.WatchLine.self, from: Data(bytes))
                return false
            }
            #expect(fresh?.type == .snapshot)
            #expect(fresh?.status?.active != nil)
        }
    }

    @Test("a server flapping every second for 30 s moves the active endpoint at most twice")
    func flappingServer() async throws {
        try await withResources {
            let wanPort = freePort()
            _ = try await LMXServer.start(bed, on: .root, port: wanPort, bind: "127.0.0.1", tls: true)
            let port = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port)
            let agent = try await AgentProcess.start(
                bed,
                config: config(
                    window: 10,
                    endpoints: [
                        wanEndpoint("https://127.0.0.1:\(wanPort)"), #"{"url": "http://10.254.0.11:\#(port)"}"#,
                    ],
                    extraCA: caFile),
                arguments: ["--no-discovery"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)

            for i in 0..<30 {
                await server.set(i % 2 == 0 ? "dead" : "alive")
                try await Task.sleep(for: .seconds(1))
            }
            let list = try JSONDecoder().decode(
                [StatusAPI.Event].self, from: Data(try agent.client.request("GET", "/v1/events?limit=1000").body))
            let switches = list.filter { $0.kind == "active" }
            // First activation, one failover to the WAN, and no return while it flaps.
            #expect(switches.count <= 3, "\(switches.map(\.reason))")
            #expect(agent.active()?.via == .wan)
        }
    }

    @Test("lmx-discover --probe adds verdict, version, instance_id, models and latency")
    func discoverProbe() async throws {
        try await withResources {
            let readyPort = freePort()
            let notReadyPort = freePort()
            let deadPort = freePort()
            _ = try await LMXServer.start(bed, on: .h1, port: readyPort, instance: "probe-\(readyPort)")
            _ = try await LMXServer.start(
                bed, on: .h2, port: notReadyPort, instance: "nr-\(notReadyPort)", mode: "notready")
            let tag = TestBed.tag()
            _ = try await Publish.avahi(bed, on: .h1, name: "probe ready \(tag)", port: readyPort)
            _ = try await Publish.avahi(bed, on: .h2, name: "probe notready \(tag)", port: notReadyPort)
            _ = try await Publish.avahi(bed, on: .h2, name: "probe dead \(tag)", port: deadPort)

            let result = try await Command.discover(["--json", "--probe", "-i", "lmxbr0"], bus: bed.bus(.root))
            #expect(result.status == 0, "\(result.stderr)")
            struct Entry: Decodable {
                var name: String
                var probe: ServerJSON.ProbeJSON?
            }
            let entries = try JSONDecoder().decode([Entry].self, from: Data(result.stdout.utf8))
            let ready = entries.first { $0.name == "probe ready \(tag)" }?.probe
            #expect(ready?.verdict == .ready)
            #expect(ready?.instanceID == "probe-\(readyPort)")
            #expect(ready?.version == "0.1.0")
            #expect(ready?.models == 1)
            #expect(ready?.url == "http://10.254.0.11:\(readyPort)")
            #expect((ready?.latencyMS ?? -1) >= 0)
            #expect(entries.first { $0.name == "probe notready \(tag)" }?.probe?.verdict == .aliveNotReady)
            let dead = entries.first { $0.name == "probe dead \(tag)" }?.probe
            #expect(dead?.verdict == .down)
            #expect(dead?.detail == "connection refused")

            let table = try await Command.discover(["--probe", "-i", "lmxbr0"], bus: bed.bus(.root))
            #expect(table.stdout.contains("STATE"))
            #expect(table.stdout.contains("no model loaded"), "\(table.stdout)")
        }
    }

    @Test(
        "a watch client that closes its connection is gone at once (not at the next heartbeat): a loop of them holds nothing"
    )
    func closedWatchersGone() async throws {
        try await withResources {
            let port = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "w-\(port)")
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [#"{"url": "\#(server.baseURL)"}"#]), arguments: ["--no-discovery"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
            // Twenty watchers, each closing after its first lines (curl gives up after 0.3 s).
            _ = try await Command.run(
                "/bin/sh",
                [
                    "-c",
                    "for i in $(seq 20); do curl -s -o /dev/null --max-time 0.3 --unix-socket \"$0\" http://localhost/v1/watch; done",
                    agent.socket,
                ], timeout: 30)
            func watchers() throws -> Double? {
                let text = String(decoding: try agent.client.request("GET", "/metrics").body, as: UTF8.self)
                return text.split(separator: "\n").first { $0.hasPrefix("lmx_watch_clients ") }
                    .flatMap { Double($0.dropFirst("lmx_watch_clients ".count)) }
            }
            // Well within the 15 s heartbeat that found them before.
            let deadline = ContinuousClock.now + .seconds(2)
            var seen = try watchers()
            while seen != 0, ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(100))
                seen = try watchers()
            }
            #expect(seen == 0)
        }
    }

    @Test(
        "SIGHUP reloads the config file: a new endpoint appears, a removed one goes; a bad file keeps the old one; a misspelt key is named"
    )
    func reloadOnSIGHUP() async throws {
        try await withResources {
            let first = freePort()
            let second = freePort()
            let a = try await LMXServer.start(bed, on: .h1, port: first, instance: "a-\(first)")
            let b = try await LMXServer.start(bed, on: .h2, port: second, instance: "b-\(second)")
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [#"{"url": "\#(a.baseURL)"}"#]), arguments: ["--no-discovery"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == a.baseURL } != nil)

            try config(endpoints: [#"{"url": "\#(b.baseURL)", "api_kye": "s3cret"}"#], top: #""wach_heartbeat": 5"#)
                .write(toFile: agent.configPath, atomically: true, encoding: .utf8)
            agent.process.signal(SIGHUP)
            #expect(
                await agent.process.waitForLine(
                    containing: "config: unknown key endpoints[0].api_kye in \(agent.configPath)", timeout: 5))
            #expect(agent.process.stderr.contains("config: unknown key wach_heartbeat"))
            #expect(!agent.process.stderr.contains("s3cret"))
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == b.baseURL } != nil)
            let routes = try agent.status().candidates.flatMap(\.routes).map(\.baseURL)
            #expect(routes == [b.baseURL])

            try "{broken".write(toFile: agent.configPath, atomically: true, encoding: .utf8)
            agent.process.signal(SIGHUP)
            #expect(await agent.process.waitForLine(containing: "configuration not reloaded", timeout: 5))
            #expect(agent.active()?.baseURL == b.baseURL)
            #expect(agent.isServing)
        }
    }

    @Test("under systemd: READY=1 once serving, STATUS= with the active endpoint, WATCHDOG=1 when asked")
    func systemdNotification() async throws {
        try await withResources {
            let directory = AgentProcess.makeDirectory()
            let notifySocket = directory + "/notify"
            let listener = LiveProcess(
                "/usr/bin/python3",
                [
                    "-c",
                    """
                    import socket, sys
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    s.bind(sys.argv[1])
                    print("bound", flush=True)
                    while True:
                        print(s.recv(4096).decode().replace("\\n", " | "), flush=True)
                    """, notifySocket,
                ])
            try await listener.start()
            #expect(await listener.waitForLine(containing: "bound", timeout: 5))
            let port = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port)
            _ = try await AgentProcess.start(
                bed, config: config(endpoints: [#"{"url": "\#(server.baseURL)"}"#]), arguments: ["--no-discovery"],
                directory: directory, environment: ["NOTIFY_SOCKET": notifySocket, "WATCHDOG_USEC": "2000000"])
            #expect(await listener.waitForLine(containing: "READY=1", timeout: 5))
            #expect(await listener.waitForLine(containing: "WATCHDOG=1", timeout: 5))
            #expect(
                await listener.waitFor(timeout: 5) {
                    $0.stdout.contains("STATUS=Active: ")
                        && $0.stdout.contains(" at \(server.baseURL), ready; 1 route known")
                })
        }
    }

    @Test("lmx-status --watch prints changes and follows the daemon across a restart")
    func statusWatchAcrossRestart() async throws {
        try await withResources {
            let port = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port)
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [#"{"url": "\#(server.baseURL)"}"#]), arguments: ["--no-discovery"])
            #expect(await agent.waitForActive(timeout: 5) { $0 != nil } != nil)
            let watch = LiveProcess("\(TestBed.binDir)/lmx-status", ["--watch", "--socket", agent.socket])
            try await watch.start()
            #expect(await watch.waitForLine(containing: "at \(server.baseURL), ready since", timeout: 5))
            await server.set("dead")
            #expect(await watch.waitForLine(containing: "No server is usable now: ", timeout: 8))

            await agent.stop()
            #expect(await watch.waitForLine(containing: "waiting for it to come back", timeout: 5))
            await server.set("alive")
            let linesBefore = watch.stdoutLines.count
            _ = try await AgentProcess.start(
                bed, config: config(endpoints: [#"{"url": "\#(server.baseURL)"}"#]), arguments: ["--no-discovery"],
                directory: agent.directory)
            // The new daemon's snapshot, then (or in it) the server active again.
            #expect(
                await watch.waitFor(timeout: 8) { process in
                    process.stdoutLines.dropFirst(linesBefore).contains {
                        $0.contains(server.baseURL) && !$0.contains("no active")
                    }
                })
            #expect(watch.isRunning)
        }
    }
}
