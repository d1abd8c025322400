import Foundation
import LMXCore
import Testing

/// Issue 63's reproductions against the real daemon and real servers on the test LAN: what the
/// client receives on the wire (a compressed stream, a stream whose last event lacks its
/// newline, a login page in place of the answer), and the memory a local user's pipelined or
/// byte-at-a-time requests make the daemon hold.
@Suite(
    "The gateway's wire on the test LAN: answers whole and framed, foreign pages recognised, memory bounded",
    .serialized)
struct GatewayWireTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    private func endpoint(_ server: LMXServer, name: String) -> String {
        #"{"url": "\#(server.baseURL)", "name": "\#(name)", "allow_insecure": true}"#
    }

    /// A server and an agent with a gateway on `gatewayPort`, the server active.
    private func start(_ name: String, gatewayPort: Int) async throws -> (LMXServer, AgentProcess) {
        let port = freePort()
        let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "\(name)-\(port)")
        let agent = try await AgentProcess.start(
            bed, config: config(endpoints: [endpoint(server, name: "Studio")]),
            arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
        #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
        return (server, agent)
    }

    @Test(
        "a gzip-coded event stream reaches the client whole and decompresses; a stream whose [DONE] lacks its newline arrives whole, no error event"
    )
    func compressedAndBareDone() async throws {
        try await withResources {
            let gatewayPort = freePort()
            let (server, _) = try await start("wire-gzip", gatewayPort: gatewayPort)
            await server.set("gzip")
            await server.set("bare-done")
            let script = #"""
                import http.client, json, sys, zlib
                def ask(encoding):
                    conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=15)
                    body = json.dumps({"model": "test/model", "stream": True, "messages": []})
                    conn.request("POST", "/v1/chat/completions", body=body,
                                 headers={"Content-Type": "application/json", "Accept-Encoding": encoding})
                    answer = conn.getresponse()
                    raw = answer.read()
                    coding = answer.getheader("Content-Encoding") or "identity"
                    text = zlib.decompress(raw, wbits=31).decode() if coding == "gzip" else raw.decode()
                    print(json.dumps({"status": answer.status, "coding": coding, "done": "data: [DONE]" in text,
                                      "whole": text.endswith("data: [DONE]\n\n"),
                                      "events": text.count("data: {"), "error": "upstream_lost" in text}), flush=True)
                ask("gzip")
                ask("identity")
                """#
            let result = try await Command.run("/usr/bin/python3", ["-c", script, String(gatewayPort)], timeout: 40)
            let lines = result.stdout.split(separator: "\n").compactMap {
                try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
            }
            try #require(lines.count == 2, "\(result.stdout) \(result.stderr)")
            for line in lines {
                #expect(line["status"] as? Int == 200, "\(line)")
                #expect(line["done"] as? Bool == true && line["error"] as? Bool == false, "\(line)")
                #expect(line["events"] as? Int == 20, "\(line)")
            }
            #expect(lines[0]["coding"] as? String == "gzip" && lines[1]["coding"] as? String == "identity")
            // Uncoded, the gateway reads the stream: the last event, ended cleanly, is completed.
            #expect(lines[1]["whole"] as? Bool == true, "\(lines[1])")
        }
    }

    @Test(
        "a tunnel's Access login page in place of the answer (health paths still answering): the client gets 502 access_login_required naming lmx-pair, never the page"
    )
    func loginPage() async throws {
        try await withResources {
            let gatewayPort = freePort()
            let (server, agent) = try await start("wire-login", gatewayPort: gatewayPort)
            await server.set("api-login")
            let answer = try await curl([
                "-m", "10", "-H", "Content-Type: application/json", "-d", #"{"model":"test/model","messages":[]}"#,
                "http://127.0.0.1:\(gatewayPort)/v1/chat/completions",
            ])
            #expect(answer.status == 502, "\(answer)")
            #expect(answer.body.contains("access_login_required") && answer.body.contains("lmx-pair"), "\(answer.body)")
            #expect(!answer.body.contains("Sign in") && !answer.body.contains("cloudflareaccess"))
            // The route carries the cause the gateway saw (its last report), while probes still pass.
            let seen = await agent.waitForRoute(timeout: 3) { route in
                let detail = route.lastProbe?.detail ?? ""
                return route.baseURL == server.baseURL && detail.contains("login page")
            }
            #expect(seen != nil)
            #expect(seen?.lastProbe?.cause == .loginPage, "the cause as a code beside its words")
            #expect(
                seen?.verdict == .authRejected && seen?.health == .down, "marked at once: one login page is certain")
            // Its health paths keep answering; its probes (every second in its restart watch)
            // ask /v1/models too and meet the login page there: the mark stands.
            try await Task.sleep(for: .seconds(5))
            let status = try agent.status()
            let later = status.candidates.flatMap(\.routes).first { $0.baseURL == server.baseURL }
            #expect(later?.verdict == .authRejected && later?.health == .down, "\(String(describing: later))")
            #expect(later?.lastProbe?.cause == .loginPage, "\(String(describing: later?.lastProbe))")
            #expect((later?.probes ?? 0) > (seen?.probes ?? 0), "probed meanwhile")
            #expect(status.active == nil, "no route handed out while the login page answers for it")
            await server.set("api-open")
            let served = try await curl([
                "-m", "10", "-H", "Content-Type: application/json", "-d", #"{"model":"test/model","messages":[]}"#,
                "http://127.0.0.1:\(gatewayPort)/v1/chat/completions",
            ])
            #expect(served.status == 200, "\(served)")
        }
    }

    @Test(
        "requests llhttp cannot read (a bare LF, control bytes, a doubled Content-Length, TE: identity) get the gateway's JSON 400 with its security headers, then the close; so do a refusal before a body the client holds back (Expect), one of a request the data path's reader left to llhttp, and a head over 32 KiB; a slow reader gets all of a large answer before the close"
    )
    func unreadableRequests() async throws {
        try await withResources {
            let gatewayPort = freePort()
            let (server, _) = try await start("wire-unreadable", gatewayPort: gatewayPort)
            let script = #"""
                import json, re, socket, sys
                port = int(sys.argv[1])
                many = "".join("X-H%d: v\r\n" % i for i in range(101))
                cases = {
                    "bare-lf": b"GET /v1/models HTTP/1.1\nHost: x\n\n",
                    "control": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n",
                    "two-lengths": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
                    "te-identity": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\nContent-Length: 2\r\n\r\n{}",
                    "expect-431": ("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\nContent-Length: 2\r\n" + many + "\r\n").encode(),
                    # 101 header lines with Host: one more than the gateway reads.
                    "lines-431": ("GET /v1/models HTTP/1.1\r\nHost: localhost\r\n"
                                  + "".join("X-H%d: v\r\n" % i for i in range(100)) + "\r\n").encode(),
                    "expect-501": b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                    # Requests pipelined behind one the data path's reader leaves to llhttp: one
                    # answer, then the close (nothing behind it parsed for nothing).
                    "pipelined-431": ("GET /v1/models HTTP/1.1\r\nHost: localhost\r\n" + many + "\r\n"
                                      + "GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n" * 3).encode(),
                    # A head longer than the gateway reads, unfinished: refused at 32 KiB.
                    "head-431": b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 40000,
                    # A refusal while 200 KB of body keep coming: the answer is read before the close
                    # (a lingering close; closed at once, the kernel's reset could destroy it).
                    "body-501": b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: gzip\r\n\r\n"
                    + b"z" * 200000,
                    # The data path's own refusal (a body over max_request_bytes) while 4 MB of it
                    # keep coming: the same lingering close.
                    "body-413": b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 40000000\r\n\r\n"
                    + b"z" * (4 << 20),
                }
                for name, data in cases.items():
                    s = socket.create_connection(("127.0.0.1", port))
                    s.settimeout(5)
                    try:
                        s.sendall(data)
                    except OSError:
                        pass
                    got = b""
                    closed = False
                    try:
                        while True:
                            chunk = s.recv(65536)
                            if not chunk:
                                closed = True
                                break
                            got += chunk
                    except socket.timeout:
                        pass
                    except ConnectionResetError:
                        closed = "reset"
                    head, _, body = got.partition(b"\r\n\r\n")
                    lines = head.decode("latin-1").split("\r\n")
                    headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
                    try:
                        code = json.loads(body)["error"]["code"]
                    except Exception:
                        code = None
                    print(json.dumps({"case": name, "status": lines[0], "code": code, "closed": closed,
                                      "answers": len(re.findall(rb"HTTP/1\.1 \d{3} ", got)),
                                      "nosniff": headers.get("x-content-type-options") == "nosniff",
                                      "csp": "sandbox" in headers.get("content-security-policy", ""),
                                      "connection": headers.get("connection"), "body": body.decode("latin-1")[:300]}))
                # A client that reads slowly: 4 MB of answer, then a head without Host behind it,
                # nothing read for 1.5 s, more sent, then all read. The gateway lingers while its
                # answer is still in the kernel: no reset destroys what the client had not read.
                import time
                s = socket.create_connection(("127.0.0.1", port))
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
                s.sendall(b"GET /v1/bytes?n=4194304 HTTP/1.1\r\nHost: localhost\r\n\r\nGET /v1/models HTTP/1.1\r\n\r\n")
                time.sleep(1.5)
                try:
                    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n")
                except OSError:
                    pass
                s.settimeout(10)
                got, end = b"", "eof"
                try:
                    while True:
                        chunk = s.recv(1 << 20)
                        if not chunk:
                            break
                        got += chunk
                except ConnectionResetError:
                    end = "reset"
                except socket.timeout:
                    end = "timeout"
                print("slow-reader", len(got) > 4194304, end, [m.decode() for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", got[:300] + got[-800:])])
                """#
            let result = try await Command.run("/usr/bin/python3", ["-c", script, String(gatewayPort)], timeout: 90)
            let lines = result.stdout.split(separator: "\n").compactMap {
                try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
            }
            try #require(lines.count == 11, "\(result.stdout) \(result.stderr)")
            #expect(result.stdout.contains("slow-reader True eof ['200', '400']"), "\(result.stdout)")
            for line in lines {
                let name = line["case"] as? String ?? ""
                let status = line["status"] as? String ?? ""
                let expected = String(name.suffix(3)).allSatisfy(\.isNumber) ? String(name.suffix(3)) : "400"
                #expect(line["answers"] as? Int == 1, "one answer, then the close: \(line)")
                if name == "head-431" { #expect(line["code"] as? String == "head_too_large", "\(line)") }
                #expect(status.hasPrefix("HTTP/1.1 \(expected) "), "\(line)")
                #expect(line["closed"] as? Bool == true, "closed at once, not after a timeout: \(line)")
                #expect(line["connection"] as? String == "close", "\(line)")
                #expect(line["nosniff"] as? Bool == true && line["csp"] as? Bool == true, "\(line)")
                if expected == "400" {
                    #expect(line["code"] as? String == "bad_request", "\(line)")
                    #expect((line["body"] as? String ?? "").contains("CRLF"), "names the next step: \(line)")
                }
            }
            // Nothing of them reached the server.
            #expect(!server.requests.contains { $0.hasPrefix("REQ POST") }, "\(server.requests)")
        }
    }

    /// Runs `script` (Python, given the gateway's port) and returns the agent's RSS in KiB before,
    /// at the end of the script (its connections still open), and 6 s after they closed (the
    /// daemon gives memory back after 5 s without answers).
    private func rss(
        _ agent: AgentProcess, _ script: String, port: Int
    ) async throws -> (before: Int, during: Int, after: Int, output: String) {
        try await Task.sleep(for: .seconds(6))
        let before = agent.memoryKiB()
        let client = LiveProcess("/usr/bin/python3", ["-c", script, String(port)])
        try await client.start()
        #expect(await client.waitForLine(containing: "held", timeout: 60), "\(client.stdoutLines)")
        let during = agent.memoryKiB()
        client.send("go")
        #expect(await client.waitForLine(containing: "closed", timeout: 30))
        await client.stop()
        try await Task.sleep(for: .seconds(6))
        return (before, during, agent.memoryKiB(), client.stdoutLines.joined(separator: " "))
    }

    @Test(
        "64 connections with 400 requests pipelined behind a head llhttp reads, and 16 sending a body a byte at a time: the daemon's memory stays bounded and is given back"
    )
    func floodsBounded() async throws {
        try await withResources {
            let gatewayPort = freePort()
            let (_, agent) = try await start("wire-flood", gatewayPort: gatewayPort)
            // 101 header lines: more than the data path's reader takes; llhttp reads the rest.
            let pipelined = #"""
                import socket, sys
                many = "".join("X-H%d: v\r\n" % i for i in range(101))
                first = "GET /v1/models HTTP/1.1\r\nHost: x\r\n" + many + "\r\n"
                rest = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" * 400
                conns = []
                for _ in range(64):
                    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
                    s.sendall((first + rest).encode())
                    conns.append(s)
                print("held", flush=True)
                sys.stdin.readline()
                for s in conns:
                    s.close()
                print("closed", flush=True)
                """#
            let flood = try await rss(agent, pipelined, port: gatewayPort)
            let perConnection = (flood.during - flood.before) / 64
            print("llhttp flood: RSS \(flood.before) KiB → \(flood.during) KiB held → \(flood.after) KiB after")
            #expect(perConnection <= 64, "\(perConnection) KiB per connection: \(flood)")
            #expect(flood.after - flood.before <= 8 << 10, "given back: \(flood)")

            let drip = #"""
                import socket, sys, time
                conns = []
                for _ in range(16):
                    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 32000\r\n\r\n{")
                    conns.append(s)
                for _ in range(16000):
                    for s in conns:
                        s.send(b" ")
                time.sleep(0.5)
                print("held", flush=True)
                sys.stdin.readline()
                for s in conns:
                    s.close()
                print("closed", flush=True)
                """#
            let bytes = try await rss(agent, drip, port: gatewayPort)
            print(
                "byte-at-a-time bodies: RSS \(bytes.before) KiB → \(bytes.during) KiB held → \(bytes.after) KiB after")
            #expect((bytes.during - bytes.before) / 16 <= 96, "per connection: \(bytes)")
            #expect(bytes.after - bytes.before <= 8 << 10, "given back: \(bytes)")
        }
    }
}
