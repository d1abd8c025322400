import Foundation
import LMXCore
import LMXStatusClient
import Testing

/// A hostile server (`scripts/fixtures/hostile-server.py`) on a test host, as the paired server: every
/// misbehaviour it knows goes through the agent's probes, its passive health follower (the
/// server's event stream) and the gateway. After each, the daemon is up, `lmx-status` answers and
/// its memory stays bounded.
@Suite("Hostile upstream: every misbehaviour of a server, through probes, events and the gateway", .serialized)
struct HostileUpstreamTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    static let script = "\(TestBed.repo)/scripts/fixtures/hostile-server.py"
    /// The daemon's resident memory may not pass this after any misbehaviour (a debug build
    /// serving one route idles at about 30 MiB).
    static let rssBoundKiB = 96 * 1024

    /// The hostile server on test host 1 (its namespace and address), once it listens.
    func startServer(port: Int, instance: String) async throws -> LiveProcess {
        let server = LiveProcess(
            "/usr/sbin/ip",
            [
                "netns", "exec", bed["LMX_TESTBED_H1_NS"], "/usr/bin/python3", Self.script, "--bind",
                bed.address(.h1), "--port", String(port), "--instance", instance,
            ])
        try await server.start()
        #expect(await server.waitForLine(containing: "listening", timeout: 10))
        return server
    }

    @Test("the daemon survives every misbehaviour (73, in 14 classes) with its status answering and RSS under 96 MiB")
    func survivesEverything() async throws {
        try await withResources {
            let modes = try await Command.run("/usr/bin/python3", [Self.script, "--list"]).stdout
                .split(separator: "\n").map(String.init)
            #expect(modes.count >= 40)
            let port = freePort()
            let gatewayPort = freePort()
            let address = bed.address(.h1)
            let server = try await startServer(port: port, instance: "hostile-\(port)")
            func set(_ mode: String) async {
                let before = server.stdoutLines.filter { $0 == "ok \(mode)" }.count
                server.send(mode)
                _ = await server.waitFor(timeout: 5) { p in p.stdoutLines.filter { $0 == "ok \(mode)" }.count > before }
            }
            let endpoint =
                #"{"url": "http://\#(address):\#(port)", "name": "Hostile", "api_key": "infer-key", "admin_key": "admin-key", "allow_insecure": true}"#
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [endpoint], top: #""gateway": {"hold_seconds": 0.3}"#),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            let base = "http://127.0.0.1:\(gatewayPort)/v1"
            #expect(await agent.waitForActive(timeout: 10) { $0 != nil } != nil)
            // 2 MiB of JSON: past the read-ahead, so it streams to the server while it is read.
            let bigBody = agent.directory + "/big-body.json"
            try
                (#"{"model":"hostile/model","messages":[{"role":"user","content":""#
                + String(repeating: "x", count: 2 << 20) + #""}]}"#)
                .write(toFile: bigBody, atomically: true, encoding: .utf8)

            var survived = 0
            var peakRSS = 0
            var refreshes = 0
            for mode in modes {
                // Start from a healthy, active route so that the gateway forwards to it.
                await set("good")
                if agent.active() == nil {
                    _ = try? agent.client.request("POST", "/v1/refresh")
                    refreshes += 1
                    _ = await agent.waitForActive(timeout: 8) { $0 != nil }
                }
                await set(mode)
                // Through the gateway: a plain request and a streamed completion.
                let plain = try await curl(["-m", "4", base + "/models"])
                let streamed = try await curl(
                    [
                        "-m", "4", "-N", "-H", "Content-Type: application/json", "--data",
                        #"{"model":"hostile/model","stream":true,"messages":[]}"#,
                        base + "/chat/completions",
                    ])
                // A request body past the read-ahead (streamed to the server as it comes).
                let upload = try await curl(
                    [
                        "-m", "4", "-H", "Content-Type: application/json", "--data-binary", "@" + bigBody,
                        base + "/chat/completions",
                    ])
                // Through the probes (and, while the route stays active, its event stream).
                let probesBefore = (try? agent.status())?.candidates.flatMap(\.routes).first?.probes ?? 0
                _ = try? agent.client.request("POST", "/v1/refresh")
                _ = await agent.waitForRoute(timeout: 5) { $0.probes > probesBefore }
                try await Task.sleep(for: .milliseconds(100))

                let alive = agent.process.isRunning
                let statusCommand = try await Command.run(
                    "\(TestBed.binDir)/lmx-status", ["--socket", agent.socket], environment: ["LMX_SOCKET": ""],
                    timeout: 10)
                let answers = statusCommand.status == 0 || statusCommand.status == 1
                let rss = agent.memoryKiB()
                peakRSS = max(peakRSS, rss)
                #expect(alive, "lmx-agentd died after \(mode): \(agent.process.stderr.suffix(2000))")
                #expect(answers, "lmx-status did not answer after \(mode): \(statusCommand.stderr)")
                #expect(rss < Self.rssBoundKiB, "RSS \(rss) KiB after \(mode)")
                // The gateway answers every request with a status, never a hang past curl's limit
                // on its side or a crash (curl's 28 is its own 4 s limit on an endless answer).
                #expect(
                    plain.status != 0 || plain.curlExit == 28 || plain.curlExit == 18,
                    "\(mode): GET /v1/models: curl exit \(plain.curlExit)")
                #expect(
                    streamed.status != 0 || streamed.curlExit == 28 || streamed.curlExit == 18,
                    "\(mode): stream: curl exit \(streamed.curlExit)")
                #expect(
                    upload.status != 0 || [18, 28, 52, 55, 56].contains(upload.curlExit),
                    "\(mode): upload: curl exit \(upload.curlExit)")
                switch mode {
                case "dup-connection-named":
                    // A header the upstream's Connection names is of its hop only.
                    #expect(plain.status == 200)
                    #expect(!plain.headers.lowercased().contains("x-secret-hop"), "\(plain.headers)")
                case "connection-flood":
                    // A head whose Connection lists thousands of names is refused, not passed on.
                    #expect(plain.status == 502, "\(plain.status) \(plain.body.prefix(300))")
                case "sse-cut-mid-event":
                    // The whole event passes, the half one does not, and the error event stands
                    // on its own after a blank line.
                    #expect(streamed.body.contains(#"{"content":"one"}"#))
                    #expect(!streamed.body.contains("conte\n") && !streamed.body.contains(#""conteevent"#))
                    #expect(streamed.body.contains("\n\nevent: error\ndata: "), "\(streamed.body)")
                    #expect(streamed.body.contains("upstream_lost"))
                case let busy where busy.hasPrefix("retry-after-"):
                    // Whatever the value, the busy answer reaches the client (the only route).
                    #expect(plain.status == 429, "\(mode): \(plain.status)")
                default:
                    break
                }
                if alive && answers && rss < Self.rssBoundKiB { survived += 1 }
            }
            #expect(survived == modes.count)
            print(
                "figure: hostile upstream: \(survived) of \(modes.count) misbehaviours survived; peak RSS \(peakRSS / 1024) MiB (bound \(Self.rssBoundKiB / 1024) MiB); \(refreshes) recoveries"
            )
            // And it still works: back to good, the route is used again.
            await set("good")
            _ = try? agent.client.request("POST", "/v1/refresh")
            #expect(await agent.waitForActive(timeout: 10) { $0 != nil } != nil)
            let after = try await curl(["-m", "5", base + "/models"])
            #expect(after.status == 200)
            await server.stop()
        }
    }

    struct Fetched {
        var status: Int
        var headers: String
        var body: String
        var curlExit: Int32
    }

    /// curl with the response's headers and body; status 0 when no answer came.
    func curl(_ arguments: [String]) async throws -> Fetched {
        let headerFile = "/tmp/lmx-hostile-headers-\(TestBed.tag())"
        defer { try? FileManager.default.removeItem(atPath: headerFile) }
        let result = try await Command.run(
            "/usr/bin/curl", ["-s", "-D", headerFile, "-o", "-", "-w", "\n%{http_code}"] + arguments, timeout: 30)
        var lines = result.stdout.split(separator: "\n", omittingEmptySubsequences: false)
        let code = lines.popLast().flatMap { Int($0) } ?? 0
        let headers = (try? String(contentsOfFile: headerFile, encoding: .isoLatin1)) ?? ""
        return Fetched(status: code, headers: headers, body: lines.joined(separator: "\n"), curlExit: result.status)
    }

    @Test(
        "a server that answers before reading the body: the data path holds the answer until the client has sent it all, then serves the next request"
    )
    func earlyAnswerHeld() async throws {
        try await withResources {
            let port = freePort()
            let gatewayPort = freePort()
            let address = bed.address(.h1)
            let server = try await startServer(port: port, instance: "early-\(port)")
            let endpoint =
                #"{"url": "http://\#(address):\#(port)", "name": "Early", "api_key": "infer-key", "allow_insecure": true}"#
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [endpoint]),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForActive(timeout: 10) { $0 != nil } != nil)
            server.send("early-answer-drain")
            #expect(await server.waitForLine(containing: "ok early-answer-drain", timeout: 5))
            // Half of a 1 MiB body (past the read-ahead: the gateway forwards it, the server
            // answers at once), a second's wait for anything to come back, the other half, the
            // answer, then a second request on the same connection.
            let client = #"""
                import socket, sys
                body = b'{"model":"hostile/model","messages":[{"role":"user","content":"' + b"x" * (1 << 20) + b'"}]}'
                s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(body) + body[: len(body) // 2])
                s.settimeout(1.0)
                try:
                    early = s.recv(65536)
                except socket.timeout:
                    early = b""
                s.sendall(body[len(body) // 2:])
                s.settimeout(10)
                answer = early
                while b"\r\n\r\n" not in answer:
                    answer += s.recv(65536)
                head, rest = answer.split(b"\r\n\r\n", 1)
                length = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
                while len(rest) < length:
                    rest += s.recv(65536)
                s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                second = s.recv(65536)
                print("early" if early else "held", head.split(b"\r\n")[0].decode(), second.split(b"\r\n")[0].decode())
                """#
            let result = try await Command.run(
                "/usr/bin/python3", ["-c", client, String(gatewayPort)], timeout: 30)
            #expect(
                result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
                    == "held HTTP/1.1 200 OK HTTP/1.1 200 OK", "\(result.stdout) \(result.stderr)")
            let metrics = String(decoding: try agent.client.request("GET", "/metrics").body, as: UTF8.self)
            #expect(metrics.contains("lmx_gateway_general_path_total 0"), "handed to the general path")
        }
    }

}
