import Foundation
import LMXCore
import Testing

/// `examples/prometheus/` checked by Prometheus's own tools (Debian's `prometheus` package), and a
/// real Prometheus scraping two real agents on the test LAN through the example's file-based
/// service discovery, with the example's rules: an alert goes pending when one agent has no
/// usable server.
@Suite("Watching many agents with Prometheus (promtool and a real Prometheus)", .serialized)
struct PrometheusTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    private static var example: String { TestBed.repo + "/examples/prometheus" }

    /// promtool, which `make test` installs (the test bed's packages); its absence fails the test.
    private static func promtool(_ arguments: [String], input: String? = nil) async throws -> CommandResult {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/promtool") else {
            throw TestBedMissing(detail: "promtool is not installed: run `make test` (it installs Debian's prometheus)")
        }
        if let input {
            let file = "/tmp/lmx-promtool-\(TestBed.tag()).txt"
            try input.write(toFile: file, atomically: true, encoding: .utf8)
            defer { try? FileManager.default.removeItem(atPath: file) }
            return try await Command.run("/bin/sh", ["-c", "/usr/bin/promtool \"$@\" < \"$0\"", file] + arguments)
        }
        return try await Command.run("/usr/bin/promtool", arguments)
    }

    @Test("the example's configuration and rules pass promtool check; its rule tests fire each alert and hold it back")
    func promtoolChecks() async throws {
        let config = try await Self.promtool(["check", "config", Self.example + "/prometheus.yml"])
        #expect(config.status == 0, "\(config.stdout) \(config.stderr)")
        let rules = try await Self.promtool(
            ["check", "rules", Self.example + "/rules/lmx-recording.yml", Self.example + "/rules/lmx-alerts.yml"])
        #expect(rules.status == 0, "\(rules.stdout) \(rules.stderr)")
        let tests = try await Self.promtool(["test", "rules", Self.example + "/tests/lmx-alerts-test.yml"])
        #expect(tests.status == 0 && tests.stdout.contains("SUCCESS"), "\(tests.stdout) \(tests.stderr)")
        // The fleet's figures over time: time on the tunnel, switches per hour.
        let recording = try await Self.promtool(["test", "rules", Self.example + "/tests/lmx-recording-test.yml"])
        #expect(
            recording.status == 0 && recording.stdout.contains("SUCCESS"), "\(recording.stdout) \(recording.stderr)")
        // Every alert of the rules is tested firing (and the test names each one).
        let alerts = try String(contentsOfFile: Self.example + "/rules/lmx-alerts.yml", encoding: .utf8)
            .split(separator: "\n").compactMap { line -> String? in
                let text = line.trimmingCharacters(in: .whitespaces)
                return text.hasPrefix("- alert: ") ? String(text.dropFirst(9)) : nil
            }
        let testText = try String(contentsOfFile: Self.example + "/tests/lmx-alerts-test.yml", encoding: .utf8)
        #expect(alerts.count == 5)
        for alert in alerts { #expect(testText.contains("alertname: \(alert)"), "\(alert) is not tested") }
        // promtool fails a rule test that is wrong (the test can fail): an alert expected that never fires.
        let wrong = testText.replacingOccurrences(of: "exp_alerts: []", with: "exp_alerts: [{exp_labels: {x: y}}]")
        let wrongFile = "/tmp/lmx-rules-test-\(TestBed.tag()).yml"
        try wrong.replacingOccurrences(of: "../rules/", with: Self.example + "/rules/")
            .write(toFile: wrongFile, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: wrongFile) }
        #expect(try await Self.promtool(["test", "rules", wrongFile]).status != 0)
    }

    @Test(
        "a real Prometheus scrapes two agents through the example's file SD: both up, promtool accepts their metrics, the pairing's expiry is a series, and the agent with no usable server has its alert pending"
    )
    func fleet() async throws {
        try await withResources {
            let serverPort = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: serverPort, instance: "fleet-\(serverPort)")
            let metricsA = freePort()
            let metricsB = freePort()
            let agentA = try await AgentProcess.start(
                bed,
                config: config(endpoints: [#"{"url": "\#(server.baseURL)", "name": "Studio", "allow_insecure": true}"#]
                ),
                arguments: ["--no-discovery", "--gateway", "off", "--metrics-address", "127.0.0.1:\(metricsA)"])
            // B's only server never answers (nothing listens there): no usable server.
            let agentB = try await AgentProcess.start(
                bed,
                config: config(
                    endpoints: [
                        #"{"url": "http://\#(bed.address(.h1)):\#(freePort())", "name": "Gone", "allow_insecure": true}"#
                    ]),
                arguments: ["--no-discovery", "--gateway", "off", "--metrics-address", "127.0.0.1:\(metricsB)"])
            #expect(await agentA.waitForActive(timeout: 10) { $0?.baseURL == server.baseURL } != nil)
            // A pairing of A's that expires in two days.
            let expires = Int(Date().timeIntervalSince1970) + 2 * 86_400
            let paired = try await agentA.pair(
                pairingLink(
                    name: "Office", url: "https://fleet-tunnel.example.com", extra: "&key=admin-key&exp=\(expires)"))
            #expect(paired.status == 0, "\(paired.stdout) \(paired.stderr)")

            // promtool's lint of a live agent's metrics (an active server, a pairing, histograms).
            let text = try await Command.run("/usr/bin/curl", ["-s", "http://127.0.0.1:\(metricsA)/metrics"])
            #expect(text.stdout.contains(#"lmx_pairing_expiry_timestamp_seconds{pairing="Office"} \#(expires)"#))
            #expect(text.stdout.contains(#"lmx_active_server{server="fleet-\#(serverPort)",via="lan"} 1"#))
            let lint = try await Self.promtool(["check", "metrics"], input: text.stdout)
            #expect(lint.status == 0, "\(lint.stdout) \(lint.stderr)")

            // Prometheus with the example's rules, scraping both through a targets file.
            let directory = agentA.directory + "/prometheus"
            try FileManager.default.createDirectory(atPath: directory + "/targets", withIntermediateDirectories: true)
            try """
            - targets: ["127.0.0.1:\(metricsA)", "127.0.0.1:\(metricsB)"]
              labels:
                site: test-lan
            """.write(toFile: directory + "/targets/agents.yml", atomically: true, encoding: .utf8)
            try """
            global:
              scrape_interval: 1s
              evaluation_interval: 1s
            rule_files:
              - \(Self.example)/rules/lmx-recording.yml
              - \(Self.example)/rules/lmx-alerts.yml
            scrape_configs:
              - job_name: lmx-agent
                file_sd_configs:
                  - files: ["\(directory)/targets/*.yml"]
                    refresh_interval: 1s
            """.write(toFile: directory + "/prometheus.yml", atomically: true, encoding: .utf8)
            let webPort = freePort()
            let prometheus = LiveProcess(
                "/usr/bin/prometheus",
                [
                    "--config.file=\(directory)/prometheus.yml", "--storage.tsdb.path=\(directory)/data",
                    "--web.listen-address=127.0.0.1:\(webPort)", "--log.level=warn",
                ])
            try await prometheus.start()
            let api = "http://127.0.0.1:\(webPort)/api/v1"
            func get(_ path: String) async throws -> [String: Any] {
                let result = try await Command.run("/usr/bin/curl", ["-s", "-m", "5", api + path])
                return (try? JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any]) ?? [:]
            }
            func pendingAlerts() async throws -> [[String: Any]] {
                let data = try await get("/alerts")["data"] as? [String: Any]
                return data?["alerts"] as? [[String: Any]] ?? []
            }
            // The recorded fleet counts: one agent on the LAN, one on nothing. The recording group is
            // evaluated on its own schedule, so it is polled with the alerts.
            func fleetCounts() async throws -> [String: String] {
                let byVia = try await get("/query?query=via:lmx_agents:count")
                let rows = (byVia["data"] as? [String: Any])?["result"] as? [[String: Any]] ?? []
                var counts: [String: String] = [:]
                for row in rows {
                    if let via = (row["metric"] as? [String: String])?["via"],
                        let value = (row["value"] as? [Any])?.last as? String
                    {
                        counts[via] = value
                    }
                }
                return counts
            }
            var counts: [String: String] = [:]
            var alerts: [[String: Any]] = []
            var upCount = 0
            let deadline = ContinuousClock.now + .seconds(30)
            while ContinuousClock.now < deadline {
                let up = try await get("/query?query=sum(up%7Bjob%3D%22lmx-agent%22%7D)")
                let result = ((up["data"] as? [String: Any])?["result"] as? [[String: Any]])?.first
                upCount = Int((result?["value"] as? [Any])?.last as? String ?? "") ?? 0
                alerts = try await pendingAlerts()
                let noServer = alerts.contains {
                    ($0["labels"] as? [String: String])?["alertname"] == "LMXAgentNoUsableServer"
                }
                let expiring = alerts.contains {
                    ($0["labels"] as? [String: String])?["alertname"] == "LMXPairingExpiresSoon"
                }
                counts = try await fleetCounts()
                let recorded = counts["lan"] == "1" && counts["none"] == "1"
                if upCount == 2, noServer, expiring, recorded { break }
                try await Task.sleep(for: .milliseconds(500))
            }
            #expect(upCount == 2, "targets up: \(upCount); \(prometheus.stderr.suffix(2000))")
            let noServer = alerts.filter {
                ($0["labels"] as? [String: String])?["alertname"] == "LMXAgentNoUsableServer"
            }
            #expect(noServer.count == 1, "\(alerts)")
            #expect((noServer.first?["labels"] as? [String: String])?["instance"] == "127.0.0.1:\(metricsB)")
            #expect(noServer.first?["state"] as? String == "pending", "\(noServer)")
            let expiring = alerts.filter {
                ($0["labels"] as? [String: String])?["alertname"] == "LMXPairingExpiresSoon"
            }
            #expect((expiring.first?["labels"] as? [String: String])?["pairing"] == "Office", "\(alerts)")
            #expect((expiring.first?["labels"] as? [String: String])?["instance"] == "127.0.0.1:\(metricsA)")
            #expect(counts["lan"] == "1" && counts["none"] == "1", "\(counts)")

            // Every query of the Grafana dashboard, as Grafana sends it (its variable at "All"),
            // against this Prometheus: each is valid PromQL, and those over the agents' paths and
            // switches have a series for each agent.
            let queries = try Self.dashboardQueries()
            #expect(queries.count >= 10)
            for query in queries {
                let expr = query.replacingOccurrences(of: "$instance", with: ".*")
                var answer: [String: Any] = [:]
                let deadline = ContinuousClock.now + .seconds(10)
                repeat {
                    let result = try await Command.run(
                        "/usr/bin/curl", ["-s", "-m", "5", "-G", api + "/query", "--data-urlencode", "query=" + expr])
                    answer =
                        (try? JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any]) ?? [:]
                    let rows = (answer["data"] as? [String: Any])?["result"] as? [[String: Any]] ?? []
                    // Gateway figures need traffic (none here): valid and empty is their answer.
                    if !expr.contains("lmx_active") || rows.count >= 2 { break }
                    try await Task.sleep(for: .milliseconds(500))
                } while ContinuousClock.now < deadline
                #expect(answer["status"] as? String == "success", "\(expr): \(answer)")
                if expr.hasPrefix("instance:lmx_active") {
                    let rows = (answer["data"] as? [String: Any])?["result"] as? [[String: Any]] ?? []
                    #expect(rows.count == 2, "\(expr): \(rows)")
                }
            }
            await prometheus.stop()
            withExtendedLifetime(agentB) {}  // (its daemon runs until here)
        }
    }

    /// The PromQL of every panel of `examples/grafana/lmx-fleet.json`, and of its variable.
    static func dashboardQueries() throws -> [String] {
        let data = try Data(contentsOf: URL(fileURLWithPath: TestBed.repo + "/examples/grafana/lmx-fleet.json"))
        let dashboard = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        let panels = dashboard["panels"] as? [[String: Any]] ?? []
        var queries = panels.flatMap { panel in
            (panel["targets"] as? [[String: Any]] ?? []).compactMap { $0["expr"] as? String }
        }
        // label_values(metric, label) is Grafana's: the metric is what Prometheus is asked for.
        for variable in (dashboard["templating"] as? [String: Any])?["list"] as? [[String: Any]] ?? [] {
            if let definition = variable["definition"] as? String, definition.hasPrefix("label_values("),
                let metric = definition.dropFirst(13).split(separator: ",").first
            {
                queries.append(String(metric))
            }
        }
        return queries
    }
}
