import Foundation
import LMXCore
import Testing

/// The agent on a roaming machine (CONTRACT §7 trust, issue: follow the machine): it runs in
/// namespace host h4, which has two links: lan0 on the test LAN, and wan0 to this machine,
/// where the paired server's tunnel (HTTPS) listens. The paired server itself is on h1, at the
/// address its tunnel vouches for. `testbed.sh roam away` moves h4 to another subnet with a
/// default route to a router that never answers (a laptop joining another Wi-Fi network);
/// `roam home` brings it back. A logind stand-in on h4's bus sends `PrepareForSleep`.
@Suite("Roaming: leaving home, coming home, waking from sleep", .serialized)
struct RoamingTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    struct Home {
        let lan: LMXServer
        let tunnel: LMXServer
        let agent: AgentProcess
        var lanURL: String { lan.baseURL }
        var tunnelURL: String
        var gatewaySocket: String { agent.directory + "/gateway.sock" }
    }

    /// The paired server on h1 and its tunnel on this machine's wan side; the agent in h4,
    /// paired by a QR-code text, active on the LAN, the tunnel probed and up. `lanExtra`: the LAN
    /// server's own options; `tunnelForwards`: the tunnel is a connector forwarding to that very
    /// server (one server, one state: its runs), not a second server with the same instance.
    private func startHome(lanExtra: [String] = [], tunnelForwards: Bool = false) async throws -> Home {
        let port = freePort()
        let tunnelPort = freePort()
        let instance = "roam-\(port)"
        let lanURL = "http://\(bed.address(.h1)):\(port)"
        let lan = try await LMXServer.start(
            bed, on: .h1, port: port, instance: instance,
            extra: lanExtra + (tunnelForwards ? ["--base-urls", lanURL] : []))
        let tunnelAddress = bed["LMX_TESTBED_H4_TUNNEL_ADDR"]
        let tunnel =
            tunnelForwards
            ? try await LMXServer.start(
                bed, on: .root, port: tunnelPort, bind: tunnelAddress, tls: true, extra: ["--proxy-to", lanURL])
            : try await LMXServer.start(
                bed, on: .root, port: tunnelPort, instance: instance, bind: tunnelAddress, tls: true,
                extra: ["--base-urls", lanURL])
        _ = try await Publish.avahi(bed, on: .h1, name: "Roam \(TestBed.tag())", port: port)
        let config = #"{"interfaces": ["lan0"], "extra_ca_file": "\#(bed["LMX_TESTBED_TLS"])/ca.pem"}"#
        // The gateway on h4's own loopback, and on its socket (which the tests use from here).
        let agent = try await AgentProcess.start(
            bed, config: config, arguments: ["--gateway", "127.0.0.1:\(freePort())"], host: .h4)
        let tunnelURL = "https://\(tunnelAddress):\(tunnelPort)"
        let paired = try await agent.pair(pairingLink(name: "Studio", url: tunnelURL, extra: "&key=ADMIN-S3CRET"))
        #expect(paired.status == 0, "\(paired.stderr)")
        let home = Home(lan: lan, tunnel: tunnel, agent: agent, tunnelURL: tunnelURL)
        #expect(
            await agent.waitForActive(timeout: 15) { $0?.baseURL == home.lanURL } != nil,
            "active on the LAN: \(agent.process.stderr.suffix(2000))")
        #expect(
            await agent.waitForRoute(timeout: 15) { $0.baseURL == tunnelURL && $0.health == .up } != nil, "tunnel up")
        return home
    }

    /// Starts with h4 at home (whatever an earlier run cut off midway left) and always brings it
    /// home again, whatever the test did.
    private func roaming(_ body: () async throws -> Void) async throws {
        try await bed.control("roam", "home")
        do {
            try await withResources { try await body() }
        } catch {
            try? await bed.control("roam", "home")
            throw error
        }
        try await bed.control("roam", "home")
    }

    @Test(
        "leave home: active via the tunnel within 500 ms (no probe timeouts); come home: on the LAN within 2 s (no stability window)"
    )
    func leaveAndComeHome() async throws {
        try await roaming {
            let home = try await startHome()
            let agent = home.agent

            let leaving = ContinuousClock.now
            try await bed.control("roam", "away")
            let away = await agent.waitForActive(timeout: 10) { $0?.via == .wan }
            let leave = (ContinuousClock.now - leaving).seconds
            #expect(away != nil)
            #expect(leave <= 0.5, "tunnel active \(leave) s after leaving")
            let lanRoute = await agent.waitForRoute(timeout: 2) { $0.baseURL == home.lanURL }
            #expect(
                lanRoute?.reason.hasPrefix("not reachable from this machine now") == true, "\(lanRoute?.reason ?? "")")
            // Requests go through the tunnel.
            let models = try await curl(["-D", "-", "--unix-socket", home.gatewaySocket, "http://localhost/v1/models"])
            #expect(models.status == 200 && models.body.contains("X-LMX-Via: wan"), "\(models.body)")

            // Away long enough for the LAN route's probes to fail and back off.
            try await Task.sleep(for: .seconds(6))
            #expect(agent.active()?.via == .wan)

            let returning = ContinuousClock.now
            try await bed.control("roam", "home")
            let back = await agent.waitForActive(timeout: 30) { $0?.baseURL == home.lanURL }
            let homeTime = (ContinuousClock.now - returning).seconds
            #expect(back != nil)
            #expect(homeTime <= 2, "LAN active \(homeTime) s after coming home")
            // mDNS withdrew the server while away (avahi-daemon dropped what it had heard on the
            // old network); it is announced again at once.
            #expect(lanRoute?.announced == false)
            #expect(await agent.waitForRoute(timeout: 2) { $0.baseURL == home.lanURL && $0.announced } != nil)
            let announced = (ContinuousClock.now - returning).seconds
            let again = try await curl(["-D", "-", "--unix-socket", home.gatewaySocket, "http://localhost/v1/models"])
            #expect(again.status == 200 && again.body.contains("X-LMX-Via: lan"), "\(again.body)")
            let events = try agent.client.request("GET", "/v1/events?limit=50")
            #expect(String(decoding: events.body, as: UTF8.self).contains(#""kind":"network""#))
            print(
                "roaming: leave → tunnel \(String(format: "%.3f", leave)) s, home → LAN \(String(format: "%.3f", homeTime)) s, announced again \(String(format: "%.3f", announced)) s"
            )
        }
    }

    @Test(
        "come home with the link back last (the route, then the address undone; and the mirror, the address first): on the LAN within 1 s of the LAN answering (each probe gives up on its connection after 250 ms, the next at once); leaving within 500 ms",
        arguments: ["home-address", "home-address-first"], [200, 1300]
    )
    func comeHomeLinkLast(sequence: String, gapMS: Int) async throws {
        try await roaming {
            let home = try await startHome()
            let agent = home.agent
            let leaving = ContinuousClock.now
            try await bed.control("roam", "away")
            #expect(await agent.waitForActive(timeout: 10) { $0?.via == .wan } != nil)
            let leave = (ContinuousClock.now - leaving).seconds
            #expect(leave <= 0.5, "tunnel active \(leave) s after leaving")
            // Away long enough for the LAN route's probes to fail and back off.
            try await Task.sleep(for: .seconds(6))
            #expect(agent.active()?.via == .wan)
            // The address and route of home, the link still off: the LAN does not answer yet.
            try await bed.control("roam", sequence)
            try await Task.sleep(for: .milliseconds(gapMS))
            #expect(agent.active()?.via == .wan, "nothing answers on the LAN before the link is back")
            // When the LAN answers again, as any program on h4 sees it: a TCP connection to the
            // server gets through (the kernel resolves the server's address again on its own
            // schedule, a solicitation a second: up to a second after the link).
            let hostPort = home.lanURL.replacingOccurrences(of: "http://", with: "").split(separator: ":")
            let answering = #"""
                import socket, sys, time
                end = time.time() + 10
                while time.time() < end:
                    s = socket.socket()
                    s.settimeout(0.05)
                    try:
                        s.connect((sys.argv[1], int(sys.argv[2])))
                        print(repr(time.time()))
                        break
                    except OSError:
                        pass
                    finally:
                        s.close()
                """#
            async let answered = Command.run(
                "/usr/sbin/ip",
                [
                    "netns", "exec", bed["LMX_TESTBED_H4_NS"], "/usr/bin/python3", "-c", answering,
                    String(hostPort[0]), String(hostPort[1]),
                ], timeout: 15)
            try await Task.sleep(for: .milliseconds(100))
            let linked = ContinuousClock.now
            try await bed.control("roam", "link-back")
            let back = await agent.waitForActive(timeout: 30) { $0?.baseURL == home.lanURL }
            let backAt = Date().timeIntervalSince1970
            let homeTime = (ContinuousClock.now - linked).seconds
            #expect(back != nil)
            let lanAnswered = Double(try await answered.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
            #expect(lanAnswered != nil, "the LAN answered again")
            let afterAnswering = backAt - (lanAnswered ?? 0)
            #expect(afterAnswering <= 1, "LAN active \(afterAnswering) s after the LAN answered (\(sequence))")
            #expect(homeTime <= 2, "LAN active \(homeTime) s after the link came back (\(sequence))")
            print(
                "roaming (\(sequence), link last \(gapMS) ms later): leave → tunnel \(String(format: "%.3f", leave)) s, link back → LAN answering \(String(format: "%.3f", homeTime - afterAnswering)) s → LAN active \(String(format: "%.3f", afterAnswering)) s later"
            )
        }
    }

    @Test(
        "a run's event stream through the gateway goes on across a LAN black hole (by the tunnel) and across the return to the LAN: every snapshot in order, none twice, no error event, the next event within 1 s of each switch, then the run's end"
    )
    func runStreamAcrossSwitches() async throws {
        try await roaming {
            // The tunnel: the same server behind Cloudflare's edge (a connector forwarding to it).
            let home = try await startHome(
                lanExtra: ["--agents", "--run-steps", "120", "--run-step-ms", "250"], tunnelForwards: true)
            let agent = home.agent
            let lan = home.lan
            let tunnel = home.tunnel
            let socket = agent.directory + "/gateway.sock"
            let made = try await curl([
                "--unix-socket", socket, "-H", "Content-Type: application/json", "--data-binary",
                #"{"agent": "writer", "input": {"topic": "roaming"}}"#, "http://localhost/v1/agents/runs",
            ])
            #expect(made.status == 201, "\(made.body)")
            let run =
                (try? JSONSerialization.jsonObject(with: Data(made.body.utf8)) as? [String: Any])?["id"] as? String
            guard let run else { return }
            async let followed = Command.run(
                "/usr/bin/python3",
                [
                    "\(TestBed.repo)/scripts/fixtures/gateway-client.py", "run-events",
                    "http://localhost/v1/agents/runs/\(run)/events", "--unix", socket,
                ],
                timeout: 60)
            try await Task.sleep(for: .milliseconds(1500))
            // The LAN path black-holed: the agent finds out by its probes and moves to the tunnel.
            try await bed.control("roam", "cut")
            #expect(await agent.waitForActive(timeout: 10) { $0?.via == .wan } != nil)
            let toTunnel = Date().timeIntervalSince1970
            try await Task.sleep(for: .milliseconds(2500))
            try await bed.control("roam", "link-back")
            // Back once its probes answer and the stability window has passed (a route that failed
            // by itself, as far as this machine can tell).
            #expect(await agent.waitForActive(timeout: 25) { $0?.baseURL == lan.baseURL } != nil)
            let toLAN = Date().timeIntervalSince1970
            let result = try await followed
            struct Seen: Decodable {
                var t: Double
                var status: Int?
                var event: String?
                var steps: Int?
                var done: Bool?
                var error: String?
                var junk: String?
                var broken: String?
            }
            let seen = result.stdout.split(separator: "\n").compactMap {
                try? JSONDecoder().decode(Seen.self, from: Data($0.utf8))
            }
            #expect(seen.first?.status == 200, "\(result.stdout) \(result.stderr)")
            #expect(!seen.contains { $0.error != nil || $0.junk != nil || $0.broken != nil }, "\(result.stdout)")
            let snapshots = seen.filter { $0.steps != nil }
            let steps = snapshots.compactMap(\.steps)
            #expect(zip(steps, steps.dropFirst()).allSatisfy { $0 < $1 }, "in order, none twice: \(steps)")
            #expect(snapshots.last?.event == "run.completed" && steps.last == 120, "\(steps)")
            #expect(seen.contains { $0.done == true }, "the stream's end")
            func nextEvent(after t: Double) -> Double? { snapshots.first { $0.t > t }.map { $0.t - t } }
            let afterTunnel = nextEvent(after: toTunnel)
            let afterLAN = nextEvent(after: toLAN)
            #expect(
                afterTunnel.map { $0 <= 1 } == true, "next event \(afterTunnel ?? -1) s after the move to the tunnel")
            #expect(afterLAN.map { $0 <= 1 } == true, "next event \(afterLAN ?? -1) s after the return to the LAN")
            #expect(tunnel.process.stdoutLines.contains { $0.hasPrefix("TUNNEL GET /v1/agents/runs/\(run)/events") })
            let metrics = String(decoding: try agent.client.request("GET", "/metrics").body, as: UTF8.self)
            #expect(
                metrics.split(separator: "\n").contains {
                    $0.hasPrefix("lmx_gateway_streams_resumed_total ") && !$0.hasSuffix(" 0")
                },
                "\(metrics.split(separator: "\n").filter { $0.contains("resumed") })")
            print(
                "run stream across switches: \(steps.count) snapshots, next event \(String(format: "%.3f", afterTunnel ?? -1)) s after the move to the tunnel, \(String(format: "%.3f", afterLAN ?? -1)) s after the return"
            )
        }
    }

    @Test(
        "PrepareForSleep(false) from logind (a stand-in owning org.freedesktop.login1): every route re-probed within 1 s; the gateway waits for a fresh verdict"
    )
    func wakeFromSleep() async throws {
        try await roaming {
            let home = try await startHome()
            let agent = home.agent
            // Let the tunnel settle into its 60 s standby schedule.
            try await Task.sleep(for: .seconds(2))
            let before = try Dictionary(
                uniqueKeysWithValues: agent.status().candidates.flatMap(\.routes).map { ($0.id, $0.probes) })
            #expect(before.count >= 2)

            // Anyone on the bus may send a signal of that name; only logind's is heard.
            let forged = try await Command.run(
                "/usr/bin/dbus-send",
                [
                    "--bus=\(bed.bus(.h4))", "--type=signal", "/org/freedesktop/login1",
                    "org.freedesktop.login1.Manager.PrepareForSleep", "boolean:false",
                ])
            #expect(forged.status == 0, "\(forged.stderr)")
            try await Task.sleep(for: .milliseconds(500))
            #expect(
                !agent.process.stderr.contains("woke from sleep"), "a signal not from org.freedesktop.login1's owner")
            // Another user sends it unicast to every connection on the bus (no match rule filters
            // those), 50 times each: not heard either, and said in the log.
            let unicast = try await Command.run(
                "/usr/bin/setpriv",
                [
                    "--reuid", "nobody", "--regid", "nogroup", "--clear-groups", "--", "/usr/bin/python3",
                    "\(TestBed.repo)/scripts/fixtures/forge-wake.py", "--bus", bed.bus(.h4), "--count", "50",
                ])
            #expect(unicast.status == 0 && unicast.stdout.hasPrefix("sent "), "\(unicast.stderr)")
            #expect(await agent.process.waitForLine(containing: "not sent by logind was ignored", timeout: 3))
            try await Task.sleep(for: .milliseconds(300))
            #expect(!agent.process.stderr.contains("woke from sleep"), "a unicast PrepareForSleep from another user")

            let sent = ContinuousClock.now
            let standin = try await Command.run(
                "/usr/bin/python3",
                ["\(TestBed.repo)/scripts/fixtures/login1-standin.py", "--bus", bed.bus(.h4), "wake"])
            #expect(standin.status == 0, "\(standin.stderr)")
            var reprobed: Double?
            while (ContinuousClock.now - sent).seconds < 5 {
                let now = try agent.status().candidates.flatMap(\.routes)
                if now.allSatisfy({ $0.probes > (before[$0.id] ?? 0) }) {
                    reprobed = (ContinuousClock.now - sent).seconds
                    break
                }
                try await Task.sleep(for: .milliseconds(20))
            }
            #expect(
                reprobed != nil && reprobed! <= 1,
                "every route re-probed after \(reprobed.map { "\($0) s" } ?? "more than 5 s")")
            #expect(agent.process.stderr.contains("woke from sleep: logind: PrepareForSleep(false)"))

            // The gateway: a request right after the wake waits for a first probe since (every
            // answer of either server takes 800 ms now), instead of going to a route last seen
            // before the sleep: 800 ms for that probe, then 800 ms for the request itself.
            await home.lan.set("slow 800")
            await home.tunnel.set("slow 800")
            try await Task.sleep(for: .seconds(2))
            let logged = agent.process.stderr.components(separatedBy: "woke from sleep").count
            _ = try await Command.run(
                "/usr/bin/python3",
                ["\(TestBed.repo)/scripts/fixtures/login1-standin.py", "--bus", bed.bus(.h4), "wake"])
            #expect(
                await agent.process.waitFor(timeout: 5) {
                    $0.stderr.components(separatedBy: "woke from sleep").count > logged
                })
            let start = ContinuousClock.now
            let models = try await curl(["-D", "-", "--unix-socket", home.gatewaySocket, "http://localhost/v1/models"])
            let took = (ContinuousClock.now - start).seconds
            #expect(models.status == 200, "\(models.body)")
            #expect(took >= 1.2, "held for a fresh probe, then answered: \(took) s")
            print(
                "wake: every route re-probed after \(reprobed.map { String(format: "%.3f", $0) } ?? "-") s; a gateway request after the wake took \(String(format: "%.3f", took)) s"
            )
        }
    }
}
