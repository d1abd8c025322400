import Testing

@testable import LMXCore

private func announced(_ host: String) -> Route {
    Route(baseURL: "http://\(host):1234", via: .lan, source: .mdns, name: host, announced: true)
}

@Suite("Restarts without an announcement (the restart watch)")
struct RestartWatchTests {
    /// LAN server at 10.0.0.1, a paired tunnel always ready; the LAN server answers only while
    /// `alive(t)` holds.
    private func harness(alive: @escaping (Double) -> Bool) -> PlannerHarness {
        var h = PlannerHarness { id, t in id.hasPrefix("wan") ? .ready : (alive(t) ? .ready : .down) }
        h.add(wan("https://t.example.com"))
        h.add(announced("10.0.0.1"))
        return h
    }

    @Test("a server killed without goodbye and restarted with no announcement is usable ≤ 3 s after it answers")
    func restartWithoutAnnouncement() {
        // Down from 100 to 127.3 (a restart that takes its time to load), then answering again.
        var h = harness { t in t < 100 || t >= 127.3 }
        h.run(until: 99)
        #expect(h.planner.activeID == "lan/10.0.0.1:1234")
        h.run(until: 127.3)
        #expect(h.planner.activeID == "wan/https://t.example.com")
        var usableAt: Double?
        while h.now < 140 {
            h.run(until: h.now + 0.05)
            if usableAt == nil, let s = h.planner.routes["lan/10.0.0.1:1234"], s.health == .up { usableAt = h.now }
        }
        let delay = (usableAt ?? 999) - 127.3
        #expect(delay <= 3.0, "usable \(delay) s after answering")
        // …and back as the active endpoint after the stability window (10 s) plus at most 3 s.
        var backAt: Double?
        while h.now < 160, backAt == nil {
            h.run(until: h.now + 0.05)
            if h.planner.activeID == "lan/10.0.0.1:1234" { backAt = h.now }
        }
        let back = (backAt ?? 999) - 127.3
        #expect(back >= 10)
        #expect(back <= 13, "back \(back) s after answering")
    }

    @Test("probe load: about one a second while watched, then the backoff ceiling (≤ 1.1 per minute)")
    func probeLoad() {
        var h = harness { t in t < 10 }
        h.run(until: 10)
        let id = "lan/10.0.0.1:1234"
        let atWatchStart = h.planner.routes[id]!.probeCount
        h.run(until: 600)
        let watched = h.planner.routes[id]!.probeCount - atWatchStart
        #expect(watched >= 450 && watched <= 800, "\(watched) probes in the 10-minute watch")
        h.run(until: 1200)
        let before = h.planner.routes[id]!.probeCount
        h.run(until: 4800)
        let perMinute = Double(h.planner.routes[id]!.probeCount - before) / 60
        #expect(perMinute <= 1.1 && perMinute >= 0.9, "\(perMinute) probes a minute once long dead")
    }

    @Test("a route that was never good backs off as before: 2, 4, 8 … up to 60 s")
    func neverGoodBacksOff() {
        var h = PlannerHarness { _, _ in .down }
        var policy = HealthPolicy()
        policy.jitter = 0
        h.planner = ConnectionPlanner(policy: policy)
        h.add(announced("10.0.0.9"))
        var times: [Double] = []
        var last = -1
        while h.now < 400 {
            h.run(until: h.now + 0.5)
            let count = h.planner.routes["lan/10.0.0.9:1234"]!.probeCount
            if count != last {
                times.append(h.now)
                last = count
            }
        }
        let gaps = zip(times.dropFirst(), times).map { ($0 - $1).rounded() }
        #expect(Array(gaps.prefix(6)) == [2, 4, 8, 16, 32, 60])
    }

    @Test("a sign of life (a resolver answer, a re-announcement) probes a backed-off route at once")
    func signOfLife() {
        var h = PlannerHarness { _, _ in .down }
        h.add(announced("10.0.0.9"))
        h.run(until: 300)
        let id = "lan/10.0.0.9:1234"
        #expect(h.planner.routes[id]!.nextProbeAt > 301)
        h.add(announced("10.0.0.9"))  // the same sighting again (updated TXT, say)
        #expect(h.planner.routes[id]!.nextProbeAt == 300)
        #expect(h.planner.takeDueProbes(now: 300).map(\.route.id) == [id])
    }
}

