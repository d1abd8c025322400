import Foundation
import LMXCore
import Testing

/// Who the agent trusts (CONTRACT §7), tried on the test LAN as an attacker would: the paired
/// server is reached through its tunnel (HTTPS on this machine) and on h1 at the address the
/// tunnel vouches for; hostile announcers sit on h2 and on this machine's loopback.
@Suite("Trust end to end: vouched addresses, impostors, keys where they belong", .serialized)
struct TrustTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    private var caFile: String { bed["LMX_TESTBED_TLS"] + "/ca.pem" }
    static let inferenceKey = "INFER-S3CRET-\(Int.random(in: 1000...9999))"

    /// The paired server: on h1 (plain HTTP, requiring an inference key) and through its "tunnel"
    /// (HTTPS on 127.0.0.1, same instance, same key), whose discovery document lists `baseURLs`.
    struct Home {
        let lan: LMXServer
        let tunnel: LMXServer
        let instance: String
        var tunnelURL: String { "https://127.0.0.1:\(tunnel.port)" }
    }

    private func startHome(baseURLs: ((Int) -> [String])? = nil, models: String = "test/model") async throws -> Home {
        let port = freePort()
        let tunnelPort = freePort()
        let instance = "studio-\(port)"
        let urls =
            baseURLs?(port) ?? [
                "http://localhost:\(port)", "http://127.0.0.1:\(port)", "http://studio:\(port)",
                "http://studio.local:\(port)", "http://10.254.0.11:\(port)",
            ]
        let lan = try await LMXServer.start(
            bed, on: .h1, port: port, instance: instance, apiKey: Self.inferenceKey, extra: ["--models", models])
        let tunnel = try await LMXServer.start(
            bed, on: .root, port: tunnelPort, instance: instance, bind: "127.0.0.1", tls: true,
            apiKey: Self.inferenceKey,
            extra: ["--models", models, "--base-urls", urls.joined(separator: ",")])
        return Home(lan: lan, tunnel: tunnel, instance: instance)
    }

    /// Pairs the agent with the tunnel only (no `lan=`), as a QR code of the server would.
    private func pair(_ agent: AgentProcess, _ home: Home) async throws {
        let result = try await agent.pair(
            pairingLink(name: "Studio", url: home.tunnelURL, extra: "&key=ADMIN-S3CRET&api_key=\(Self.inferenceKey)"))
        #expect(result.status == 0, "\(result.stderr)")
    }

    private func startAgent(gatewayPort: Int, top: String? = nil, directory: String? = nil) async throws -> AgentProcess
    {
        try await AgentProcess.start(
            bed, config: config(extraCA: caFile, top: top), arguments: ["--gateway", "127.0.0.1:\(gatewayPort)"],
            directory: directory)
    }

    private func chat(_ gatewayPort: Int, model: String = "test/model") async throws -> (status: Int, body: String) {
        try await curl([
            "-H", "Content-Type: application/json", "--data",
            #"{"model": "\#(model)", "messages": [{"role": "user", "content": "my private prompt"}]}"#,
            "http://127.0.0.1:\(gatewayPort)/v1/chat/completions",
        ])
    }

    @Test(
        "(a) a key-requiring server paired through its tunnel only is used on the LAN at the address it vouches for: /v1/models 200, also after a restart with the tunnel down"
    )
    func pairedThroughTunnelWorksAtHome() async throws {
        try await withResources {
            let home = try await startHome()
            let gatewayPort = freePort()
            let agent = try await startAgent(gatewayPort: gatewayPort)
            try await pair(agent, home)

            let lanURL = "http://10.254.0.11:\(home.lan.port)"
            #expect(await agent.waitForActive(timeout: 10) { $0?.baseURL == lanURL } != nil)
            let models = try await curl(["-D", "-", "http://127.0.0.1:\(gatewayPort)/v1/models"])
            #expect(models.status == 200, "\(models.body)")
            #expect(models.body.contains("X-LMX-Via: lan"))
            #expect(home.lan.requests.contains { $0.hasPrefix("REQ /v1/models") && $0.contains("Authorization") })
            let route = await agent.waitForRoute(timeout: 2) { $0.baseURL == lanURL }
            #expect(route?.trust == .tunnel)
            #expect(route?.vouchedBy == "wan/\(home.tunnelURL)")
            #expect(route?.credentials == ["admin_key", "api_key"])
            #expect(route?.keyRequired == true)
            #expect(route?.inferenceReady == true)
            // Loopback and host names in the document vouch for nothing.
            let ids = try agent.status().candidates.flatMap(\.routes).map(\.id)
            #expect(
                !ids.contains {
                    $0.contains("127.0.0.1:\(home.lan.port)") || $0.contains("localhost") || $0.contains("studio")
                })
            // The key never went to an open path, and the Access-less tunnel got none on /healthz either.
            #expect(
                home.lan.requests.filter {
                    $0.hasPrefix("REQ /healthz") || $0.hasPrefix("REQ /readyz") || $0.hasPrefix("REQ /.well-known")
                }
                .allSatisfy { $0.hasSuffix(" -") })

            // Restarted while the tunnel is down: what it vouched for is remembered.
            await agent.stop()
            await home.tunnel.set("dead")
            let again = try await startAgent(gatewayPort: gatewayPort, directory: agent.directory)
            #expect(await again.waitForActive(timeout: 5) { $0?.baseURL == lanURL } != nil)
            #expect(try await curl(["http://127.0.0.1:\(gatewayPort)/v1/models"]).status == 200)
        }
    }

    @Test(
        "(b) a LAN host repeating the paired instance_id from another address: never active, no key, no prompt, listed and logged once as an impostor"
    )
    func impostorNeverUsed() async throws {
        try await withResources {
            let home = try await startHome()
            let evilPort = freePort()
            let evil = try await LMXServer.start(bed, on: .h2, port: evilPort, instance: home.instance)
            _ = try await Publish.avahi(bed, on: .h2, name: "Studio \(TestBed.tag())", port: evilPort)
            let gatewayPort = freePort()
            let agent = try await startAgent(gatewayPort: gatewayPort)
            try await pair(agent, home)
            #expect(
                await agent.waitForActive(timeout: 10) { $0?.baseURL == "http://10.254.0.11:\(home.lan.port)" } != nil)
            let impostor = await agent.waitForRoute(timeout: 10) { $0.baseURL == evil.baseURL && $0.trust == .impostor }
            #expect(
                impostor?.reason
                    == "not used: it claims to be Studio from an address Studio's pairing does not vouch for")
            #expect(impostor?.credentials == [])

            // The paired server goes away: the tunnel takes over, never the impostor.
            await home.lan.set("dead")
            #expect(await agent.waitForActive(timeout: 10) { $0?.via == .wan } != nil)
            for _ in 0..<10 {
                let answer = try await chat(gatewayPort)
                #expect(answer.status == 200, "\(answer.body)")
                #expect(agent.active()?.baseURL != evil.baseURL)
            }
            #expect(!evil.requests.isEmpty, "it was probed")
            #expect(evil.requests.allSatisfy { $0.hasSuffix(" -") }, "no request with a key: \(evil.requests)")
            #expect(!evil.requests.contains { $0.contains("POST") }, "no prompt")
            #expect(
                try agent.status().candidates.first { $0.routes.contains { $0.baseURL == evil.baseURL } }?.routes.count
                    == 1,
                "never merged into the paired server")
            let warnings =
                agent.process.stderr.components(separatedBy: "Refused a machine on the LAN: it claims to be Studio")
                .count
                - 1
            #expect(warnings == 1, "logged once: \(warnings)")
        }
    }

    @Test(
        "(c) a model only an unpaired announcer lists: the request never reaches it; the client gets an error naming the model and the untrusted server"
    )
    func modelOnlyOnStranger() async throws {
        try await withResources {
            let home = try await startHome()
            let otherPort = freePort()
            let stranger = try await LMXServer.start(
                bed, on: .h2, port: otherPort, instance: "other-\(otherPort)", extra: ["--models", "secret-model"])
            _ = try await Publish.avahi(bed, on: .h2, name: "Stranger \(TestBed.tag())", port: otherPort)
            let gatewayPort = freePort()
            let agent = try await startAgent(gatewayPort: gatewayPort)
            try await pair(agent, home)
            #expect(await agent.waitForActive(timeout: 10) { $0?.via == .lan } != nil)
            #expect(
                await agent.waitForRoute(timeout: 10) { $0.baseURL == stranger.baseURL && $0.verdict == .ready } != nil)

            let answer = try await chat(gatewayPort, model: "secret-model")
            #expect(answer.status == 404)
            #expect(answer.body.contains("secret-model") && answer.body.contains("untrusted"), "\(answer.body)")
            #expect(!stranger.requests.contains { $0.contains("POST") })
            let resolve = try agent.client.request("GET", "/v1/resolve?model=secret-model")
            #expect(resolve.status == 503)
            let status = try await Command.run(
                "\(TestBed.binDir)/lmx-status", ["--model", "secret-model", "--url"],
                environment: ["LMX_SOCKET": agent.socket])
            #expect(status.status == 1)
            #expect(status.stderr.contains("does not trust"), "\(status.stderr)")
            // A model the paired server has still goes there.
            #expect(try await chat(gatewayPort).status == 200)
        }
    }

    @Test(
        "(d) an https:// LAN endpoint and an announcement of its ip:port with another path: keys never go over http://, the endpoint keeps its URL"
    )
    func noDowngrade() async throws {
        try await withResources {
            let port = freePort()
            let server = try await LMXServer.start(
                bed, on: .h1, port: port, instance: "secure-\(port)", tls: true, apiKey: Self.inferenceKey)
            let endpoint =
                #"{"url": "https://10.254.0.11:\#(port)", "via": "lan", "name": "Secure", "api_key": "\#(Self.inferenceKey)", "admin_key": "ADMIN-S3CRET"}"#
            _ = try await Publish.avahi(
                bed, on: .h1, name: "Secure \(TestBed.tag())", port: port, txt: ["path=/evil", "service=opta-lmx"])
            let gatewayPort = freePort()
            let agent = try await AgentProcess.start(
                bed, config: config(endpoints: [endpoint], extraCA: caFile),
                arguments: ["--gateway", "127.0.0.1:\(gatewayPort)"])
            #expect(await agent.waitForActive(timeout: 10) { $0?.baseURL == "https://10.254.0.11:\(port)" } != nil)
            let plain = await agent.waitForRoute(timeout: 10) {
                $0.baseURL == "http://10.254.0.11:\(port)" && $0.lastProbe != nil
            }
            #expect(plain?.credentials == [])
            #expect(plain?.active == false)
            for _ in 0..<3 { #expect(try await curl(["http://127.0.0.1:\(gatewayPort)/v1/models"]).status == 200) }
            let secure = try agent.status().candidates.flatMap(\.routes).first {
                $0.id == "lan/https://10.254.0.11:\(port)"
            }
            #expect(secure?.baseURL == "https://10.254.0.11:\(port)")
            #expect(secure?.credentials == ["admin_key", "api_key"])
            #expect(agent.active()?.baseURL == "https://10.254.0.11:\(port)")
            // What reached the TLS port in clear: probes of the announcement, never a key, never the announced path with a key.
            let inClear = server.process.stdoutLines.filter { $0.hasPrefix("PLAIN ") }
            #expect(!inClear.isEmpty, "the announced http:// route was probed")
            #expect(inClear.allSatisfy { $0.hasSuffix(" -") }, "\(inClear)")
            #expect(server.requests.contains { $0.hasPrefix("REQ /v1/models") && $0.contains("Authorization") })
            #expect(!server.requests.contains { $0.hasPrefix("REQ /evil") })
        }
    }

    @Test(
        "(e) lan_keys never: the LAN route carries no key and is not ready for inference; the key-requiring server is used through its tunnel"
    )
    func lanKeysNever() async throws {
        try await withResources {
            let home = try await startHome()
            let gatewayPort = freePort()
            let agent = try await startAgent(gatewayPort: gatewayPort, top: #""lan_keys": "never""#)
            try await pair(agent, home)
            let lanURL = "http://10.254.0.11:\(home.lan.port)"
            let lan = await agent.waitForRoute(timeout: 10) { $0.baseURL == lanURL && $0.keyRequired == true }
            #expect(lan?.credentials == [])
            #expect(lan?.inferenceReady == false)
            #expect(lan?.reason.contains("lan_keys: never") == true, "\(lan?.reason ?? "")")
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == home.tunnelURL } != nil)
            let models = try await curl(["-D", "-", "http://127.0.0.1:\(gatewayPort)/v1/models"])
            #expect(models.status == 200, "\(models.body)")
            #expect(models.body.contains("X-LMX-Via: wan"))
            #expect(
                home.lan.requests.allSatisfy { !$0.contains("Authorization") && !$0.contains("X-Admin-Key") },
                "\(home.lan.requests)")
            #expect(agent.active()?.baseURL == home.tunnelURL)
        }
    }

    @Test(
        "(f) a tunnel whose document lists loopback and another host's address: only the server's own LAN address is vouched"
    )
    func onlyOwnAddresses() async throws {
        try await withResources {
            let otherPort = freePort()
            let loopbackPort = freePort()
            let other = try await LMXServer.start(bed, on: .h2, port: otherPort, instance: "other-\(otherPort)")
            let home = try await startHome(baseURLs: { port in
                [
                    "http://127.0.0.1:\(loopbackPort)", "http://localhost:\(loopbackPort)",
                    "http://10.254.0.12:\(otherPort)",
                    "http://10.254.0.11:\(port)", "http://studio.local:\(port)",
                ]
            })
            // A local user's server on loopback, repeating the paired instance.
            let local = try await LMXServer.start(
                bed, on: .root, port: loopbackPort, instance: home.instance, bind: "127.0.0.1")
            let gatewayPort = freePort()
            let agent = try await startAgent(gatewayPort: gatewayPort)
            try await pair(agent, home)
            #expect(
                await agent.waitForActive(timeout: 10) { $0?.baseURL == "http://10.254.0.11:\(home.lan.port)" } != nil)
            let wrong = await agent.waitForRoute(timeout: 10) { $0.baseURL == other.baseURL && $0.verdict != nil }
            #expect(wrong?.verdict == .wrongService, "another server answers there: \(wrong?.reason ?? "")")
            #expect(wrong?.active == false)
            for _ in 0..<5 { #expect(try await chat(gatewayPort).status == 200) }
            #expect(local.requests.isEmpty, "loopback names the server's machine, never this one")
            #expect(
                other.requests.allSatisfy { $0.hasSuffix(" -") } && !other.requests.contains { $0.contains("POST") },
                "\(other.requests)")
            let ids = try agent.status().candidates.flatMap(\.routes).map(\.id)
            #expect(!ids.contains { $0.contains(":\(loopbackPort)") })
        }
    }
}
