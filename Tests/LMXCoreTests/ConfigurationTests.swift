import Foundation
import Testing

@testable import LMXCore

@Suite("Agent configuration and paths")
struct ConfigurationTests {
    private func parse(_ text: String) throws(ConfigurationError) -> AgentConfiguration {
        try AgentConfiguration.parse(Array(text.utf8), file: "/etc/lmx/agent.json")
    }

    @Test("an empty file and an empty object give every default")
    func defaults() throws {
        #expect(try parse("") == AgentConfiguration())
        #expect(try parse("  \n") == AgentConfiguration())
        let config = try parse("{}")
        #expect(config.policy.stabilityWindow == 10)
        #expect(config.policy.lanTimeout == 1.5)
        #expect(config.policy.wanTimeout == 8)
        #expect(config.discovery)
    }

    @Test("every health key is read; unknown keys are ignored")
    func healthKeys() throws {
        let config = try parse(#"{"health": {"stability_window": 3, "up_after": 4, "lan_timeout": 0.5}, "future": 1}"#)
        #expect(config.policy.stabilityWindow == 3)
        #expect(config.policy.upAfter == 4)
        #expect(config.policy.lanTimeout == 0.5)
    }

    @Test("errors name the file and the key")
    func errorsNameTheKey() {
        #expect(throws: ConfigurationError.self) { try parse(#"{"health": {"down_after": 0}}"#) }
        do {
            _ = try parse(#"{"health": {"stable_interval": "ten"}}"#)
            Issue.record("accepted a string interval")
        } catch {
            #expect(error.description.contains("/etc/lmx/agent.json"))
            #expect(error.description.contains("health.stable_interval"))
        }
        do {
            _ = try parse("{not json")
            Issue.record("accepted broken JSON")
        } catch {
            #expect(error.description.contains("not valid JSON"))
        }
    }

    @Test("a structured error: the file, the key's path and the reason, each on its own; one wording for every range")
    func structuredErrors() {
        func error(_ text: String) -> ConfigurationError? {
            do {
                _ = try parse(text)
                return nil
            } catch { return error }
        }
        let window = error(#"{"health": {"stability_window": 0}}"#)
        #expect(window?.file == "/etc/lmx/agent.json" && window?.key == "health.stability_window")
        #expect(window?.message == "must be a number of seconds above 0 and at most 86400")
        #expect(error(#"{"health": {"up_after": 101}}"#)?.message == "must be between 1 and 100")
        #expect(error(#"{"gateway": {"attempts": 0}}"#)?.key == "gateway.attempts")
        #expect(error(#"{"gateway": {"hold_seconds": 500}}"#)?.message == "must be between 0.0 and 120.0 seconds")
        #expect(error(#"{"trust": "all"}"#)?.message == "must be one of paired, pinned, lan")
        #expect(error(#"{"lan_keys": "sometimes"}"#)?.message == "must be one of vouched, never")
        let listen = error(#"{"gateway": {"listen": "0.0.0.0:80"}}"#)
        #expect(listen?.key == "gateway.listen" && listen?.message.contains("not a loopback address") == true)
        let endpoint = error(#"{"endpoints": [{"url": "http://10.0.0.5:1234"}, {"url": "ftp://x"}]}"#)
        #expect(endpoint?.key == "endpoints[1]")
        #expect(endpoint?.description.hasPrefix("/etc/lmx/agent.json: endpoints[1]: ") == true)
        // Defaults are the declared ones: an object with every key absent changes nothing.
        #expect((try? parse(#"{"health": {}, "gateway": {}}"#)) == AgentConfiguration())
    }

    @Test("endpoint URLs: https is WAN, http is LAN; paths, queries and user names are refused without echoing secrets")
    func endpoints() throws {
        let config = try parse(
            #"{"endpoints": [{"url": "HTTPS://Tunnel.Example.com/"}, {"url": "http://10.0.0.5:1234"}]}"#)
        let routes = try config.endpoints.map { try $0.route() }
        #expect(routes[0].via == .wan)
        #expect(routes[0].baseURL == "https://tunnel.example.com")
        #expect(routes[1].via == .lan)
        #expect(routes[1].id == "lan/10.0.0.5:1234")
        for bad in [
            "https://x.example.com?key=SECRET123", "https://user:SECRET123@x.example.com", "ftp://x", "https://x/v1",
        ] {
            do {
                _ = try parse(#"{"endpoints": [{"url": "\#(bad)"}]}"#)
                Issue.record("accepted \(bad)")
            } catch {
                #expect(!error.description.contains("SECRET123"))
            }
        }
        #expect(throws: ConfigurationError.self) {
            try parse(#"{"endpoints": [{"url": "https://x.example.com", "cf_access_client_id": "id"}]}"#)
        }
    }

    @Test("paths: system ones for root, XDG for users, LMX_SOCKET and LMX_DB override")
    func paths() {
        let root = AgentPaths.standard(uid: 0, environment: [:])
        #expect(root.socket == "/run/lmx/agent.sock")
        #expect(root.database == "/var/lib/lmx/agent.db")
        #expect(root.config == "/etc/lmx/agent.json")
        let user = AgentPaths.standard(
            uid: 1000, environment: ["HOME": "/home/a", "XDG_RUNTIME_DIR": "/run/user/1000"])
        #expect(user.socket == "/run/user/1000/lmx/agent.sock")
        #expect(user.database == "/home/a/.local/state/lmx/agent.db")
        #expect(user.config == "/home/a/.config/lmx/agent.json")
        let overridden = AgentPaths.standard(uid: 1000, environment: ["LMX_SOCKET": "/tmp/s", "LMX_DB": "/tmp/d"])
        #expect(overridden.socket == "/tmp/s")
        #expect(overridden.database == "/tmp/d")
    }

    @Test("paths under systemd: RuntimeDirectory=, StateDirectory=, ConfigurationDirectory= place the files")
    func systemdPaths() {
        let unit = AgentPaths.daemon(
            uid: 998,
            environment: [
                "HOME": "/var/lib/lmx", "RUNTIME_DIRECTORY": "/run/lmx",
                "STATE_DIRECTORY": "/var/lib/lmx:/var/lib/other",
                "CONFIGURATION_DIRECTORY": "/etc/lmx",
            ])
        #expect(unit == AgentPaths.system)
        let overridden = AgentPaths.daemon(
            uid: 998, environment: ["RUNTIME_DIRECTORY": "/run/lmx", "LMX_SOCKET": "/tmp/s"])
        #expect(overridden.socket == "/tmp/s")
        #expect(
            AgentPaths.daemon(uid: 1000, environment: ["HOME": "/home/a"])
                == AgentPaths.standard(uid: 1000, environment: ["HOME": "/home/a"]))
    }

    @Test("client paths: a user with no agent of their own reaches the system agent")
    func clientPaths() {
        let environment = ["HOME": "/home/a", "XDG_RUNTIME_DIR": "/run/user/1000"]
        let own = AgentPaths.standard(uid: 1000, environment: environment)
        #expect(
            AgentPaths.client(uid: 1000, environment: environment) { $0 == "/run/lmx/agent.sock" } == AgentPaths.system)
        #expect(AgentPaths.client(uid: 1000, environment: environment) { _ in true } == own)
        #expect(AgentPaths.client(uid: 1000, environment: environment) { _ in false } == own)
        let pinned = AgentPaths.client(uid: 1000, environment: environment.merging(["LMX_SOCKET": "/tmp/s"]) { $1 }) {
            _ in false
        }
        #expect(pinned.socket == "/tmp/s")
        #expect(AgentPaths.client(uid: 0, environment: [:]) { _ in false } == AgentPaths.system)
    }

    @Test("the config file may carry comments and trailing commas (JSON5)")
    func commentedConfig() throws {
        let text = """
            // The agent's config.
            {
              /* a tunnel */
              "endpoints": [{"url": "https://x.example.com",},],
              log_level: "debug", // unquoted key
            }
            """
        let configuration = try AgentConfiguration.parse(Array(text.utf8), file: "agent.json")
        #expect(configuration.endpoints.map(\.url) == ["https://x.example.com"])
        #expect(configuration.logLevel == "debug")
        #expect(throws: ConfigurationError.self) {
            try AgentConfiguration.parse(Array("{ /* open".utf8), file: "agent.json")
        }
    }

    @Test("the shipped config (examples/agent.json, /etc/lmx/agent.json in the package) parses to the defaults")
    func shippedConfig() throws {
        let file = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent(
            "../../examples/agent.json")
        let bytes = try [UInt8](Data(contentsOf: file))
        #expect(try AgentConfiguration.parse(bytes, file: "agent.json") == AgentConfiguration())
    }

    @Test("the commented example config parses, with the gateway's limits; out-of-range limits name their key")
    func exampleAndGatewayLimits() throws {
        let path = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
            .appendingPathComponent("examples/agent.json").path
        let example = try AgentConfiguration.parse(Array(try Data(contentsOf: URL(fileURLWithPath: path))), file: path)
        #expect(example.gateway.maxConnectionsPerRoute == 256)
        #expect(example.gateway.readAheadBudgetBytes == 16 << 20)
        #expect(example.gateway.holdSeconds == 5)
        let defaults = try parse("{}").gateway
        #expect(
            defaults.maxConnectionsPerUser == 256 && defaults.readAheadBytes == 256 << 10
                && defaults.busyCooldownMax == 30 && defaults.clientTimeout == 60)
        #expect(try parse(#"{"gateway": {"client_timeout": 2.5}}"#).gateway.clientTimeout == 2.5)
        for (key, value) in [
            ("max_connections_per_route", "0"), ("hold_seconds", "-1"), ("read_ahead_bytes", "10"),
            ("read_ahead_budget_bytes", "2048"), ("busy_cooldown_max", "99999"), ("max_connections_per_user", "0"),
            ("client_timeout", "0"), ("client_timeout", "86400"),
        ] {
            #expect(throws: ConfigurationError.self) { try parse(#"{"gateway": {"\#(key)": \#(value)}}"#) }
            do { _ = try parse(#"{"gateway": {"\#(key)": \#(value)}}"#) } catch {
                #expect(error.description.contains(key), "\(error)")
            }
        }
    }
}

@Suite("Unknown config keys are found, with their path")
struct UnknownConfigurationKeyTests {
    @Test("misspelt keys at the top, in health, gateway and each endpoint are named; known ones and values are not")
    func unknown() throws {
        let text = """
            // JSON5, as the shipped file
            {
              health: { stabilty_window: 3, up_after: 2 },
              gatway: { listen: "127.0.0.1:1235" },
              gateway: { listen: "127.0.0.1:1235", max_reqest_bytes: 10, },
              endpoints: [ { url: "http://10.0.0.2:1234" }, { url: "https://x.example", api_kye: "s3cret" } ],
              interfaces: ["eth0"], trust: "paired", prefer: ["a"],
            }
            """
        let configuration = try AgentConfiguration.parse(Array(text.utf8), file: "/etc/lmx/agent.json")
        #expect(
            configuration.unknownKeys == [
                "endpoints[1].api_kye", "gateway.max_reqest_bytes", "gatway", "health.stabilty_window",
            ])
        #expect(!configuration.unknownKeys.joined().contains("s3cret"))  // keys only, never values
        #expect(
            try AgentConfiguration.parse(Array(#"{"health": {"stability_window": 3}}"#.utf8), file: "f").unknownKeys
                .isEmpty)
        #expect(try AgentConfiguration.parse(Array("".utf8), file: "f").unknownKeys.isEmpty)
        let many = "{" + (0..<100).map { "\"k\($0)\": 1" }.joined(separator: ",") + "}"
        #expect(
            try AgentConfiguration.parse(Array(many.utf8), file: "f").unknownKeys.count == ConfigurationKeys.maxReported
        )
    }
}

@Suite("Gateway settings a reload changes")
struct GatewayReloadTests {
    @Test("every key that differs is named as the file names it; none when nothing differs")
    func changedKeys() {
        let old = GatewayConfiguration()
        #expect(GatewayConfiguration.changedKeys(from: old, to: old).isEmpty)
        var new = old
        new.admin = true
        new.attempts = 1
        new.readAheadBudgetBytes = 1 << 20
        new.listen = nil
        #expect(
            GatewayConfiguration.changedKeys(from: old, to: new) == [
                "listen", "admin", "attempts", "read_ahead_budget_bytes",
            ])
    }
}
