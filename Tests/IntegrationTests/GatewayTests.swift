import Foundation
import LMXCore
import LMXStatusClient
import Testing

/// The local gateway against real test servers on the test LAN: what it forwards, with which
/// credentials, how streams pass, what it refuses, and a client loop across a failover.
/// `curl` with the HTTP status split from the body (arguments as for curl).
func curl(_ arguments: [String]) async throws -> (status: Int, body: String) {
    let result = try await Command.run(
        "/usr/bin/curl", ["-s", "-o", "-", "-w", "\n%{http_code}"] + arguments, timeout: 20)
    var lines = result.stdout.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    let status = Int(lines.popLast() ?? "") ?? 0
    return (status, lines.joined(separator: "\n"))
}

@Suite("The local gateway (real servers, real failover)", .serialized)
struct GatewayTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    private var caFile: String { bed["LMX_TESTBED_TLS"] + "/ca.pem" }
    private var client: String { "\(TestBed.repo)/scripts/fixtures/gateway-client.py" }

    private func json(_ result: CommandResult) -> [String: Any] {
        let line = result.stdout.split(separator: "\n").last.map(String.init) ?? ""
        return (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]) ?? [:]
    }

    @Test(
        "forwards /v1/* to the active server with its key, over TCP and the socket; streams and bodies pass unchanged; refuses what it must"
    )
    func forwarding() async throws {
        try await withResources {
            let port = freePort()
            let gatewayPort = freePort()
            let server = try await LMXServer.start(
                bed, on: .h1, port: port, instance: "gw-\(port)", apiKey: "lan-inference-key")
            let endpoint =
                #"{"url": "http://10.254.0.11:\#(port)", "name": "Studio", "api_key": "lan-inference-key", "admin_key": "lan-admin-key", "allow_insecure": true}"#
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [endpoint], top: #""gateway": {"max_request_bytes": 4096}"#),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
            let base = "http://127.0.0.1:\(gatewayPort)/v1"
            let socket = agent.directory + "/gateway.sock"

            // The key is added on the way; the client needs none.
            let echo = try await curl([base + "/echo"])
            #expect(echo.status == 200)
            let headers =
                (try JSONSerialization.jsonObject(with: Data(echo.body.utf8)) as? [String: Any])?["headers"]
                as? [String: String]
            #expect(headers?["authorization"] == "Bearer lan-inference-key")
            #expect(headers?["x-admin-key"] == nil)
            #expect(headers?["host"] == "10.254.0.11:\(port)")
            // Forwarded by the event-loop data path, not handed to the general one.
            let dataPath = String(decoding: try agent.client.request("GET", "/metrics").body, as: UTF8.self)
            #expect(dataPath.contains("lmx_gateway_general_path_total 0"), "\(dataPath)")
            #expect(dataPath.contains("lmx_gateway_requests_total 1"))
            // A client's placeholder key (the OpenAI SDKs always send one) does not replace the
            // route's: the server gets the route's key.
            let own = try await curl(["-H", "Authorization: Bearer sk-placeholder", base + "/models"])
            #expect(own.status == 200)
            let ownEcho = try await curl([
                "-H", "Authorization: Bearer sk-placeholder", "-H", "X-Api-Key: other", base + "/echo",
            ])
            let ownHeaders =
                (try JSONSerialization.jsonObject(with: Data(ownEcho.body.utf8)) as? [String: Any])?["headers"]
                as? [String: String]
            #expect(ownHeaders?["authorization"] == "Bearer lan-inference-key")
            #expect(ownHeaders?["x-api-key"] == nil)
            // The same over the Unix socket.
            let viaSocket = try await curl(["--unix-socket", socket, "http://localhost/v1/models"])
            #expect(viaSocket.status == 200)
            #expect(viaSocket.body.contains("test/model"))

            // Bodies byte for byte (uneven chunks), streams event by event.
            let direct = json(
                try await Command.run("/usr/bin/python3", [client, "fetch", server.baseURL + "/v1/bytes?n=300000"]))
            let proxied = json(try await Command.run("/usr/bin/python3", [client, "fetch", base + "/bytes?n=300000"]))
            #expect(proxied["status"] as? Int == 200)
            #expect(proxied["length"] as? Int == 300_000)
            #expect(proxied["sha256"] as? String == direct["sha256"] as? String)
            let stream = json(try await Command.run("/usr/bin/python3", [client, "stream", base]))
            #expect(stream["events"] as? Int == 20)
            #expect(stream["done"] as? Bool == true)
            #expect(stream["content_type"] as? String == "text/event-stream")
            // Each event reaches the client as the server writes it, not at the end (50 ms apart).
            let delivery = stream["delivery_p50_ms"] as? Double ?? 999
            #expect(delivery < 40)
            print(
                "figure: gateway stream: first event \(stream["first_event_ms"] ?? "?") ms, server-to-client delivery p50 \(delivery) ms"
            )

            // Refused: the WebSocket path (never reaches the server), foreign Host and Origin,
            // /admin/* (off by default), bodies over the cap, paths outside /v1.
            let ws = try await curl([base + "/chat/stream"])
            #expect(ws.status == 403)
            let upgrade = try await curl(["-H", "Connection: Upgrade", "-H", "Upgrade: websocket", base + "/models"])
            #expect(upgrade.status == 403)
            let rebinding = try await curl(["-H", "Host: attacker.example", base + "/models"])
            #expect(rebinding.status == 403)
            let crossSite = try await curl([
                "-H", "Origin: https://attacker.example", "-X", "POST", "-d", "{}", base + "/chat/completions",
            ])
            #expect(crossSite.status == 403)
            let admin = try await curl(["http://127.0.0.1:\(gatewayPort)/admin/models"])
            #expect(admin.status == 403)
            let big = try await curl([
                "-H", "Content-Type: application/json", "--data-binary", String(repeating: "x", count: 10_000),
                base + "/chat/completions",
            ])
            #expect(big.status == 413)
            let health = try await curl(["http://127.0.0.1:\(gatewayPort)/healthz"])
            #expect(health.status == 404)
            // (The agent's own /admin/events follower is not the gateway: only what clients asked.)
            #expect(!server.requests.contains { $0.contains("/v1/chat/stream") || $0.contains("/admin/models") })

            // The server's own "busy" answers pass through as they are: never retried in a loop.
            await server.set("overloaded")
            let postsBefore = server.requests.filter { $0.hasPrefix("REQ POST") }.count
            let busy = try await Command.run(
                "/usr/bin/curl",
                [
                    "-s", "-D", "-", "-o", "/dev/null", "-H", "Content-Type: application/json", "-d",
                    #"{"model": "test/model", "messages": []}"#,
                    base + "/chat/completions",
                ])
            #expect(busy.stdout.hasPrefix("HTTP/1.1 503"))
            #expect(busy.stdout.lowercased().contains("retry-after: 30"))
            #expect(server.requests.filter { $0.hasPrefix("REQ POST") }.count == postsBefore + 1)
            await server.set("ready")

            // Where the gateway is, in the status and endpoint.env; no key anywhere.
            let status = try agent.status()
            #expect(status.gateway?.openAIBaseURL == base)
            #expect(status.gateway?.socket == socket)
            let env = await agent.endpointFile(containing: "LMX_GATEWAY_URL='\(base)'")
            #expect(env.contains("LMX_GATEWAY_URL='\(base)'"))
            let metrics = try agent.client.request("GET", "/metrics")
            let text = String(decoding: metrics.body, as: UTF8.self)
            #expect(text.contains("lmx_gateway_refused_total 7"))
            for secret in ["lan-inference-key", "lan-admin-key"] {
                #expect(!agent.process.stderr.contains(secret))
                #expect(!env.contains(secret))
                #expect(
                    !String(decoding: try agent.client.request("GET", "/v1/status").body, as: UTF8.self).contains(
                        secret))
            }
        }
    }

    @Test(
        "the official openai SDK with a placeholder key, through the gateway to a server that requires its inference key: models, chat, stream, error shape"
    )
    func openAISDK() async throws {
        try await withResources {
            let port = freePort()
            let gatewayPort = freePort()
            let server = try await LMXServer.start(
                bed, on: .h1, port: port, instance: "sdk-\(port)", apiKey: "the-real-key")
            let endpoint =
                #"{"url": "http://10.254.0.11:\#(port)", "name": "Studio", "api_key": "the-real-key", "allow_insecure": true}"#
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [endpoint]),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
            // Directly, the placeholder key is refused: the server really requires its key.
            let direct = try await curl([
                "-H", "Authorization: Bearer sk-placeholder-not-a-real-key", server.baseURL + "/v1/models",
            ])
            #expect(direct.status == 401)
            for base in ["http://127.0.0.1:\(gatewayPort)/v1", "http://localhost:\(gatewayPort)/v1"] {
                let result = try await Command.run(
                    bed["LMX_TESTBED_PYTHON"], ["\(TestBed.repo)/scripts/fixtures/openai-sdk-client.py", base],
                    timeout: 60)
                #expect(result.status == 0, "\(result.stderr)")
                let answer = json(result)
                #expect((answer["models"] as? [String])?.contains("test/model") == true, "\(result.stdout)")
                #expect((answer["chat"] as? String)?.hasPrefix("Hello from sdk-") == true, "\(result.stdout)")
                #expect(answer["stream_chunks"] as? Int == 20, "\(result.stdout)")
                // The gateway's own refusal (no server has the model), read by the SDK as an error.
                let error = answer["error"] as? [String: Any]
                #expect(
                    error?["status"] as? Int == 404 && error?["code"] as? String == "model_not_found",
                    "\(result.stdout)")
                // The Responses API, plain and streamed.
                #expect((answer["response"] as? String)?.hasPrefix("Hello from sdk-") == true, "\(result.stdout)")
                #expect(answer["response_stream"] as? String == answer["response"] as? String, "\(result.stdout)")
                print(
                    "figure: openai SDK \(answer["sdk"] ?? "?") through \(base): models, chat, \(answer["stream_chunks"] ?? 0) streamed chunks, responses, error \(error?["code"] ?? "-")"
                )
                // The Anthropic SDK (its placeholder x-api-key replaced by the route's key):
                // /v1/messages plain and streamed, and an error it reads in its own shape.
                let messages = try await Command.run(
                    bed["LMX_TESTBED_PYTHON"],
                    ["\(TestBed.repo)/scripts/fixtures/anthropic-sdk-client.py", String(base.dropLast(3))],
                    timeout: 60)
                #expect(messages.status == 0, "\(messages.stderr)")
                let said = json(messages)
                #expect((said["message"] as? String)?.hasPrefix("Hello from sdk-") == true, "\(messages.stdout)")
                #expect(said["stream"] as? String == said["message"] as? String, "\(messages.stdout)")
                #expect((said["stream_pieces"] as? Int ?? 0) > 1, "\(messages.stdout)")
                let refused = said["error"] as? [String: Any]
                #expect(
                    refused?["status"] as? Int == 404 && refused?["type"] as? String == "not_found_error"
                        && refused?["shape"] as? String == "error", "\(messages.stdout)")
                print(
                    "figure: anthropic SDK \(said["sdk"] ?? "?") through \(base): message, stream, error in its shape")
            }
            // Every /v1 request reached the server with the route's key, never the placeholder.
            #expect(!server.requests.isEmpty)
        }
    }

    @Test(
        "a client loop through the gateway sees no error while the LAN server is killed; it goes on through the tunnel")
    func failoverUnderLoad() async throws {
        try await withResources {
            let wanPort = freePort()
            let lanPort = freePort()
            let gatewayPort = freePort()
            let tunnel = try await LMXServer.start(
                bed, on: .root, port: wanPort, instance: "tunnel-\(wanPort)", bind: "127.0.0.1", tls: true,
                requireAccess: ("id.access", "access-secret"), apiKey: "wan-inference-key")
            let lan = try await LMXServer.start(
                bed, on: .h1, port: lanPort, instance: "lan-\(lanPort)", apiKey: "lan-inference-key")
            let wan =
                #"{"url": "https://127.0.0.1:\#(wanPort)", "via": "wan", "name": "tunnel", "cf_access_client_id": "id.access", "cf_access_client_secret": "access-secret", "api_key": "wan-inference-key"}"#
            let local =
                #"{"url": "http://10.254.0.11:\#(lanPort)", "name": "Studio", "api_key": "lan-inference-key", "allow_insecure": true}"#
            let agent = try await AgentProcess.start(
                bed, config: config(window: 3, endpoints: [wan, local], extraCA: caFile),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForActive(timeout: 8) { $0?.baseURL == lan.baseURL } != nil)
            #expect(
                await agent.waitForRoute(timeout: 8) {
                    $0.baseURL == "https://127.0.0.1:\(wanPort)" && $0.verdict == .ready
                } != nil)

            async let loop = Command.run(
                "/usr/bin/python3",
                [
                    client, "loop", "http://127.0.0.1:\(gatewayPort)/v1", "--seconds", "8", "--concurrency", "4",
                    "--pause", "5",
                ],
                timeout: 40)
            try await Task.sleep(for: .seconds(3))
            await lan.set("dead")
            let result = json(try await loop)
            let ok = result["ok"] as? Int ?? 0
            let errors = (result["errors"] as? [String: Int] ?? [:]).values.reduce(0, +)
            let instances = result["instances"] as? [String] ?? []
            print(
                "figure: gateway failover under load: \(ok) requests answered, \(errors) failed (\(result["errors"] ?? [:])), answered by \(instances)"
            )
            #expect(ok > 100)
            // Requests in flight at the kill may fail (at most one per client); none other may.
            #expect(errors <= 4)
            for line in agent.process.stderr.split(separator: "\n") where line.contains("gateway:") {
                print("agent: \(line)")
            }
            #expect(instances.first == "lan-\(lanPort)")
            #expect(instances.last == "tunnel-\(wanPort)")
            // Through the tunnel with its Access token and key.
            #expect(
                tunnel.requests.contains {
                    $0.hasPrefix("REQ POST /v1/chat/completions") && $0.contains("CF-Access-Client-Id")
                        && $0.contains("Authorization")
                })
            #expect(!agent.process.stderr.contains("access-secret"))
            #expect(!agent.process.stderr.contains("inference-key"))
        }
    }

    @Test(
        "model-aware: /v1/resolve, lmx-status --model and the gateway pick the server that has the model; prefer orders equals"
    )
    func modelRouting() async throws {
        try await withResources {
            let portA = freePort()
            let portB = freePort()
            let gatewayPort = freePort()
            let a = try await LMXServer.start(
                bed, on: .h1, port: portA, instance: "alpha-\(portA)", extra: ["--models", "alpha,shared"])
            // B runs the cloud profile: its document lists no models, /v1/models does (with the key).
            let b = try await LMXServer.start(
                bed, on: .h2, port: portB, instance: "beta-\(portB)", apiKey: "b-inference-key",
                extra: ["--models", "beta,shared", "--profile", "cloud"])
            let endpoints = [
                #"{"url": "http://10.254.0.11:\#(portA)", "name": "Alpha"}"#,
                #"{"url": "http://10.254.0.12:\#(portB)", "name": "Beta", "api_key": "b-inference-key", "allow_insecure": true}"#,
            ]
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: endpoints, top: #""prefer": ["beta-\#(portB)", "alpha-\#(portA)"]"#),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForRoute(timeout: 8) { $0.baseURL == a.baseURL && $0.verdict == .ready } != nil)
            #expect(
                await agent.waitForRoute(timeout: 8) {
                    $0.baseURL == b.baseURL && $0.loadedModels == ["beta", "shared"]
                } != nil)
            // prefer: B first among equals.
            #expect(await agent.waitForActive(timeout: 8) { $0?.baseURL == b.baseURL } != nil)
            let routes = try agent.status().candidates.flatMap(\.routes)
            #expect(routes.first { $0.baseURL == a.baseURL }?.loadedModels == ["alpha", "shared"])

            let resolve = try agent.client.request("GET", "/v1/resolve?model=alpha")
            #expect(resolve.status == 200)
            let resolved = try JSONDecoder().decode(StatusAPI.Resolved.self, from: Data(resolve.body))
            #expect(resolved.endpoint?.baseURL == a.baseURL)
            #expect(resolved.reason.contains("the active server does not"))
            let missing = try agent.client.request("GET", "/v1/resolve?model=gamma")
            #expect(missing.status == 503)

            let status = "\(TestBed.binDir)/lmx-status"
            let alpha = try await Command.run(status, ["--model", "alpha", "--url", "--socket", agent.socket])
            #expect(alpha.status == 0 && alpha.stdout == a.baseURL + "\n")
            let shared = try await Command.run(status, ["--model", "shared", "--url", "--socket", agent.socket])
            #expect(shared.stdout == b.baseURL + "\n")  // both have it: the active one
            let auto = try await Command.run(status, ["--model", "auto", "--url", "--socket", agent.socket])
            #expect(auto.stdout == b.baseURL + "\n")
            let none = try await Command.run(status, ["--model", "gamma", "--socket", agent.socket])
            #expect(none.status == 1)
            #expect(none.stderr.contains("no usable server has gamma loaded"))
            let summary = try await Command.run(status, ["--socket", agent.socket])
            #expect(summary.stdout.contains("Prefer: beta-\(portB), alpha-\(portA)."))
            #expect(summary.stdout.contains("Gateway: http://127.0.0.1:\(gatewayPort)/v1."))

            // The gateway routes each request by its model.
            func ask(_ model: String) async throws -> (Int, String) {
                let r = try await curl([
                    "-H", "Content-Type: application/json", "-d", #"{"model": "\#(model)", "messages": []}"#,
                    "http://127.0.0.1:\(gatewayPort)/v1/chat/completions",
                ])
                return (r.status, r.body)
            }
            let viaA = try await ask("alpha")
            #expect(viaA.0 == 200 && viaA.1.contains("Hello from alpha-\(portA)"))
            let viaB = try await ask("beta")
            #expect(viaB.0 == 200 && viaB.1.contains("Hello from beta-\(portB)"))
            let routed = try await ask("preset:fast")
            #expect(routed.1.contains("Hello from beta-\(portB)"))
            let unknown = try await ask("gamma")
            #expect(unknown.0 == 404)  // the server's own answer, from the active endpoint
        }
    }

    @Test(
        "gateway.group: no TCP listener; on the socket only root, the agent's user and the group's members, as membership changes"
    )
    func groupGate() async throws {
        let group = "lmxgw\(getpid() % 100_000)"
        let added = try await Command.run("/usr/sbin/groupadd", ["-U", "nobody", group])
        #expect(added.status == 0, "\(added.stderr)")
        do {
            try await checkGroupGate(group)
        } catch {
            _ = try? await Command.run("/usr/sbin/groupdel", [group])
            throw error
        }
        _ = try? await Command.run("/usr/sbin/groupdel", [group])
    }

    private func checkGroupGate(_ group: String) async throws {
        try await withResources {
            let port = freePort()
            let gatewayPort = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "grp-\(port)")
            let agent = try await AgentProcess.start(
                bed,
                config: config(
                    endpoints: [#"{"url": "http://10.254.0.11:\#(port)"}"#], top: #""gateway": {"group": "\#(group)"}"#),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForActive(timeout: 8) { $0?.baseURL == server.baseURL } != nil)
            chmod(agent.directory, 0o755)  // let other users reach the sockets (the directory is the test's)
            let socket = agent.directory + "/gateway.sock"
            func curl(as user: [String]) async throws -> String {
                let r = try await Command.run(
                    "/usr/bin/setpriv",
                    user + [
                        "/usr/bin/curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", socket,
                        "http://localhost/v1/models",
                    ])
                return r.stdout
            }
            let nobody = ["--reuid=65534", "--regid=65534", "--clear-groups"]
            // nobody is a member; uid 12345 (no account) is not; root always may.
            #expect(try await curl(as: nobody) == "200")
            #expect(try await curl(as: ["--reuid=12345", "--regid=12345", "--clear-groups"]) == "403")
            #expect(try await curl(as: []) == "200")
            let tcp = try await Command.run(
                "/usr/bin/curl",
                ["-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:\(gatewayPort)/v1/models"])
            #expect(tcp.stdout == "000")  // nothing listens: a TCP caller cannot be identified
            #expect(try agent.status().gateway?.openAIBaseURL == nil)

            // Membership is looked up again within 5 s: no restart after gpasswd.
            func settles(to code: String) async throws -> Double? {
                let start = ContinuousClock.now
                for _ in 0..<40 {
                    if try await curl(as: nobody) == code { return (ContinuousClock.now - start).seconds }
                    try await Task.sleep(for: .milliseconds(250))
                }
                return nil
            }
            #expect(try await Command.run("/usr/bin/gpasswd", ["-d", "nobody", group]).status == 0)
            let revoked = try await settles(to: "403")
            #expect(
                revoked != nil && revoked! <= 6,
                "nobody still served \(revoked.map { "\($0) s" } ?? "after 10 s") after gpasswd -d")
            #expect(try await Command.run("/usr/bin/gpasswd", ["-a", "nobody", group]).status == 0)
            let granted = try await settles(to: "200")
            #expect(
                granted != nil && granted! <= 6,
                "nobody not served \(granted.map { "\($0) s" } ?? "after 10 s") after gpasswd -a")
            print(
                "figure: gateway.group change took effect after \(revoked ?? -1) s (removed) and \(granted ?? -1) s (added)"
            )
        }
    }

    @Test(
        "SIGHUP applies gateway.admin and max_request_bytes at once (/admin/* with the admin key alone), and names the settings that wait for a restart"
    )
    func reloadAppliesGatewaySettings() async throws {
        try await withResources {
            let port = freePort()
            let gatewayPort = freePort()
            let server = try await LMXServer.start(
                bed, on: .h1, port: port, instance: "reload-\(port)", apiKey: "lan-inference-key")
            let endpoint =
                #"{"url": "http://10.254.0.11:\#(port)", "api_key": "lan-inference-key", "admin_key": "test-admin-key", "allow_insecure": true}"#
            func settings(admin: Bool, maxBytes: Int, attempts: Int) -> String {
                config(
                    endpoints: [endpoint],
                    top:
                        #""gateway": {"admin": \#(admin), "max_request_bytes": \#(maxBytes), "attempts": \#(attempts)}"#
                )
            }
            let agent = try await AgentProcess.start(
                bed, config: settings(admin: false, maxBytes: 4096, attempts: 3),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            let agentConfig = agent.configPath
            func write(admin: Bool, maxBytes: Int, attempts: Int) throws {
                try settings(admin: admin, maxBytes: maxBytes, attempts: attempts)
                    .write(toFile: agentConfig, atomically: true, encoding: .utf8)
            }
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
            let admin = "http://127.0.0.1:\(gatewayPort)/admin/models"
            let body = agent.directory + "/body.json"
            try String(repeating: "x", count: 3000).write(toFile: body, atomically: true, encoding: .utf8)
            let chat = ["--data-binary", "@" + body, "http://127.0.0.1:\(gatewayPort)/v1/echo"]
            #expect(try await curl([admin]).status == 403)
            #expect(try await curl(chat).status != 413)

            try write(admin: true, maxBytes: 2000, attempts: 2)
            agent.process.signal(SIGHUP)
            #expect(
                await agent.process.waitForLine(containing: "gateway.attempts changed in \(agentConfig)", timeout: 5))
            // The server answers /admin/* only with its admin key: a 200 is the key on its way.
            let opened = try await curl([admin])
            #expect(opened.status == 200 && opened.body.contains("ok"), "\(opened)")
            #expect(try await curl(chat).status == 413)

            try write(admin: false, maxBytes: 2000, attempts: 2)
            agent.process.signal(SIGHUP)
            let closed = ContinuousClock.now + .seconds(5)
            var status = 0
            while ContinuousClock.now < closed {
                status = try await curl([admin]).status
                if status == 403 { break }
                try await Task.sleep(for: .milliseconds(100))
            }
            #expect(status == 403, "gateway.admin turned off by a reload still forwards /admin/*")
        }
    }

    @Test("memory a burst of large bodies used is given back to the system once the gateway is quiet")
    func heapGivenBack() async throws {
        try await withResources {
            let port = freePort()
            let gatewayPort = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "heap-\(port)")
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [#"{"url": "http://10.254.0.11:\#(port)"}"#]),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
            let file = agent.directory + "/body.bin"
            _ = try await Command.run("/bin/sh", ["-c", "head -c 1000000 /dev/urandom > \"$0\"", file])
            let url = "http://127.0.0.1:\(gatewayPort)/v1/upload"
            _ = try await curl(["--data-binary", "@" + file, url])
            try await Task.sleep(for: .seconds(6))  // past the first look (nothing to give back yet)
            let before = agent.memoryKiB("RssAnon")
            let givenBack = "gateway quiet: free heap memory given back to the system"
            let looksBefore = agent.process.stderr.components(separatedBy: givenBack).count
            // The highest mark while the burst runs: the heap's own look (every 5 s) may already
            // give part back before the burst ends, so the mark after it is no measure of use.
            let watcher = Task {
                var peak = 0
                while !Task.isCancelled {
                    peak = max(peak, agent.memoryKiB("RssAnon"))
                    try? await Task.sleep(for: .milliseconds(50))
                }
                return peak
            }
            // 48 clients at once, four 1 MB bodies each: buffers on both event loops.
            let load = try await Command.run(
                "/bin/sh",
                [
                    "-c",
                    "for i in $(seq 48); do (for j in 1 2 3 4; do curl -s -o /dev/null -w '%{http_code}\\n' --data-binary @\"$0\" \"$1\"; done) & done; wait",
                    file, url,
                ], timeout: 60)
            #expect(load.stdout.split(separator: "\n").filter { $0 == "200" }.count == 192)
            watcher.cancel()
            let after = agent.memoryKiB("RssAnon")
            let peak = max(await watcher.value, after)
            // Given back within two looks (5 s apart) after the last answer.
            var settled = after
            let deadline = ContinuousClock.now + .seconds(15)
            while ContinuousClock.now < deadline, settled > before + 3 * 1024 {
                try await Task.sleep(for: .milliseconds(500))
                settled = agent.memoryKiB("RssAnon")
            }
            print(
                "figure: daemon's anonymous memory \(before) KiB before the burst, \(peak) at its height, \(after) after it, \(settled) once quiet"
            )
            // The gateway's read-ahead budget and write limits keep the burst's height low (4 to
            // 8 MiB over the start here): a rise is what there is to give back, and the daemon
            // says when it gives it back (its debug line, after the burst).
            #expect(peak >= before + 2 * 1024, "the burst did not raise the daemon's memory: nothing to show")
            #expect(
                await agent.process.waitFor(timeout: 15) {
                    $0.stderr.components(separatedBy: givenBack).count > looksBefore
                }, "the daemon did not give memory back after the burst")
            #expect(settled <= before + 3 * 1024)
        }
    }

    @Test("request bodies past 1 MiB stream through (byte for byte), and the cap holds with or without Content-Length")
    func streamedUploads() async throws {
        try await withResources {
            let port = freePort()
            let gatewayPort = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "up-\(port)")
            let agent = try await AgentProcess.start(
                bed,
                config: config(
                    endpoints: [#"{"url": "http://10.254.0.11:\#(port)"}"#],
                    top: #""gateway": {"max_request_bytes": 2097152}"#),
                arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == server.baseURL } != nil)
            let file = agent.directory + "/upload.bin"
            let big = agent.directory + "/big.bin"
            _ = try await Command.run(
                "/bin/sh",
                ["-c", "head -c 1800000 /dev/urandom > \"$0\"; head -c 3000000 /dev/urandom > \"$1\"", file, big])
            let expected = try await Command.run("/usr/bin/sha256sum", [file])
            let url = "http://127.0.0.1:\(gatewayPort)/v1/upload"
            let sent = try await Command.run("/usr/bin/curl", ["-s", "--data-binary", "@" + file, url])
            let answer = (try? JSONSerialization.jsonObject(with: Data(sent.stdout.utf8)) as? [String: Any]) ?? [:]
            #expect(answer["length"] as? Int == 1_800_000)
            #expect(answer["sha256"] as? String == String(expected.stdout.prefix(64)))
            // Over the cap: refused from Content-Length, and mid-stream without one.
            let declared = try await Command.run(
                "/usr/bin/curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "--data-binary", "@" + big, url])
            #expect(declared.stdout == "413")
            let chunked = try await Command.run(
                "/usr/bin/curl",
                [
                    "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Transfer-Encoding: chunked", "--data-binary",
                    "@" + big, url,
                ])
            #expect(chunked.stdout == "413")
            #expect(!server.requests.contains { $0 == "REQ POST /v1/upload 3000000" })
        }
    }
}