@Suite("Trust: what the user and the tunnel vouch for")
struct TrustPolicyTests {
    /// A paired tunnel (reporting instance `home`) that vouches for `vouched`, and announcers
    /// (host → the instance_id each reports).
    private func run(
        trust: TrustPolicy = .paired, pairing: Route?, vouched: [String] = [], announcers: [String: String?],
        until end: Double = 30
    ) -> PlannerHarness {
        var policy = HealthPolicy()
        policy.trust = trust
        var h = PlannerHarness(policy: policy) { _, _ in .ready }
        h.instance = { id in
            if id.hasPrefix("wan") { return "home" }
            return announcers.first { id.contains($0.key) }?.value ?? nil
        }
        h.vouch = { _ in vouched.map { "http://\($0):1234" } }
        if let pairing { h.add(pairing) }
        for host in announcers.keys.sorted() { h.add(announced(host)) }
        h.run(until: end)
        return h
    }

    @Test(
        "an announcer repeating the paired instance_id from an address nobody vouches for is an impostor: never active, no key"
    )
    func impostor() {
        let h = run(pairing: wan("https://t.example.com"), announcers: ["10.0.0.66": "home", "10.0.0.67": nil])
        #expect(h.planner.activeID == "wan/https://t.example.com")
        let evil = h.planner.routes["lan/10.0.0.66:1234"]!
        #expect(h.planner.trust(of: evil) == .impostor)
        #expect(
            h.planner.explain(evil, now: 30)
                == "not used: it claims to be tunnel from an address tunnel's pairing does not vouch for")
        #expect(evil.route.credentials.isEmpty)
        #expect(h.planner.requestOrder().map(\.id) == ["wan/https://t.example.com"])
        // Reported once, however often it is probed.
        #expect(h.events.filter { if case .impostor = $0 { true } else { false } }.count == 1)
        let stranger = h.planner.routes["lan/10.0.0.67:1234"]!
        #expect(h.planner.trust(of: stranger) == .announced)
        #expect(h.planner.explain(stranger, now: 30).contains("not vouched for"))
    }

    @Test(
        "the address the tunnel vouches for is the paired server on the LAN: active first, with the server's keys, never the Access token"
    )
    func tunnelVouchedAddress() {
        var tunnel = wan("https://t.example.com", pin: nil)
        tunnel.credentials = Credentials(
            adminKey: "A", inferenceKey: "I", accessClientID: "id", accessClientSecret: "s")
        let h = run(pairing: tunnel, vouched: ["10.0.0.1"], announcers: ["10.0.0.1": "home", "10.0.0.66": "home"])
        #expect(h.planner.activeID == "lan/10.0.0.1:1234")
        let home = h.planner.routes["lan/10.0.0.1:1234"]!
        #expect(h.planner.trust(of: home) == .tunnel)
        #expect(home.route.credentials == Credentials(adminKey: "A", inferenceKey: "I"))
        #expect(home.route.pinnedInstance == "home", "pinned to the instance the tunnel reported")
        #expect(home.route.announced, "still announced, merged into the vouched route")
        #expect(h.planner.trust(of: h.planner.routes["lan/10.0.0.66:1234"]!) == .impostor)
    }

    @Test("a vouched address is used with zero configuration even when nothing announces it; unlisted again, it goes")
    func vouchedWithoutAnnouncement() {
        var h = run(pairing: wan("https://t.example.com"), vouched: ["10.0.0.1"], announcers: [:])
        #expect(h.planner.activeID == "lan/10.0.0.1:1234")
        h.vouch = { _ in [] }
        h.planner.refreshAll(now: h.now)
        h.run(until: 100)
        #expect(h.planner.routes["lan/10.0.0.1:1234"] == nil)
        #expect(h.planner.activeID == "wan/https://t.example.com")
    }

    @Test("once anything is set up, announcers are never used, not even when nothing else is usable")
    func noFallbackToStrangers() {
        var h = run(pairing: wan("https://t.example.com"), announcers: ["10.0.0.66": "whoever"])
        h.script = { id, _ in id.hasPrefix("wan") ? .tunnelDown : .ready }
        h.run(until: 60)
        #expect(h.planner.activeID == nil)
        #expect(h.planner.requestOrder().isEmpty)
        // A configured endpoint counts as set up just as a pairing does.
        var manual = Route(baseURL: "https://t.example.com", via: .wan, source: .manual, name: "tunnel")
        manual.credentials = Credentials()
        var m = run(pairing: manual, announcers: ["10.0.0.66": "whoever"])
        m.script = { id, _ in id.hasPrefix("wan") ? .down : .ready }
        m.run(until: 60)
        #expect(m.planner.activeID == nil)
    }

    @Test("pinned uses nothing announced even with nothing set up; lan uses every announcer but never an impostor")
    func pinnedAndLan() {
        let strict = run(trust: .pinned, pairing: nil, announcers: ["10.0.0.66": "whoever"])
        #expect(strict.planner.activeID == nil)
        #expect(strict.planner.explain(strict.planner.routes["lan/10.0.0.66:1234"]!, now: 30).contains("trust: pinned"))
        let lan = run(
            trust: .lan, pairing: wan("https://t.example.com"),
            announcers: ["10.0.0.66": "whoever", "10.0.0.67": "home"])
        #expect(lan.planner.activeID == "lan/10.0.0.66:1234")
        #expect(lan.planner.trust(of: lan.planner.routes["lan/10.0.0.67:1234"]!) == .impostor)
        #expect(!lan.planner.requestOrder().contains { $0.id == "lan/10.0.0.67:1234" })
    }

    @Test("without anything set up every LAN server is used, LAN first")
    func zeroConfiguration() {
        let none = run(pairing: nil, announcers: ["10.0.0.66": "whoever"])
        #expect(none.planner.activeID == "lan/10.0.0.66:1234")
    }

    @Test("a model only an untrusted announcer lists is refused with its name, never routed")
    func modelOnlyOnStrangers() {
        var h = PlannerHarness { _, _ in .ready }
        h.instance = { id in id.hasPrefix("wan") ? "home" : "evil" }
        h.vouch = { _ in [] }
        h.add(wan("https://t.example.com"))
        h.add(announced("10.0.0.66"))
        h.run(until: 5)
        var report = h.planner.routes["lan/10.0.0.66:1234"]!.lastReport!
        report.models = ["secret-model"]
        h.absorb(h.planner.record(report, for: "lan/10.0.0.66:1234", now: 5))
        var tunnel = h.planner.routes["wan/https://t.example.com"]!.lastReport!
        tunnel.models = ["llama"]
        h.absorb(h.planner.record(tunnel, for: "wan/https://t.example.com", now: 5))
        let refusal = h.planner.untrustedOnly(model: "secret-model")
        #expect(refusal?.contains("secret-model") == true)
        #expect(refusal?.contains("10.0.0.66:1234 (untrusted: announced over mDNS") == true)
        #expect(h.planner.resolve(model: "secret-model").state == nil)
        #expect(!h.planner.requestOrder(model: "secret-model").contains { $0.id == "lan/10.0.0.66:1234" })
        #expect(h.planner.untrustedOnly(model: "llama") == nil)
        #expect(
            h.planner.untrustedOnly(model: "nobody-has-it") == nil, "nobody lists it: the server answers for itself")
    }

    @Test(
        "an announcement never changes a set-up route's URL, scheme, probe path or keys; an http:// announcement of an https:// address is another route"
    )
    func noDowngrade() {
        var planner = ConnectionPlanner()
        let configured = Route(
            baseURL: "https://10.0.0.5:1234", via: .lan, source: .manual, name: "Studio",
            servicePath: "/.well-known/opta-lmx",
            credentials: Credentials(inferenceKey: "K"))
        _ = planner.upsert(configured, now: 0)
        var announcement = Route(
            baseURL: "http://10.0.0.5:1234", via: .lan, source: .mdns, name: "evil", servicePath: "/evil",
            announced: true)
        _ = planner.upsert(announcement, now: 0)
        #expect(configured.id == "lan/https://10.0.0.5:1234")
        #expect(announcement.id == "lan/10.0.0.5:1234")
        #expect(planner.routes[configured.id]?.route.baseURL == "https://10.0.0.5:1234")
        #expect(planner.routes[announcement.id]?.route.credentials.isEmpty == true)
        // The same address over http, written by the user: an announcement changes only the announcement.
        let paired = Route(
            baseURL: "http://10.0.0.6:1234", via: .lan, source: .pairing, name: "Home",
            credentials: Credentials(inferenceKey: "K"))
        _ = planner.upsert(paired, now: 0)
        announcement = Route(
            baseURL: "http://10.0.0.6:1234", via: .lan, source: .mdns, name: "evil", servicePath: "/evil",
            announced: true)
        _ = planner.upsert(announcement, now: 1)
        let merged = planner.routes[paired.id]!.route
        #expect(merged.servicePath == TXTRecord.defaultServicePath)
        #expect(merged.name == "Home")
        #expect(merged.credentials == Credentials(inferenceKey: "K"))
        #expect(merged.source == .pairing)
        #expect(merged.announced)
    }

    @Test("lan_keys never: vouched LAN routes carry no key; a key-requiring server is reached through its tunnel")
    func lanKeysNever() {
        var policy = HealthPolicy()
        policy.lanKeys = .never
        var h = PlannerHarness(policy: policy) { _, _ in .ready }
        h.vouch = { _ in ["http://10.0.0.1:1234"] }
        var tunnel = wan("https://t.example.com", pin: nil)
        tunnel.credentials = Credentials(adminKey: "A", inferenceKey: "I")
        h.add(tunnel)
        h.run(until: 1)
        let lan = h.planner.routes["lan/10.0.0.1:1234"]!
        #expect(lan.route.credentials.isEmpty)
        // The server says it requires an inference key: the keyless LAN route is not ready for inference.
        h.inferenceKeyRequired = true
        h.planner.refreshAll(now: h.now)
        h.run(until: 30)
        #expect(h.planner.activeID == "wan/https://t.example.com")
        #expect(h.planner.lacksRequiredKey(h.planner.routes["lan/10.0.0.1:1234"]!))
        #expect(h.planner.explain(h.planner.routes["lan/10.0.0.1:1234"]!, now: 30).contains("lan_keys: never"))
        // Back to vouched: the LAN route gets the server's keys and wins.
        policy.lanKeys = .vouched
        h.absorb(h.planner.updatePolicy(policy, now: 30))
        #expect(
            h.planner.routes["lan/10.0.0.1:1234"]!.route.credentials == Credentials(adminKey: "A", inferenceKey: "I"))
    }

    @Test("a tunnel vouches only for IP addresses a LAN server can have: no loopback, names, metadata or link-local")
    func vouchedAddresses() {
        #expect(
            TunnelVouch.lanBaseURLs([
                "http://localhost:1234", "http://127.0.0.1:1234", "http://opta-lmx-2:1234",
                "http://opta-lmx-2.local:1234",
                "http://10.254.0.12:1234", "http://10.254.0.12:1234/", "HTTP://10.254.0.13:1234/v1",
                "http://0.0.0.0:1234",
                "http://169.254.169.254:80", "http://[fe80::1]:1234", "http://[::1]:1234", "http://[fd00::5]:1234",
                "ftp://10.0.0.9:21", "http://user@10.0.0.9:1234", "http://10.0.0.10", "https://10.0.0.11",
                "http://010.0.0.1:1234",
            ]) == [
                "http://10.254.0.12:1234", "http://10.254.0.13:1234", "http://[fd00::5]:1234", "http://10.0.0.10:80",
                "https://10.0.0.11:443",
            ])
        // Only a tunnel over HTTPS vouches: a plain-http "tunnel" proves nothing.
        var planner = ConnectionPlanner()
        let plain = Route(baseURL: "http://t.example.com", via: .wan, source: .manual, name: "t")
        _ = planner.upsert(plain, now: 0)
        #expect(
            planner.applyVouches(for: plain.id, advertised: ["http://10.0.0.1:1234"], instanceID: "x", now: 0).isEmpty)
        #expect(planner.routes.count == 1)
    }

    @Test("the trust key: paired by default, pinned and lan accepted, anything else refused with the key named")
    func configKey() throws {
        #expect(try AgentConfiguration.parse(Array("{}".utf8), file: "f").policy.trust == .paired)
        #expect(try AgentConfiguration.parse(Array(#"{"trust": "pinned"}"#.utf8), file: "f").policy.trust == .pinned)
        #expect(try AgentConfiguration.parse(Array(#"{"trust": "lan"}"#.utf8), file: "f").policy.trust == .lan)
        #expect(throws: ConfigurationError.self) {
            try AgentConfiguration.parse(Array(#"{"trust": "all"}"#.utf8), file: "f")
        }
        do {
            _ = try AgentConfiguration.parse(Array(#"{"trust": "all"}"#.utf8), file: "f")
        } catch {
            #expect(error.description.contains("trust"))
        }
    }
}

@Suite("Addresses the agent never probes")
struct AddressPolicyTests {
    @Test("loopback from another host, unspecified, multicast, broadcast and metadata are refused in every spelling")
    func refused() {
        let bad = [
            "127.0.0.1", "127.1.2.3", "0.0.0.0", "::1", "0:0:0:0:0:0:0:1", "::", "::ffff:127.0.0.1", "::ffff:7f00:1",
            "::127.0.0.1", "::ffff:0.0.0.0", "169.254.169.254", "169.254.170.2", "fd00:ec2::254", "224.0.0.251",
            "239.255.255.250", "255.255.255.255", "ff02::fb", "::ffff:169.254.169.254", "240.0.0.1",
        ]
        for address in bad {
            #expect(AddressPolicy.refusal(address, onLoopbackInterface: false) != nil, "\(address)")
        }
        #expect(AddressPolicy.refusal("not-an-address", onLoopbackInterface: false) != nil)
    }

    @Test("LAN addresses pass; loopback only when seen on lo (a server on this machine)")
    func accepted() {
        for address in ["10.0.0.5", "192.168.1.20", "169.254.3.4", "fe80::1%eth0", "2001:db8::5", "::ffff:10.0.0.5"] {
            #expect(AddressPolicy.refusal(address, onLoopbackInterface: false) == nil, "\(address)")
        }
        #expect(AddressPolicy.refusal("127.0.0.1", onLoopbackInterface: true) == nil)
        #expect(AddressPolicy.refusal("::1", onLoopbackInterface: true) == nil)
        #expect(AddressPolicy.refusal("0.0.0.0", onLoopbackInterface: true) != nil)
    }

    @Test("names shown to people: control, bidi and line-separator characters are escaped")
    func printable() {
        #expect(ServerTable.printable("evil\u{1B}[2J\nname") == "evil\\x1b[2J\\x0aname")
        #expect(ServerTable.printable("abc\u{202E}gpj.exe") == "abc\\u{202e}gpj.exe")
        #expect(ServerTable.printable("Mono512 Studio ü") == "Mono512 Studio ü")
    }
}

@Suite("Configured endpoints and plain HTTP")
struct InsecureEndpointTests {
    @Test("keys on an http:// endpoint are refused without allow_insecure, named without the secret")
    func keysOverHTTP() throws {
        let bad = #"{"endpoints": [{"url": "http://10.0.0.5:1234", "api_key": "S3CRET-KEY"}]}"#
        do {
            _ = try AgentConfiguration.parse(Array(bad.utf8), file: "agent.json")
            Issue.record("accepted keys over http://")
        } catch {
            #expect(error.description.contains("allow_insecure"))
            #expect(!error.description.contains("S3CRET-KEY"))
        }
        let allowed = #"{"endpoints": [{"url": "http://10.0.0.5:1234", "api_key": "k", "allow_insecure": true}]}"#
        #expect(try AgentConfiguration.parse(Array(allowed.utf8), file: "f").endpoints.count == 1)
        let plain =
            #"{"endpoints": [{"url": "http://10.0.0.5:1234"}, {"url": "https://t.example.com", "api_key": "k"}]}"#
        #expect(try AgentConfiguration.parse(Array(plain.utf8), file: "f").endpoints.count == 2)
    }
}

@Suite("Floods of announcements")
struct FloodTests {
    @Test("1,000 black-hole announcements never take the WAN standby's probe slots")
    func wanKeepsItsBudget() {
        var policy = HealthPolicy()
        policy.wanStandbyInterval = 5
        // The tunnel is the active route, and nothing uses the agent: checked every idle interval.
        policy.idleInterval = 5
        var planner = ConnectionPlanner(policy: policy)
        _ = planner.upsert(wan("https://t.example.com"), now: 0)
        for i in 0..<1000 {
            _ = planner.upsert(
                Route(
                    baseURL: "http://10.9.\(i / 250).\(i % 250):1234", via: .lan, source: .mdns, name: "junk \(i)",
                    announced: true), now: 0)
        }
        // Probes complete after 1.5 s (a black hole) for junk, at once for the tunnel.
        var inFlight: [(done: Double, id: String)] = []
        var wanProbes: [Double] = []
        var now = 0.0
        while now < 60 {
            for finished in inFlight.filter({ $0.done <= now }) {
                let good = finished.id.hasPrefix("wan")
                _ = planner.record(
                    ProbeReport(
                        verdict: good ? .ready : .down, latency: 0.01, detail: good ? nil : "timed out",
                        instanceID: good ? "home" : nil),
                    for: finished.id, now: now)
            }
            inFlight.removeAll { $0.done <= now }
            for task in planner.takeDueProbes(now: now) {
                let isWAN = task.route.id.hasPrefix("wan")
                if isWAN { wanProbes.append(now) }
                inFlight.append((now + (isWAN ? 0.05 : 1.5), task.route.id))
            }
            now += 0.1
        }
        #expect(planner.activeID == "wan/https://t.example.com")
        // Every 5 s ± 10 % (plus the 100 ms step), from the start.
        let gaps = zip(wanProbes.dropFirst(), wanProbes).map { $0 - $1 }
        #expect(wanProbes.first ?? 99 <= 0.1)
        #expect(gaps.allSatisfy { $0 <= 5.7 }, "WAN probe gaps: \(gaps)")
        #expect(wanProbes.count >= 10)
    }

    @Test(
        "announcer churn is bounded: withdrawn found routes past the bound go oldest first; withdrawn ones go after forget_after even if they answer"
    )
    func churnBounded() {
        var policy = HealthPolicy()
        policy.forgetAfter = 600
        var planner = ConnectionPlanner(policy: policy)
        var now = 0.0
        // 10,000 announce/withdraw cycles, each on a new address and port.
        for i in 0..<10_000 {
            now += 0.01
            let route = Route(
                baseURL: "http://10.\(i / 65_536 % 256).\(i / 256 % 256).\(i % 256):\(1000 + i % 50_000)", via: .lan,
                source: .mdns,
                name: "churn \(i)", announced: true)
            _ = planner.upsert(route, now: now)
            _ = planner.withdraw(route.id, now: now)
            if i % 100 == 0 { _ = planner.tick(now: now) }
        }
        let found = planner.routes.values.filter { $0.route.source.isFound }.count
        #expect(found <= ConnectionPlanner.maxFoundRoutes, "\(found) found routes kept")
        #expect(planner.routes.count <= ConnectionPlanner.maxFoundRoutes)
        // The newest withdrawn ones are kept, the oldest went.
        #expect(planner.routes["lan/10.0.39.15:10999"] != nil)
        #expect(planner.routes["lan/10.0.0.1:1001"] == nil)

        // A withdrawn route that still answers goes after forget_after; an announced one stays.
        var small = ConnectionPlanner(policy: policy)
        let gone = Route(baseURL: "http://10.9.9.9:1234", via: .lan, source: .mdns, name: "gone", announced: true)
        let here = Route(baseURL: "http://10.9.9.8:1234", via: .lan, source: .mdns, name: "here", announced: true)
        _ = small.upsert(gone, now: 0)
        _ = small.upsert(here, now: 0)
        for task in small.takeDueProbes(now: 0) {
            _ = small.record(
                ProbeReport(verdict: .ready, latency: 0.01, instanceID: task.route.id), for: task.route.id, now: 0.01)
        }
        // The one withdrawn is not the active one (the active route is never forgotten).
        let (withdrawn, kept) = small.activeID == gone.id ? (here.id, gone.id) : (gone.id, here.id)
        _ = small.withdraw(withdrawn, now: 1)
        _ = small.tick(now: 500)
        #expect(small.routes[withdrawn] != nil, "kept within forget_after")
        for t in stride(from: 560.0, through: 700, by: 31) { _ = small.tick(now: t) }
        #expect(small.routes[withdrawn] == nil, "forgotten after forget_after, though it answered")
        #expect(small.routes[kept] != nil)
    }
}
