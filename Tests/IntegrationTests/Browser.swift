import Foundation
import Testing

/// Debian's Chromium, headless, driven by Debian's chromedriver over WebDriver (JSON over HTTP on
/// loopback). It resolves no name on the network: every host name fails but those mapped in
/// `hosts` (to 127.0.0.1), and its background services (updates, sync, metrics) are off, so it
/// only ever talks to loopback.
final class Browser: Sendable {
    let driver: LiveProcess
    let port: Int
    let session: String
    let profile: String

    private init(driver: LiveProcess, port: Int, session: String, profile: String) {
        self.driver = driver
        self.port = port
        self.session = session
        self.profile = profile
    }

    static func start(width: Int = 1200, height: Int = 900, hosts: [String] = []) async throws -> Browser {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/chromedriver"),
            FileManager.default.isExecutableFile(atPath: "/usr/bin/chromium")
        else {
            throw TestBedMissing(
                detail:
                    "Debian's chromium and chromium-driver are not installed: run make test (scripts/lib.sh installs them)"
            )
        }
        let port = freePort()
        let driver = LiveProcess(
            "/usr/bin/chromedriver", ["--port=\(port)", "--allowed-ips=127.0.0.1", "--log-level=WARNING"])
        try await driver.start()
        let profile = "/tmp/lmx-chromium-\(TestBed.tag())"
        var ready = false
        for _ in 0..<100 where !ready {
            ready =
                (try? await Self.call(port, "GET", "/status")).flatMap {
                    ($0["value"] as? [String: Any])?["ready"] as? Bool
                } == true
            if !ready { try await Task.sleep(for: .milliseconds(100)) }
        }
        guard ready else { throw TestBedMissing(detail: "chromedriver did not start: \(driver.stderr)") }
        let rules =
            (hosts.map { "MAP \($0) 127.0.0.1" } + ["EXCLUDE 127.0.0.1", "EXCLUDE localhost", "MAP * ~NOTFOUND"])
            .joined(separator: ", ")
        let arguments = [
            "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=\(width),\(height)",
            "--user-data-dir=\(profile)", "--no-first-run", "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--disable-domain-reliability", "--disable-breakpad",
            "--metrics-recording-only", "--no-pings", "--disable-features=Translate,MediaRouter,OptimizationHints",
            "--host-resolver-rules=\(rules)", "--lang=en-US", "--force-device-scale-factor=1",
        ]
        let capabilities: [String: Any] = [
            "capabilities": [
                "alwaysMatch": [
                    "browserName": "chrome",
                    "goog:chromeOptions": ["binary": "/usr/bin/chromium", "args": arguments],
                    "goog:loggingPrefs": ["browser": "ALL"],
                ] as [String: Any]
            ]
        ]
        let answer = try await Self.call(port, "POST", "/session", capabilities, timeout: 60)
        guard let value = answer["value"] as? [String: Any], let session = value["sessionId"] as? String else {
            await driver.stop()
            throw TestBedMissing(detail: "chromedriver made no session: \(answer) \(driver.stderr)")
        }
        let browser = Browser(driver: driver, port: port, session: session, profile: profile)
        Resources.current?.keep(browser)
        return browser
    }

    /// One WebDriver call: the decoded answer.
    private static func call(
        _ port: Int, _ method: String, _ path: String, _ body: [String: Any]? = nil, timeout: Double = 30
    ) async throws -> [String: Any] {
        var arguments = ["-s", "--max-time", String(Int(timeout)), "-X", method, "http://127.0.0.1:\(port)\(path)"]
        if let body {
            let data = try JSONSerialization.data(withJSONObject: body)
            arguments += [
                "-H", "Content-Type: application/json", "--data-binary", String(decoding: data, as: UTF8.self),
            ]
        }
        let result = try await Command.run("/usr/bin/curl", arguments, timeout: timeout + 5)
        guard result.status == 0,
            let object = try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any]
        else {
            throw TestBedMissing(
                detail: "WebDriver \(method) \(path) failed: \(result.stdout.prefix(500)) \(result.stderr.prefix(300))")
        }
        return object
    }

    @discardableResult
    func call(_ method: String, _ path: String, _ body: [String: Any]? = nil) async throws -> Any? {
        try await Self.call(port, method, "/session/\(session)\(path)", body)["value"]
    }

    func open(_ url: String) async throws {
        try await call("POST", "/url", ["url": url])
    }

    /// Runs `script` (a function body; `return` gives the value) in the page.
    func run(_ script: String) async throws -> Any? {
        try await call("POST", "/execute/sync", ["script": script, "args": [Any]()])
    }

    /// Polls `script` every 20 ms until it returns true: the seconds it took, or nil.
    func waitUntil(_ script: String, timeout: Double) async -> Double? {
        let start = ContinuousClock.now
        while (ContinuousClock.now - start).seconds < timeout {
            if (try? await run(script)) as? Bool == true { return (ContinuousClock.now - start).seconds }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return nil
    }

    func text(_ id: String) async -> String {
        ((try? await run("const e = document.getElementById('\(id)'); return e ? e.textContent : null")) as? String)
            ?? ""
    }

    /// The page as the system's dark or light preference would show it.
    func prefersDark(_ dark: Bool) async throws {
        try await call(
            "POST", "/goog/cdp/execute",
            [
                "cmd": "Emulation.setEmulatedMedia",
                "params": ["features": [["name": "prefers-color-scheme", "value": dark ? "dark" : "light"]]],
            ])
    }

    func resize(width: Int, height: Int) async throws {
        try await call("POST", "/window/rect", ["width": width, "height": height])
    }

    /// A PNG of the viewport, written to `path`.
    func screenshot(to path: String) async throws -> Data {
        guard let encoded = try await call("GET", "/screenshot") as? String, let png = Data(base64Encoded: encoded)
        else {
            throw TestBedMissing(detail: "no screenshot")
        }
        try png.write(to: URL(fileURLWithPath: path))
        return png
    }

    /// The console's messages since the last call: (level, message).
    func console() async throws -> [(level: String, message: String)] {
        let entries = try await call("POST", "/se/log", ["type": "browser"]) as? [[String: Any]] ?? []
        return entries.map { ($0["level"] as? String ?? "", $0["message"] as? String ?? "") }
    }

    func quit() async {
        _ = try? await Self.call(port, "DELETE", "/session/\(session)", timeout: 10)
        await driver.stop()
        try? FileManager.default.removeItem(atPath: profile)
    }
}

extension Browser: TestResource {
    func release() async { await quit() }
}

/// Width and height of a PNG, from its header; nil when it is not a PNG.
func pngSize(_ data: Data) -> (width: Int, height: Int)? {
    let bytes = [UInt8](data.prefix(24))
    guard bytes.count == 24, bytes[0..<8] == [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A] else { return nil }
    func be(_ at: Int) -> Int { bytes[at..<at + 4].reduce(0) { $0 << 8 | Int($1) } }
    return (be(16), be(20))
}
