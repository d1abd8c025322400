import Foundation
import LMXCore
import LMXSystem
import Testing

/// What a client or a server may send the gateway to desynchronize it, make it work quadratically
/// or grow without bound, or act on another local user's objects: each reproduced against the real
/// daemon and real servers on the test LAN, and refused or bounded.
@Suite("The gateway: nothing a client or a server sends desyncs it or outgrows it", .serialized)
struct GatewayDesyncTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    private func endpoint(_ server: LMXServer, name: String) -> String {
        #"{"url": "\#(server.baseURL)", "name": "\#(name)", "allow_insecure": true}"#
    }

    /// The agent's CPU time so far (user and system), seconds, from /proc/PID/stat.
    private func cpuSeconds(_ agent: AgentProcess) -> Double {
        let pid = agent.process.pid
        guard pid > 0, let bytes = try? FileSystem.read("/proc/\(pid)/stat", limit: 4096) else { return -1 }
        let text = String(decoding: bytes, as: UTF8.self)
        // The fields after the command's closing parenthesis: state is the 3rd; utime the 14th, stime the 15th.
        guard let close = text.lastIndex(of: ")") else { return -1 }
        let fields = text[text.index(after: close)...].split(separator: " ")
        guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { return -1 }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    @Test(
        "a PUT longer than the read-ahead on a kept connection the server closes as it comes is not sent again without its body (502); the next client is served"
    )
    func noBodylessResend() async throws {
        try await withResources {
            let port = freePort()
            let gatewayPort = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "resend-\(port)")
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [endpoint(server, name: "Studio")]),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
            // One client on one connection: a GET leaves a kept connection to the server, then the
            // PUT (300 KiB: past the 256 KiB read-ahead, all of it sent at once) meets its close.
            let script = #"""
                import http.client, sys
                conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=15)
                conn.request("GET", "/v1/echo")
                first = conn.getresponse(); first.read()
                print("get", first.status, flush=True)
                sys.stdin.readline()
                try:
                    conn.request("PUT", "/v1/files/x", body=b"x" * (300 << 10), headers={"Content-Type": "application/octet-stream"})
                    answer = conn.getresponse(); answer.read()
                    print("put", answer.status, flush=True)
                except Exception as error:
                    print("put error", type(error).__name__, flush=True)
                """#
            let client = LiveProcess("/usr/bin/python3", ["-c", script, String(gatewayPort)])
            try await client.start()
            #expect(await client.waitForLine(containing: "get 200", timeout: 10))
            await server.set("stale")
            client.send("go")
            #expect(await client.waitForLine(containing: "put", timeout: 15))
            let put = client.stdoutLines.first { $0.hasPrefix("put") } ?? ""
            // The gateway's own 502 (or the connection closed under a client still sending):
            // never the server's 405 to a request that went again with no body.
            #expect(put == "put 502" || put.hasPrefix("put error"), "\(put)")
            await client.stop()
            #expect(server.requests.filter { $0.hasPrefix("REQ PUT") }.count == 1, "\(server.requests)")
            // Every request after it is read by the server as a request, never as that body.
            for n in 0..<4 {
                let after = try await curl(["-m", "8", "http://127.0.0.1:\(gatewayPort)/v1/echo"])
                #expect(after.status == 200, "request \(n) after the PUT: \(after.status)")
            }
        }
    }

    @Test(
        "Expect: 100-continue is answered at once: curl's 1.5 MB upload does not wait its second; the body arrives whole"
    )
    func expectContinue() async throws {
        try await withResources {
            let port = freePort()
            let gatewayPort = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "continue-\(port)")
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [endpoint(server, name: "Studio")]),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
            let file = agent.directory + "/upload.bin"
            _ = try await Command.run("/bin/sh", ["-c", "head -c 1500000 /dev/urandom > \"$0\"", file])
            let expected = try await Command.run("/usr/bin/sha256sum", [file])
            let sent = try await Command.run(
                "/usr/bin/curl",
                [
                    "-s", "-m", "10", "-H", "Expect: 100-continue", "--data-binary", "@" + file, "-w",
                    "\n%{time_total}", "http://127.0.0.1:\(gatewayPort)/v1/upload",
                ])
            let lines = sent.stdout.split(separator: "\n").map(String.init)
            let seconds = Double(lines.last ?? "") ?? 99
            let answer =
                (try? JSONSerialization.jsonObject(with: Data((lines.first ?? "").utf8)) as? [String: Any]) ?? [:]
            #expect(answer["length"] as? Int == 1_500_000)
            #expect(answer["sha256"] as? String == String(expected.stdout.prefix(64)))
            // Unanswered, curl waits a whole second for the 100 before it sends the body.
            #expect(seconds < 0.8, "the upload took \(seconds) s")
            // Any other expectation goes to the general path: answered, never a hang.
            let other = try await curl(
                [
                    "-m", "5", "-H", "Expect: something-else", "--data", "{}",
                    "http://127.0.0.1:\(gatewayPort)/v1/upload",
                ])
            #expect(other.status != 0)
        }
    }

    @Test(
        "a request's Connection header listing thousands of names is refused (400) at once; a server's answer of the kind is refused (502); CPU stays small"
    )
    func connectionNames() async throws {
        try await withResources {
            let port = freePort()
            let gatewayPort = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "names-\(port)")
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [endpoint(server, name: "Studio")]),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
            let before = cpuSeconds(agent)
            // One header of 3,000 names (17 KiB: a head stays within the 32 KiB the gateway
            // reads), and 5,000 names in 1,000 headers.
            let names = (0..<3_000).map { "n\($0)" }.joined(separator: ",")
            let oneHeader = try await curl(
                ["-m", "10", "-H", "Connection: \(names)", "http://127.0.0.1:\(gatewayPort)/v1/models"])
            let headerFile = agent.directory + "/connection-headers.txt"
            try (0..<1_000).map { "Connection: a\($0), b\($0), c\($0), d\($0), e\($0)" }.joined(separator: "\n")
                .write(toFile: headerFile, atomically: true, encoding: .utf8)
            let manyHeaders = try await curl(
                ["-m", "10", "-H", "@" + headerFile, "http://127.0.0.1:\(gatewayPort)/v1/models"])
            let spent = cpuSeconds(agent) - before
            #expect(oneHeader.status == 400 && oneHeader.body.contains("too_many_connection_options"), "\(oneHeader)")
            #expect(manyHeaders.status == 400 && manyHeaders.body.contains("too_many_connection_options"))
            #expect(spent >= 0 && spent < 0.5, "the daemon spent \(spent) s of CPU on two refused heads")
            // A client's usual Connection values are served as before.
            let usual = try await curl(
                ["-m", "5", "-H", "Connection: keep-alive, te", "http://127.0.0.1:\(gatewayPort)/v1/models"])
            #expect(usual.status == 200)
            // TRACE and CONNECT: refused, never forwarded with the route's keys.
            let trace = try await curl(["-m", "5", "-X", "TRACE", "http://127.0.0.1:\(gatewayPort)/v1/models"])
            #expect(trace.status == 405 && trace.body.contains("method_not_allowed"), "\(trace)")
            let connect = try await Command.run(
                "/usr/bin/python3",
                [
                    "-c",
                    #"""
                    import socket, sys
                    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
                    s.sendall(b"CONNECT 10.254.0.11:22 HTTP/1.1\r\nHost: 10.254.0.11:22\r\n\r\n")
                    print(s.recv(200).split(b"\r\n")[0].decode())
                    """#, String(gatewayPort),
                ], timeout: 10)
            #expect(connect.stdout.hasPrefix("HTTP/1.1 405"), "\(connect.stdout) \(connect.stderr)")
            #expect(!server.requests.contains { $0.contains("TRACE") || $0.contains("CONNECT") })
        }
    }

    @Test("a server's answer head listing 5,000 Connection names among 2,500 headers: 502 in milliseconds of CPU")
    func answerConnectionNames() async throws {
        try await withResources {
            let port = freePort()
            let gatewayPort = freePort()
            let server = try await HostileUpstreamTests().startServer(port: port, instance: "flood-\(port)")
            let endpoint =
                #"{"url": "http://\#(bed.address(.h1)):\#(port)", "name": "Flood", "api_key": "infer-key", "allow_insecure": true}"#
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [endpoint]),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForActive(timeout: 10) { $0 != nil } != nil)
            server.send("connection-flood")
            #expect(await server.waitForLine(containing: "ok connection-flood", timeout: 5))
            let before = cpuSeconds(agent)
            var statuses: [Int] = []
            var said = ""
            for _ in 0..<3 {
                let answer = try await curl(["-m", "10", "http://127.0.0.1:\(gatewayPort)/v1/models"])
                statuses.append(answer.status)
                said = answer.body
            }
            // The 502 says why.
            #expect(said.contains("Connection header listing more than 32 names"), "\(said)")
            let spent = cpuSeconds(agent) - before
            #expect(statuses == [502, 502, 502], "\(statuses)")
            #expect(spent >= 0 && spent < 0.5, "the daemon spent \(spent) s of CPU on three such answers")
            await server.stop()
        }
    }

    @Test(
        "a body naming model or collection twice (or with escapes) is refused with 400 naming the key, on the data path and the general path"
    )
    func ambiguousBodies() async throws {
        try await withResources {
            let port = freePort()
            let gatewayPort = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "dup-\(port)")
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [endpoint(server, name: "Studio")]),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
            func post(_ path: String, _ body: String) async throws -> (status: Int, body: String) {
                try await curl(
                    [
                        "-m", "10", "-H", "Content-Type: application/json", "--data-binary", body,
                        "http://127.0.0.1:\(gatewayPort)" + path,
                    ])
            }
            let chat = try await post(
                "/v1/chat/completions", #"{"model": "test/model", "messages": [], "model": "other/model"}"#)
            #expect(chat.status == 400 && chat.body.contains("ambiguous_body") && chat.body.contains(#"\"model\""#))
            let escaped = try await post(
                "/v1/chat/completions", #"{"model": "test/model", "\u006dodel": "other/model", "messages": []}"#)
            #expect(escaped.status == 400 && escaped.body.contains("ambiguous_body"), "\(escaped)")
            // The RAG ingest (handed to the general path, which learns where it lands).
            let ingest = try await post(
                "/v1/rag/ingest", #"{"collection": "mine", "documents": ["d"], "collection": "theirs"}"#)
            #expect(ingest.status == 400 && ingest.body.contains(#"\"collection\""#), "\(ingest)")
            #expect(!server.requests.contains { $0.contains("/v1/rag/ingest") })
            // Named once: served.
            let once = try await post(
                "/v1/chat/completions", #"{"model": "test/model", "messages": [{"role": "user", "content": "hi"}]}"#)
            #expect(once.status == 200)
        }
    }

    @Test(
        "affinity is per local user: another user's ingest of a collection of the same name does not move where this user's queries go"
    )
    func affinityPerUser() async throws {
        try await withResources {
            let portA = freePort()
            let portB = freePort()
            let gatewayPort = freePort()
            let a = try await LMXServer.start(bed, on: .h1, port: portA, instance: "alpha-\(portA)")
            let b = try await LMXServer.start(bed, on: .h2, port: portB, instance: "beta-\(portB)")
            let agent = try await AgentProcess.start(
                bed,
                config: config(
                    window: 1, endpoints: [endpoint(a, name: "Alpha"), endpoint(b, name: "Beta")],
                    top: #""prefer": ["beta-\#(portB)"], "gateway": {"hold_seconds": 1}"#),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            func call(_ user: [String], _ path: String, _ body: String) async throws -> (status: Int, server: String) {
                let result = try await Command.run(
                    "/usr/bin/setpriv",
                    user + [
                        "/usr/bin/curl", "-s", "-m", "10", "-H", "Content-Type: application/json", "-d", body,
                        "http://127.0.0.1:\(gatewayPort)" + path, "-w", "\n%{http_code}",
                    ], timeout: 20)
                var lines = result.stdout.split(separator: "\n").map(String.init)
                let status = Int(lines.popLast() ?? "") ?? 0
                let object =
                    (try? JSONSerialization.jsonObject(with: Data(lines.joined(separator: "\n").utf8)) as? [String: Any])
                    ?? [:]
                return (status, object["server"] as? String ?? "")
            }
            let root = ["--reuid=0", "--regid=0", "--keep-groups"]
            let nobody = ["--reuid=65534", "--regid=65534", "--clear-groups"]
            // Beta away: root's collection "docs" is made on Alpha.
            await b.set("dead")
            #expect(await agent.waitForActive(timeout: 10) { $0?.baseURL == a.baseURL } != nil)
            let mine = try await call(root, "/v1/rag/ingest", #"{"collection": "docs", "documents": ["d"]}"#)
            #expect(mine.status == 200 && mine.server == "alpha-\(portA)", "\(mine)")
            // Beta back and preferred: another user's "docs" is made there.
            await b.set("alive")
            #expect(await agent.waitForActive(timeout: 10) { $0?.baseURL == b.baseURL } != nil)
            let theirs = try await call(nobody, "/v1/rag/ingest", #"{"collection": "docs", "documents": ["e"]}"#)
            #expect(theirs.status == 200 && theirs.server == "beta-\(portB)", "\(theirs)")
            // Each user's queries go to their own collection's server.
            let rootQuery = try await call(root, "/v1/rag/query", #"{"collection": "docs", "query": "q"}"#)
            #expect(rootQuery.status == 200 && rootQuery.server == "alpha-\(portA)", "\(rootQuery)")
            let theirQuery = try await call(nobody, "/v1/rag/query", #"{"collection": "docs", "query": "q"}"#)
            #expect(theirQuery.status == 200 && theirQuery.server == "beta-\(portB)", "\(theirQuery)")
        }
    }

    @Test("junk model names age out of the traffic table: a real model used after 100 junk names is shown by its name")
    func trafficTable() async throws {
        try await withResources {
            let port = freePort()
            let gatewayPort = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "traffic-\(port)")
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [endpoint(server, name: "Studio")]),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
            // 100 junk names from one client, on one connection (curl reuses it for each URL).
            let junk = (0..<100).flatMap { n in
                [
                    "-H", "Content-Type: application/json", "--data", #"{"model": "junk-\#(n)", "messages": []}"#,
                    "-o", "/dev/null", "http://127.0.0.1:\(gatewayPort)/v1/chat/completions", "--next",
                ]
            }
            _ = try await Command.run("/usr/bin/curl", ["-s", "-m", "30"] + junk.dropLast(), timeout: 60)
            let real = try await curl(
                [
                    "-m", "10", "-H", "Content-Type: application/json", "--data",
                    #"{"model": "test/model", "messages": [{"role": "user", "content": "hi"}]}"#,
                    "http://127.0.0.1:\(gatewayPort)/v1/chat/completions",
                ])
            #expect(real.status == 200)
            let traffic = try JSONDecoder().decode(
                StatusAPI.Traffic.self, from: Data(try agent.client.request("GET", "/v1/traffic").body))
            #expect(traffic.models.contains { $0.model == "test/model" }, "\(traffic.models.map(\.model))")
            #expect(traffic.models.count <= 64 && !traffic.models.contains { $0.model == "junk-0" })
            let metrics = String(decoding: try agent.client.request("GET", "/metrics").body, as: UTF8.self)
            #expect(metrics.contains(#"model="test/model""#))
            #expect(!metrics.contains(#"model="junk-0""#))
        }
    }

    @Test(
        "a flood of pipelined requests behind a long answer is parsed one request ahead: memory per connection stays bounded and is given back"
    )
    func pipeliningFlood() async throws {
        try await withResources {
            let port = freePort()
            let gatewayPort = freePort()
            // A stream of 200 events 50 ms apart: ten seconds in which the pipelined requests wait.
            let server = try await LMXServer.start(
                bed, on: .h1, port: port, instance: "flood-\(port)",
                extra: ["--stream-chunks", "200", "--stream-interval", "50"])
            let agent = try await AgentProcess.start(
                bed,
                config: config(
                    endpoints: [endpoint(server, name: "Studio")],
                    top: #""gateway": {"max_connections_per_user": 256}"#),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
            // Warm the gateway up (its first connections, buffers and tables) before the baseline.
            for _ in 0..<3 { _ = try await curl(["-m", "5", "http://127.0.0.1:\(gatewayPort)/v1/models"]) }
            try await Task.sleep(for: .seconds(1))
            let baseline = agent.memoryKiB()
            let script = #"""
                import json, socket, sys, threading
                port, count = int(sys.argv[1]), int(sys.argv[2])
                stream = json.dumps({"model": "test/model", "stream": True, "messages": []}).encode()
                head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(stream)
                tiny = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                flood = tiny * ((160 << 10) // len(tiny))
                sockets = []
                def send(s):
                    try:
                        s.sendall(head + stream + flood)
                    except OSError:
                        pass
                for _ in range(count):
                    s = socket.create_connection(("127.0.0.1", port), timeout=30)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
                    sockets.append(s)
                    threading.Thread(target=send, args=(s,), daemon=True).start()
                print("sent", len(flood) * count, flush=True)
                sys.stdin.readline()
                for s in sockets:
                    s.close()
                print("closed", flush=True)
                """#
            let flood = LiveProcess("/usr/bin/python3", ["-c", script, String(gatewayPort), "64"])
            try await flood.start()
            #expect(await flood.waitForLine(containing: "sent", timeout: 20))
            // The pipelined requests wait behind the streams (ten seconds): memory now is theirs.
            try await Task.sleep(for: .seconds(3))
            let during = agent.memoryKiB()
            flood.send("close")
            #expect(await flood.waitForLine(containing: "closed", timeout: 10))
            await flood.stop()
            // Given back once the connections are gone and the gateway is quiet (HeapReturn).
            var after = agent.memoryKiB()
            for _ in 0..<40 where after > baseline + 6 * 1024 {
                try await Task.sleep(for: .milliseconds(500))
                after = agent.memoryKiB()
            }
            let perConnection = (during - baseline) / 64
            print(
                "figure: pipelining flood: RSS \(baseline) → \(during) → \(after) KiB, \(perConnection) KiB a connection"
            )
            // Parsed all at once, the flood cost about 450 KiB a connection and was never given back.
            #expect(perConnection < 160, "\(perConnection) KiB a connection (\(baseline) → \(during) KiB)")
            #expect(
                after <= baseline + 6 * 1024, "RSS \(after) KiB after the connections closed (baseline \(baseline))")
            // The gateway still serves.
            #expect(try await curl(["-m", "5", "http://127.0.0.1:\(gatewayPort)/v1/models"]).status == 200)
        }
    }
}
