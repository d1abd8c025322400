import Foundation
import LMXCore
import Testing

/// What a person at the desktop sees and hears: the dashboard in real headless Chromium, and
/// lmx-notify against a notification server on a real session bus. One paired server (a QR
/// code's link with its LAN address, its tunnel, keys and an expiry): the server on h1, its tunnel
/// (HTTPS, Access token, inference key) on this machine's loopback.
@Suite("The desktop: the dashboard in Chromium, notifications on a session bus", .serialized)
struct DesktopTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    struct Home {
        let lan: LMXServer
        let tunnel: LMXServer
        let agent: AgentProcess
        let gatewayPort: Int
        let config: String
        var dashboard: String { "http://127.0.0.1:\(gatewayPort)/" }
    }

    private func startHome() async throws -> Home {
        let port = freePort()
        let tunnelPort = freePort()
        let gatewayPort = freePort()
        let instance = "studio-\(port)"
        let lan = try await LMXServer.start(bed, on: .h1, port: port, instance: instance, apiKey: "inference-key")
        let tunnel = try await LMXServer.start(
            bed, on: .root, port: tunnelPort, instance: instance, bind: "127.0.0.1", tls: true,
            requireAccess: ("id.access", "access-secret"), apiKey: "inference-key")
        let config =
            #"{"interfaces": ["lmxbr0"], "health": {"stability_window": 1}, "extra_ca_file": "\#(bed["LMX_TESTBED_TLS"])/ca.pem"}"#
        let agent = try await AgentProcess.start(
            bed, config: config, arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(gatewayPort)"])
        let expires = Int(Date().timeIntervalSince1970) + 2 * 86_400
        let link = pairingLink(
            name: "Studio", url: "https://127.0.0.1:\(tunnelPort)",
            extra:
                "&api_key=inference-key&cf_id=id.access&cf_secret=access-secret&instance=\(instance)&lan=\(bed.address(.h1))%3A\(port)&exp=\(expires)"
        )
        let paired = try await agent.pair(link)
        #expect(paired.status == 0, "\(paired.stderr)")
        let home = Home(lan: lan, tunnel: tunnel, agent: agent, gatewayPort: gatewayPort, config: config)
        #expect(
            await agent.waitForActive(timeout: 15) { $0?.baseURL == lan.baseURL } != nil,
            "active on the LAN: \(agent.process.stderr.suffix(1500))")
        #expect(await agent.waitForRoute(timeout: 15) { $0.via == .wan && $0.verdict == .ready } != nil, "tunnel ready")
        return home
    }

    /// Some traffic through the gateway, so its table has figures.
    private func traffic(_ home: Home) async throws {
        for stream in [false, true, false, true] {
            let body =
                #"{"model": "test/model", "stream": \#(stream), "messages": [{"role": "user", "content": "hi"}]}"#
            let answer = try await curl([
                "-H", "Content-Type: application/json", "-d", body,
                "http://127.0.0.1:\(home.gatewayPort)/v1/chat/completions",
            ])
            #expect(answer.status == 200)
        }
    }

    private var screenshotDirectory: String {
        ProcessInfo.processInfo.environment["LMX_SCREENSHOT_DIR"] ?? "/tmp/lmx-screenshots"
    }

    @Test(
        "the dashboard in Chromium: loads with no console error, shows the active route, follows failover and return within a second; rebinding, other sites and framing refused"
    )
    func dashboard() async throws {
        try await withResources {
            let home = try await startHome()
            try await traffic(home)
            let browser = try await Browser.start(hosts: ["evil.example"])
            try await browser.open(home.dashboard)
            #expect(
                await browser.waitUntil("return document.getElementById('now').dataset.via === 'lan'", timeout: 10)
                    != nil)
            #expect(await browser.text("active-where") == "On the LAN: Studio")
            #expect(
                await browser.waitUntil("return document.querySelectorAll('#servers .route').length === 2", timeout: 5)
                    != nil)
            #expect(
                await browser.waitUntil(
                    "return document.querySelector('#traffic tbody td').textContent === 'test/model'", timeout: 8)
                    != nil)
            #expect(
                await browser.waitUntil(
                    "return /Expires in 2 days/.test(document.getElementById('pairings').textContent)", timeout: 5)
                    != nil)
            let page = await browser.text("pairings") + (await browser.text("servers"))
            for secret in ["inference-key", "access-secret"] { #expect(!page.contains(secret)) }
            #expect(
                await browser.waitUntil("return document.querySelectorAll('#events li .seq').length > 0", timeout: 5)
                    != nil)
            #expect(await browser.text("connection") == "Live")
            try await Task.sleep(for: .seconds(1.5))  // a few probes for the latency graph
            let lightProblems = try await lowContrast(browser)
            #expect(lightProblems.isEmpty, "light: \(lightProblems)")
            let dir = screenshotDirectory
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            try await browser.resize(width: 1200, height: 1500)  // the whole page, for docs/
            try await Task.sleep(for: .milliseconds(300))
            let light = try await browser.screenshot(to: dir + "/dashboard-light.png")
            #expect(pngSize(light).map { $0.width == 1200 && $0.height > 500 } == true)

            // Failover: the page changes within a second of the agent.
            await home.lan.set("dead")
            let (agentAway, pageAway) = try await changeSeen(home, browser, to: .wan)
            #expect(agentAway != nil && pageAway != nil, "agent \(agentAway ?? -1) page \(pageAway ?? -1)")
            if let agentAway, let pageAway {
                #expect(pageAway - agentAway <= 1, "page \(pageAway - agentAway) s after the agent")
            }
            #expect(await browser.text("active-where") == "Through the tunnel: Studio")
            // One card for the server, its LAN route and tunnel on it; the timeline in sentences.
            #expect((try await browser.run("return document.querySelectorAll('#servers .card').length")) as? Int == 1)
            let told = await browser.waitUntil(
                "return [...document.querySelectorAll('#events .what')].some((e) => e.textContent.startsWith('Requests now go through the tunnel to Studio'))",
                timeout: 5)
            let timeline = await browser.text("events")
            #expect(told != nil, "\(timeline)")
            for doubled in ["→", "ready: ready", "down: down", "health "] {
                #expect(!timeline.contains(doubled), "\(doubled) in \(timeline)")
            }
            try await browser.prefersDark(true)
            try await Task.sleep(for: .milliseconds(400))
            #expect(
                (try await browser.run("return getComputedStyle(document.body).backgroundColor")) as? String
                    == "rgb(13, 17, 23)")
            let darkProblems = try await lowContrast(browser)
            #expect(darkProblems.isEmpty, "dark: \(darkProblems)")
            let dark = try await browser.screenshot(to: dir + "/dashboard-dark.png")
            #expect(pngSize(dark) != nil)
            try await browser.prefersDark(false)

            // Return: back on the LAN, within a second of the agent too.
            await home.lan.set("alive")
            let (agentHome, pageHome) = try await changeSeen(home, browser, to: .lan)
            #expect(agentHome != nil && pageHome != nil, "agent \(agentHome ?? -1) page \(pageHome ?? -1)")
            if let agentHome, let pageHome {
                #expect(pageHome - agentHome <= 1, "page \(pageHome - agentHome) s after the agent")
            }
            // The ribbons: a switch mark at each of the agent's switches, at its very time.
            let agentEvents = try JSONDecoder().decode(
                [StatusAPI.Event].self, from: Data(try home.agent.client.request("GET", "/v1/events?limit=1000").body))
            let switchTimes = agentEvents.filter { $0.kind == "active" }.map(\.at)
            let expected = "[" + switchTimes.map { "\"\($0)\"" }.joined(separator: ",") + "]"
            let marked = await browser.waitUntil(
                "return JSON.stringify([...new Set([...document.querySelectorAll('#ribbons line.switch')].map((l) => l.dataset.at))]) === '\(expected)'",
                timeout: 8)
            let marks =
                try await browser.run(
                    "return [...new Set([...document.querySelectorAll('#ribbons line.switch')].map((l) => l.dataset.at))]"
                )
                as? [String] ?? []
            #expect(marked != nil && marks == switchTimes, "page \(marks) events \(switchTimes)")
            print(
                "figure: dashboard followed failover \(String(format: "%.3f", (pageAway ?? 0) - (agentAway ?? 0))) s and return \(String(format: "%.3f", (pageHome ?? 0) - (agentHome ?? 0))) s after the agent"
            )

            // A phone-width window: no sideways scrolling.
            try await browser.resize(width: 390, height: 1400)
            try await Task.sleep(for: .milliseconds(400))
            let overflow =
                try await browser.run(
                    "return document.documentElement.scrollWidth - document.documentElement.clientWidth") as? Int
            #expect(overflow == 0, "scrolls sideways by \(overflow ?? -1) px")
            let narrow = try await browser.screenshot(to: dir + "/dashboard-narrow.png")
            #expect(pngSize(narrow).map { $0.width <= 400 } == true)

            let console = try await browser.console()
            let errors = console.filter { $0.level == "SEVERE" }
            #expect(errors.isEmpty, "console errors: \(errors)")

            // DNS rebinding: a name of someone else's that resolves to 127.0.0.1.
            try await browser.open("http://evil.example:\(home.gatewayPort)/")
            let rebound =
                await browser.text("now")
                + ((try await browser.run("return document.body.textContent")) as? String ?? "")
            #expect(rebound.contains("forbidden_host") && !rebound.contains("Studio"), "\(rebound.prefix(300))")
            // Another site's page: its fetch of the status and its frame of the dashboard refused.
            let site = try await evilSite(home.gatewayPort)
            let before = try refusedCount(home.agent)
            try await browser.open("http://evil.example:\(site)/evil.html")
            #expect(await browser.waitUntil("return document.title === 'done'", timeout: 10) != nil)
            let stolen = await browser.text("result")
            #expect(stolen.hasPrefix("blocked"), "\(stolen)")
            try await Task.sleep(for: .milliseconds(500))
            #expect(try refusedCount(home.agent) >= before + 2, "the agent refused the cross-site fetch and the frame")
            // The browser itself refused to show the dashboard in the other site's frame.
            let log = try await browser.console()
            let refusedFrame = log.contains {
                $0.message.contains("frame-ancestors 'none'") && $0.message.contains("blocked")
            }
            #expect(refusedFrame, "Chromium did not refuse the frame: \(log)")

            // The same refusals at the HTTP level, as any client sees them.
            let base = "http://127.0.0.1:\(home.gatewayPort)"
            #expect(try await curl(["-H", "Host: evil.example:\(home.gatewayPort)", base + "/"]).status == 403)
            #expect(
                try await curl(["-H", "Origin: http://evil.example", base + "/dashboard/api/status"]).status == 403)
            #expect(try await curl(["-X", "POST", base + "/dashboard/api/status"]).status == 405)
            let head = try await Command.run("/usr/bin/curl", ["-s", "-D", "-", "-o", "/dev/null", base + "/"])
            for header in [
                "content-security-policy: default-src 'none'; script-src 'self'", "x-frame-options: deny",
                "x-content-type-options: nosniff",
            ] {
                #expect(head.stdout.lowercased().contains(header), "\(header)")
            }
            #expect(
                !head.stdout.lowercased().contains("set-cookie")
                    && !head.stdout.lowercased().contains("access-control-"))
            // The gateway still forwards /v1/*.
            #expect(try await curl([base + "/v1/models"]).status == 200)
        }
    }

    /// Text on the page below WCAG AA contrast (4.5:1; 3:1 for large or bold text), and images
    /// and graphs without a text alternative: what fails, as "text (ratio)".
    private func lowContrast(_ browser: Browser) async throws -> [String] {
        let script = """
            function rgb(c) { const m = c.match(/[\\d.]+/g).map(Number); return { r: m[0], g: m[1], b: m[2], a: m.length > 3 ? m[3] : 1 }; }
            function lum(c) { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); }; return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b); }
            function background(e) { for (; e; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor); if (c.a > 0.5) return c; } return { r: 255, g: 255, b: 255, a: 1 }; }
            const bad = [];
            for (const e of document.querySelectorAll('body *')) {
              const own = [...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
              if (!own || e.offsetParent === null) continue;
              const style = getComputedStyle(e);
              const a = lum(rgb(style.color)), b = lum(background(e));
              const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
              const large = parseFloat(style.fontSize) >= 24 || (parseFloat(style.fontSize) >= 18.66 && Number(style.fontWeight) >= 700);
              if (ratio < (large ? 3 : 4.5)) bad.push(e.textContent.trim().slice(0, 30) + ' (' + ratio.toFixed(2) + ')');
            }
            for (const e of document.querySelectorAll('img:not([alt]), svg[role=img]:not([aria-label])')) bad.push('no text alternative: ' + e.outerHTML.slice(0, 60));
            return bad;
            """
        return try await browser.run(script) as? [String] ?? ["the check did not run"]
    }

    /// Seconds after the change until the agent's status, and the page, show `via`.
    private func changeSeen(_ home: Home, _ browser: Browser, to via: Via) async throws -> (
        agent: Double?, page: Double?
    ) {
        let start = ContinuousClock.now
        var agent: Double?
        var page: Double?
        while (ContinuousClock.now - start).seconds < 20, agent == nil || page == nil {
            if agent == nil, home.agent.active()?.via == via { agent = (ContinuousClock.now - start).seconds }
            if page == nil,
                (try? await browser.run("return document.getElementById('now').dataset.via")) as? String == via.rawValue
            {
                page = (ContinuousClock.now - start).seconds
                if agent == nil, home.agent.active()?.via == via { agent = page }
            }
            try await Task.sleep(for: .milliseconds(10))
        }
        return (agent, page)
    }

    /// A page of another site (served from loopback, reached as evil.example) that tries to read
    /// the dashboard's status and to show the dashboard in a frame.
    private func evilSite(_ gatewayPort: Int) async throws -> Int {
        let dir = "/tmp/lmx-evil-\(TestBed.tag())"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let page = """
            <!doctype html><title>evil</title><p id="result">running</p>
            <iframe src="http://127.0.0.1:\(gatewayPort)/"></iframe>
            <script>
            fetch('http://127.0.0.1:\(gatewayPort)/dashboard/api/status')
              .then(r => r.text()).then(t => { document.getElementById('result').textContent = 'read ' + t.slice(0, 80); })
              .catch(e => { document.getElementById('result').textContent = 'blocked: ' + e; })
              .finally(() => setTimeout(() => { document.title = 'done'; }, 300));
            </script>
            """
        try page.write(toFile: dir + "/evil.html", atomically: true, encoding: .utf8)
        let port = freePort()
        let server = LiveProcess(
            "/usr/bin/python3", ["-m", "http.server", "--bind", "127.0.0.1", "--directory", dir, String(port)])
        try await server.start()
        var up = false
        for _ in 0..<50 where !up {
            up = (try? await curl(["http://127.0.0.1:\(port)/evil.html"]))?.status == 200
            if !up { try await Task.sleep(for: .milliseconds(100)) }
        }
        #expect(up, "the other site's server")
        return port
    }

    private func refusedCount(_ agent: AgentProcess) throws -> Int {
        let text = String(decoding: try agent.client.request("GET", "/metrics").body, as: UTF8.self)
        let line = text.split(separator: "\n").first { $0.hasPrefix("lmx_gateway_refused_total ") }
        return line.flatMap { Double($0.split(separator: " ").last ?? "") }.map { Int($0) } ?? -1
    }

    @Test(
        "lmx-notify on a session bus: quiet at start; failover and return one notification each, replaced in place; a flapping route at most one per interval; the click opens the dashboard; the agent's restart; the session's end"
    )
    func notifications() async throws {
        try await withResources {
            let home = try await startHome()
            let dir = home.agent.directory
            let address = "unix:path=\(dir)/session-bus"
            let bus = LiveProcess(
                "/usr/bin/dbus-daemon",
                ["--config-file=/usr/share/dbus-1/session.conf", "--address=\(address)", "--nofork", "--nopidfile"])
            try await bus.start()
            #expect(await bus.waitFor(timeout: 5) { _ in FileManager.default.fileExists(atPath: "\(dir)/session-bus") })
            let recorder = LiveProcess(
                "/usr/bin/python3", ["\(TestBed.repo)/scripts/fixtures/notification-recorder.py", "--bus", address])
            try await recorder.start()
            #expect(await recorder.waitForLine(containing: #""call": "ready""#, timeout: 10), "\(recorder.stderr)")
            let opener = dir + "/opener.sh"
            try "#!/bin/sh\necho \"$@\" >> \(dir)/opened\n".write(toFile: opener, atomically: true, encoding: .utf8)
            try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: opener)
            let interval = 3.0
            let notify = LiveProcess(
                "\(TestBed.binDir)/lmx-agent",
                ["notify", "--socket", home.agent.socket, "--interval", String(interval), "--open-with", opener],
                environment: ["DBUS_SESSION_BUS_ADDRESS": address])
            try await notify.start()
            #expect(await notify.waitForLine(containing: "following lmx-agentd", timeout: 5))

            func notices() -> [[String: Any]] {
                recorder.stdoutLines.compactMap {
                    try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
                }
                .filter { $0["call"] as? String == "Notify" }
            }
            func route() -> [[String: Any]] {
                notices().filter {
                    ["Switched to the tunnel", "Back home on the LAN", "No LMX server usable"].contains(
                        $0["summary"] as? String ?? "")
                }
            }

            // Quiet at start: only the pairing that expires in two days is told (once).
            try await Task.sleep(for: .seconds(2))
            #expect(route().isEmpty, "\(notices())")
            let reminders = notices().filter {
                ($0["summary"] as? String ?? "").hasPrefix("Pairing “Studio” expires in")
            }
            #expect(reminders.count == 1, "\(notices())")

            // Failover: one notification, with why.
            await home.lan.set("dead")
            #expect(await home.agent.waitForActive(timeout: 10) { $0?.via == .wan } != nil)
            #expect(await recorder.waitFor(timeout: 5) { _ in route().count >= 1 })
            try await Task.sleep(for: .seconds(1))
            let away = route()
            #expect(away.count == 1, "\(away)")
            #expect(away.first?["summary"] as? String == "Switched to the tunnel")
            #expect(
                (away.first?["body"] as? String ?? "").contains("Studio")
                    && (away.first?["body"] as? String ?? "").contains("refused"), "\(away)")
            #expect(
                away.first?["urgency"] as? Int == 1
                    && away.first?["actions"] as? [String] == ["default", "Open dashboard"])
            let id = away.first?["id"] as? Int ?? -1

            // Return: one more, replacing the first in place (after the interval).
            await home.lan.set("alive")
            #expect(await home.agent.waitForActive(timeout: 10) { $0?.via == .lan } != nil)
            #expect(await recorder.waitFor(timeout: interval + 3) { _ in route().count >= 2 })
            try await Task.sleep(for: .seconds(1))
            let back = route()
            #expect(back.count == 2, "\(back)")
            #expect(
                back.last?["summary"] as? String == "Back home on the LAN" && back.last?["replaces_id"] as? Int == id)
            #expect(back.last?["urgency"] as? Int == 0)
            for notice in notices() {
                let text = "\(notice["summary"] ?? "") \(notice["body"] ?? "")"
                #expect(!text.contains("inference-key") && !text.contains("access-secret"))
            }

            // The click opens the dashboard.
            recorder.send("click \(id)")
            #expect(
                await notify.waitFor(timeout: 5) { _ in
                    (try? String(contentsOfFile: dir + "/opened", encoding: .utf8)) != nil
                })
            #expect((try? String(contentsOfFile: dir + "/opened", encoding: .utf8)) == home.dashboard + "\n")

            // A route that flaps for 10 s: at most one notification per interval.
            try await Task.sleep(for: .seconds(interval))
            let beforeFlap = route().count
            let flapStart = ContinuousClock.now
            var flips = 0
            while (ContinuousClock.now - flapStart).seconds < 10 {
                await home.lan.set(flips % 2 == 0 ? "dead" : "alive")
                flips += 1
                try await Task.sleep(for: .milliseconds(700))
            }
            await home.lan.set("alive")
            #expect(await home.agent.waitForActive(timeout: 15) { $0?.via == .lan } != nil)
            try await Task.sleep(for: .seconds(interval + 1))
            let flapped = route().count - beforeFlap
            let bound = Int((13 + interval) / interval) + 1
            print(
                "figure: a route flapping \(flips) times in 10 s gave \(flapped) notifications (interval \(interval) s, bound \(bound))"
            )
            #expect(flapped <= bound, "\(flapped) notifications")
            #expect(route().last?["summary"] as? String == "Back home on the LAN")
            #expect(Set(route().compactMap { $0["id"] as? Int }) == [id], "one notification, replaced in place")

            // The agent restarts: followed again, nothing told (it is back on the LAN at once).
            let told = notices().count
            await home.agent.stop()
            #expect(await notify.waitForLine(containing: "waiting for", timeout: 5))
            let again = try await AgentProcess.start(
                bed, config: home.config, arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(home.gatewayPort)"],
                directory: dir)
            #expect(await again.waitForActive(timeout: 15) { $0?.via == .lan } != nil)
            #expect(await notify.waitForLine(containing: "lmx-agentd is back", timeout: 10))
            try await Task.sleep(for: .seconds(6))
            #expect(notices().count == told, "\(notices().suffix(2))")

            // The session ends: lmx-notify stops, cleanly.
            await bus.stop()
            let status = try await notify.waitForExit(timeout: 5)
            #expect(status == 0, "\(notify.stderr)")
            #expect(notify.stderr.contains("the session bus is gone"))
        }
    }
}
