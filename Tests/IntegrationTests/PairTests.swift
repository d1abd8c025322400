import Foundation
import LMXCore
import Testing

/// Payloads of every format in CONTRACT §4, with secrets that must never be printed.
private enum Payloads {
    static let token =
        "opta-lmx://pair?v=1&name=Studio&url=https%3A%2F%2Fquiet-river-1234.trycloudflare.com&key=ADMIN-S3CRET&api_key=INFER-S3CRET&cf_id=ID.access&cf_secret=CF-S3CRET&instance=Mono512%3A1234&lan=192.168.188.11%3A1234&exp=4102444800"
    static let tunnel = "https://quiet-river-1234.trycloudflare.com?key=ADMIN-S3CRET"
    static let connect =
        "https://lmx.optalocal.com/connect?host=192.168.188.11&port=1234&via=lan&tunnel=https%3A%2F%2Fx.trycloudflare.com"
    static let pair =
        "https://lmx.optalocal.com/pair?session=0f9e6c1e-1111-4222-8333-944445555666&deviceId=ab12&host=10.1.2.3&port=1234"
    static let book =
        #"{"entries":[{"id":"192.168.188.11:1234","label":"LMX @ Studio","host":"192.168.188.11","port":1234,"tunnelUrl":"https://example.trycloudflare.com","lastConnectedVia":"mdns"}]}"#
    static let all = [token, tunnel, connect, pair, book]
    static let secrets = ["ADMIN-S3CRET", "INFER-S3CRET", "CF-S3CRET"]
}

@Suite("lmx-pair: real QR images, real payloads, the real agent", .serialized)
struct PairTests {
    let bed: TestBed
    let dir: String

    init() throws {
        bed = try TestBed.load()
        dir = "/tmp/lmx-pair-test-\(TestBed.tag())"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
    }

    private var db: String { dir + "/state/agent.db" }
    private var noSocket: String { dir + "/none.sock" }

    /// Runs lmx-pair against this test's own database (no agent unless `socket` is given).
    private func pair(_ arguments: [String], socket: String? = nil, db: String? = nil) async throws -> CommandResult {
        try await Command.run(
            "\(TestBed.binDir)/lmx-pair", arguments + ["--db", db ?? self.db, "--socket", socket ?? noSocket],
            environment: ["LMX_SOCKET": "", "LMX_DB": ""], timeout: 60)
    }

    private func shell(_ command: String) async throws {
        let result = try await Command.run("/bin/sh", ["-c", command])
        guard result.status == 0 else { throw TestBedMissing(detail: "\(command): \(result.stderr)") }
    }

    private func write(_ text: String, _ name: String) throws -> String {
        let path = "\(dir)/\(name)"
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    private func summaries(_ result: CommandResult) throws -> [PairingSummary] {
        #expect(result.status == 0, "\(result.stderr)")
        return try JSONDecoder().decode([PairingImportResult].self, from: Data(result.stdout.utf8)).map(\.pairing)
    }

    private func assertNoSecrets(_ texts: String..., file: String = #fileID, line: Int = #line) {
        for text in texts {
            for secret in Payloads.secrets {
                #expect(!text.contains(secret), "a secret was printed")
            }
        }
    }

    @Test("qrencode PNGs of every format, four error-correction levels, three sizes: same pairing as the text")
    func qrencodeMatrix() async throws {
        for (index, payload) in Payloads.all.enumerated() {
            let text = try write(payload, "payload-\(index).txt")
            let expected = try summaries(try await pair([text, "--dry-run", "--json"]))
            #expect(!expected.isEmpty)
            for level in ["L", "M", "Q", "H"] {
                for size in [2, 5, 12] {
                    let png = "\(dir)/code-\(index)-\(level)-\(size).png"
                    try await shell(
                        "qrencode -l \(level) -s \(size) -o '\(png)' '\(payload.replacingOccurrences(of: "'", with: "'\\''"))'"
                    )
                    let result = try await pair([png, "--dry-run", "--json"])
                    #expect(try summaries(result) == expected, "\(png)")
                    assertNoSecrets(result.stdout, result.stderr)
                }
            }
        }
        #expect(!FileManager.default.fileExists(atPath: db), "--dry-run writes nothing")
    }

    @Test(
        "PNG variants and JPEG 'photos of a screen' (scaled, rotated, blurred, compressed, progressive) decode exactly")
    func imageVariants() async throws {
        let base = "\(dir)/base.png"
        try await shell("qrencode -l M -s 6 -o '\(base)' '\(Payloads.token)'")
        let expected = try summaries(try await pair([try write(Payloads.token, "token.txt"), "--dry-run", "--json"]))
        let variants: [(String, String)] = [
            ("grey16.png", "-colorspace Gray -depth 16"),
            ("rgb.png", "-type TrueColor"),
            ("rgba.png", "-type TrueColorAlpha"),
            ("interlaced.png", "-interlace PNG"),
            ("transparent.png", "-transparent white"),
            ("small.jpg", "-resize 60% -quality 85"),
            ("large.jpg", "-resize 400% -quality 90"),
            ("rotated.jpg", "-background white -rotate 17 -quality 80"),
            ("upside.jpg", "-rotate 180"),
            ("blurred.jpg", "-resize 300% -blur 0x2 -quality 70"),
            ("compressed.jpg", "-resize 200% -quality 25"),
            ("progressive.jpg", "-resize 250% -interlace JPEG -quality 75"),
            (
                "photo.jpg",
                "-resize 350% -background white -rotate 4 -blur 0x1.5 -fill gray70 -colorize 15% -quality 55 -interlace JPEG"
            ),
        ]
        for (name, options) in variants {
            let out = "\(dir)/\(name)"
            try await shell("convert '\(base)' \(options) '\(out)'")
            let result = try await pair([out, "--dry-run", "--json"])
            #expect(try summaries(result) == expected, "\(name): \(result.stderr)")
        }
        // A transparent background (qrencode's own) is laid over white.
        let clear = "\(dir)/clear.png"
        try await shell("qrencode --background=FFFFFF00 -o '\(clear)' '\(Payloads.token)'")
        #expect(try summaries(try await pair([clear, "--dry-run", "--json"])) == expected)
    }

    /// Codes as machines show and print them (issue 66): light on dark (a dark theme), mirrored (a
    /// front camera), low contrast, little or no quiet zone against a busy frame, photos of a screen.
    @Test(
        "light on dark, mirrored, low contrast, no quiet zone, photos of light and dark screens: each imports as the text does",
        arguments: [
            ("light-on-dark.png", "-s 6 --foreground=FFFFFF --background=000000", ""),
            ("light-on-dark-mirrored.png", "-s 6 --foreground=FFFFFF --background=000000", "-flop"),
            ("mirrored.png", "-s 6", "-flop"),
            ("grey-on-grey.png", "-s 6", "+level 38%,58%"),
            ("dim-light-on-dark.png", "-s 6 --foreground=FFFFFF --background=000000", "+level 12%,30%"),
            ("one-module-margin.png", "-s 6 -m 1", "-bordercolor gray15 -border 48"),
            ("no-margin.png", "-s 6 -m 0", "-bordercolor gray50 -border 48"),
            (
                "dark-screen-photo.jpg", "-s 6 --foreground=FFFFFF --background=000000",
                "-bordercolor '#1e1e1e' -border 60 -resize 250% -distort Perspective '0,0 40,25  0,%h 12,%h  %w,0 %w,50  %w,%h %[fx:w-35],%[fx:h-12]' -blur 0x1.5 -attenuate 0.5 +noise Gaussian -quality 60"
            ),
            (
                "light-screen-photo.jpg", "-s 6",
                "-bordercolor white -border 40 -resize 300% \\( +clone -sparse-color Barycentric '0,0 gray55 %w,%h white' \\) -compose multiply -composite \\( +clone -tile pattern:horizontal3 -draw 'color 0,0 reset' +level 75%,100% -rotate 3 \\) -gravity center -compose multiply -composite -distort Perspective '0,0 30,10  0,%h 0,%h  %w,0 %w,35  %w,%h %[fx:w-20],%[fx:h-5]' -blur 0x1.2 -attenuate 0.6 +noise Gaussian -resize 50% -quality 55"
            ),
        ])
    func codesAsMachinesShowThem(name: String, qrencode: String, convert: String) async throws {
        let expected = try summaries(
            try await pair([try write(Payloads.token, "kind-token.txt"), "--dry-run", "--json"]))
        let drawn = "\(dir)/drawn-\(name).png"
        let out = "\(dir)/\(name)"
        try await shell("qrencode -l M \(qrencode) -o '\(drawn)' '\(Payloads.token)'")
        try await shell("convert '\(drawn)' \(convert) '\(out)'")
        let result = try await pair([out, "--dry-run", "--json"])
        #expect(try summaries(result) == expected, "\(name): \(result.stderr)")
        assertNoSecrets(result.stdout, result.stderr)
    }

    @Test("bad inputs: each its own error and exit code, nothing written")
    func badInputs() async throws {
        let blank = "\(dir)/blank.png"
        let two = "\(dir)/two.png"
        let truncated = "\(dir)/truncated.png"
        try await shell("convert -size 300x300 xc:white '\(blank)'")
        try await shell(
            "qrencode -o '\(dir)/a.png' '\(Payloads.tunnel)' && qrencode -o '\(dir)/b.png' '\(Payloads.pair)' && convert '\(dir)/a.png' '\(dir)/b.png' +append '\(two)'"
        )
        try await shell(
            "qrencode -s 8 -o '\(dir)/full.png' '\(Payloads.token)' && head -c $(( $(stat -c %s '\(dir)/full.png') / 2 )) '\(dir)/full.png' > '\(truncated)'"
        )
        let bomb = "\(dir)/bomb.png"
        _ = FileManager.default.createFile(
            atPath: bomb, contents: Data(Self.pngHeader(width: 100_000, height: 100_000)))
        var random = [UInt8](repeating: 0, count: 4096)
        var rng = SystemRandomNumberGenerator()
        for i in random.indices { random[i] = UInt8.random(in: 0...255, using: &rng) }
        random[0] = 0xFE
        let noise = "\(dir)/noise.bin"
        _ = FileManager.default.createFile(atPath: noise, contents: Data(random))
        let empty = "\(dir)/empty.txt"
        _ = FileManager.default.createFile(atPath: empty, contents: Data())
        let gif = "\(dir)/code.gif"
        try await shell("convert '\(dir)/a.png' '\(gif)'")
        let expired = try write("opta-lmx://pair?v=1&url=https%3A%2F%2Fa.example&exp=1000000000", "expired.txt")
        let insecure = try write("opta-lmx://pair?v=1&url=http%3A%2F%2Fa.example&key=ADMIN-S3CRET", "insecure.txt")

        let cases: [(String, Int32, String)] = [
            (blank, 65, "no QR code found"),
            (two, 65, "holds 2 QR codes"),
            (truncated, 65, "truncated or damaged"),
            (bomb, 65, "100000 × 100000 pixels"),
            (noise, 65, "not UTF-8 text"),
            (empty, 65, "empty"),
            (gif, 65, "GIF images are not read"),
            (expired, 65, "expired"),
            (insecure, 65, "--allow-insecure"),
            ("\(dir)/missing.png", 66, "no such file"),
            (dir, 66, "is a directory"),
        ]
        for (file, code, message) in cases {
            let started = ContinuousClock.now
            let result = try await pair([file])
            #expect(result.status == code, "\(file): \(result.stderr)")
            #expect(result.stderr.contains(message), "\(file): \(result.stderr)")
            #expect(
                result.stderr.contains(file.split(separator: "/").last.map(String.init) ?? file),
                "the error names the input")
            assertNoSecrets(result.stdout, result.stderr)
            if file == bomb {
                #expect(ContinuousClock.now - started < .seconds(2), "a decompression bomb costs nothing")
            }
        }
        // Several codes are listed, none imported; --code picks one.
        let listed = try await pair([two])
        let pairLine = listed.stderr.split(separator: "\n").first { $0.contains("pair-link") }
        #expect(listed.stderr.contains("tunnel-url: quiet-river-1234.trycloudflare.com"))
        #expect(pairLine != nil)
        #expect(!FileManager.default.fileExists(atPath: db), "nothing refused is written")
        // One bad file among good ones: nothing is imported.
        let mixed = try await pair([try write(Payloads.tunnel, "good.txt"), blank])
        #expect(mixed.status == 65)
        #expect(!FileManager.default.fileExists(atPath: db))
        let pairIndex = pairLine.flatMap { $0.split(separator: " ").first.map(String.init) } ?? "2"
        let picked = try await pair([two, "--code", pairIndex, "--json"])
        #expect(try summaries(picked).first?.format == .pairLink)
        let beyond = try await pair([two, "--code", "3"])
        #expect(beyond.status == 64)
        // Usage errors are 64.
        #expect(try await pair(["export", "p00000000"]).status == 64)
        #expect(try await pair([]).status == 64)
    }

    @Test(
        "without an agent: import into the database, update instead of duplicate, list, export round trip (0600), remove"
    )
    func offline() async throws {
        let token = try write(Payloads.token, "token.txt")
        let first = try await pair([token])
        #expect(first.status == 0, "\(first.stderr)")
        #expect(first.stdout.contains("imported"))
        #expect(first.stdout.contains("admin key: set, api key: set, access token: set"))
        #expect(first.stdout.contains("lmx-agentd is not running"))
        assertNoSecrets(first.stdout, first.stderr)
        let mode = try FileManager.default.attributesOfItem(atPath: db)[.posixPermissions] as? Int
        #expect(mode == 0o600)

        // The same server again (a new tunnel URL for the same instance): updated, not duplicated.
        let moved = try write(
            Payloads.token.replacingOccurrences(of: "quiet-river-1234", with: "new-river-9"), "moved.txt")
        let second = try await pair([moved])
        #expect(second.stdout.contains("updated"))
        let list = try await pair(["list", "--json"])
        let all = try JSONDecoder().decode([PairingSummary].self, from: Data(list.stdout.utf8))
        #expect(all.count == 1)
        #expect(all.first?.url == "https://new-river-9.trycloudflare.com")
        assertNoSecrets(list.stdout, try await pair(["list"]).stdout)
        let id = try #require(all.first?.id)

        // Export as PNG (owner-only) and import it elsewhere: the same pairing, secrets included.
        let png = "\(dir)/export.png"
        let exported = try await pair(["export", id, "--png", png])
        #expect(exported.status == 0, "\(exported.stderr)")
        assertNoSecrets(exported.stdout, exported.stderr)
        #expect((try FileManager.default.attributesOfItem(atPath: png)[.posixPermissions] as? Int) == 0o600)
        let raw = try await Command.run("/usr/bin/zbarimg", ["--raw", "-q", png])
        #expect(raw.stdout.contains("key=ADMIN-S3CRET") && raw.stdout.contains("cf_secret=CF-S3CRET"))
        let otherDB = dir + "/other/agent.db"
        let imported = try await pair([png, "--json"], db: otherDB)
        #expect(try summaries(imported).map(\.id) == [id])
        let otherList = try JSONDecoder().decode(
            [PairingSummary].self, from: Data(try await pair(["list", "--json"], db: otherDB).stdout.utf8))
        #expect(
            otherList.map { [$0.url, $0.lan, $0.instance, $0.name] }
                == all.map { [$0.url, $0.lan, $0.instance, $0.name] })
        #expect(otherList.first?.secrets == ["admin_key", "api_key", "cf_access"])

        // The terminal drawing is a real QR code: turn its blocks back into pixels and scan them.
        let drawn = try await pair(["export", id, "--terminal"])
        #expect(drawn.status == 0)
        let pgm = "\(dir)/terminal.pgm"
        _ = FileManager.default.createFile(atPath: pgm, contents: Data(Self.pgm(fromTerminal: drawn.stdout)))
        let scanned = try await Command.run("/usr/bin/zbarimg", ["--raw", "-q", pgm])
        #expect(
            scanned.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
                == raw.stdout.trimmingCharacters(in: .whitespacesAndNewlines))

        // Remove by id; again is "no such pairing".
        #expect(try await pair(["remove", id]).status == 0)
        #expect(try await pair(["remove", id]).status == 65)
        let emptied = try await pair(["list", "--json"])
        #expect(try JSONDecoder().decode([PairingSummary].self, from: Data(emptied.stdout.utf8)).isEmpty)
        // Standard input works too.
        let stdin = try await Command.run(
            "/bin/sh",
            [
                "-c",
                "echo '\(Payloads.pair)' | '\(TestBed.binDir)/lmx-pair' - --db '\(db)' --socket '\(noSocket)' --json",
            ])
        #expect(stdin.status == 0, "\(stdin.stderr)")
        #expect(stdin.stdout.contains("\"lan\" : \"10.1.2.3:1234\""))
    }

    @Test(
        "with the agent running: a paired tunnel becomes a standby, takes over when the LAN server stops, goes with remove"
    )
    func endToEnd() async throws {
        try await withResources {
            let wanPort = Int.random(in: 20_000...39_999)
            let lanPort = Int.random(in: 20_000...39_999)
            let tunnel = try await LMXServer.start(
                bed, on: .root, port: wanPort, instance: "paired-\(wanPort)", bind: "127.0.0.1", tls: true,
                requireAccess: ("svc.access", "CF-S3CRET"))
            let lan = try await LMXServer.start(bed, on: .h1, port: lanPort, instance: "lan-\(lanPort)")
            let config =
                #"{"interfaces": ["lmxbr0"], "health": {"stability_window": 3}, "extra_ca_file": "\#(bed["LMX_TESTBED_TLS"])/ca.pem", "endpoints": [{"url": "http://10.254.0.11:\#(lanPort)"}]}"#
            let agent = try await AgentProcess.start(bed, config: config, arguments: ["--no-discovery"])
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == lan.baseURL } != nil)

            // The pairing code: a QR image of a v1 token for the local HTTPS "tunnel".
            let token =
                "opta-lmx://pair?v=1&name=Tunnel&url=https%3A%2F%2F127.0.0.1%3A\(wanPort)&key=ADMIN-S3CRET&api_key=INFER-S3CRET&cf_id=svc.access&cf_secret=CF-S3CRET&instance=paired-\(wanPort)"
            let png = "\(dir)/tunnel.png"
            try await shell("qrencode -o '\(png)' '\(token)'")
            let imported = try await pair([png, "--probe"], socket: agent.socket, db: agent.database)
            #expect(imported.status == 0, "\(imported.stderr)")
            #expect(imported.stdout.contains("imported"))
            #expect(imported.stdout.contains("[ready]"), "\(imported.stdout)")
            #expect(!imported.stdout.contains("not running"))
            assertNoSecrets(imported.stdout, imported.stderr)

            // A standby: ready, not active (the LAN server is).
            let standby = await agent.waitForRoute(timeout: 5) { $0.via == .wan && $0.verdict == .ready }
            #expect(standby?.active == false)
            #expect(standby?.source == .pairing)
            #expect(agent.active()?.baseURL == lan.baseURL)
            // Its Access token went with every request to it.
            #expect(!tunnel.requests.isEmpty)
            #expect(tunnel.requests.allSatisfy { $0.contains("CF-Access-Client-Id,CF-Access-Client-Secret") })

            // The LAN server stops: the paired tunnel takes over.
            await lan.set("dead")
            #expect(await agent.waitForActive(timeout: 5) { $0?.baseURL == "https://127.0.0.1:\(wanPort)" } != nil)

            // Importing it again updates it.
            let again = try await pair([png], socket: agent.socket, db: agent.database)
            #expect(again.stdout.contains("updated"))
            let list = try await pair(["list", "--json"], socket: agent.socket, db: agent.database)
            let summaries = try JSONDecoder().decode([PairingSummary].self, from: Data(list.stdout.utf8))
            #expect(summaries.count == 1)
            #expect(summaries.first?.routes?.first?.active == true)

            // Remove: the candidate goes at once, and with it the active endpoint.
            let id = try #require(summaries.first?.id)
            let removed = try await pair(["remove", id], socket: agent.socket, db: agent.database)
            #expect(removed.status == 0, "\(removed.stderr)")
            let status = try agent.status()
            #expect(!status.candidates.flatMap(\.routes).contains { $0.via == .wan })
            #expect(status.active?.via != .wan)
            // The history still names the route that went, as it was told then.
            let events = try JSONDecoder().decode(
                [StatusAPI.Event].self, from: Data(try agent.client.request("GET", "/v1/events?limit=1000").body))
            let told = events.compactMap(\.text)
            #expect(told.contains("Found Tunnel through its tunnel (from a pairing)."), "\(told)")
            #expect(told.contains { $0.hasPrefix("Requests now go through the tunnel to Tunnel: ") }, "\(told)")
            #expect(
                told.contains("Tunnel through its tunnel is no longer followed: its pairing was removed."), "\(told)")
            #expect(told.contains("The pairing with Tunnel was removed."), "\(told)")

            // No secret in any output, log line or socket answer.
            var answers = ""
            for path in ["/v1/status", "/v1/servers", "/v1/events?limit=1000", "/v1/pairings", "/metrics"] {
                answers += String(decoding: try agent.client.request("GET", path).body, as: UTF8.self)
            }
            assertNoSecrets(answers, agent.process.stderr, agent.process.stdout, list.stdout, removed.stdout)
        }
    }

    /// A PNG signature and IHDR chunk (valid CRC) claiming a size, and nothing else.
    static func pngHeader(width: UInt32, height: UInt32) -> [UInt8] {
        func be(_ v: UInt32) -> [UInt8] {
            [UInt8(v >> 24), UInt8(v >> 16 & 0xFF), UInt8(v >> 8 & 0xFF), UInt8(v & 0xFF)]
        }
        let body = Array("IHDR".utf8) + be(width) + be(height) + [8, 0, 0, 0, 0]
        var crc: UInt32 = 0xFFFF_FFFF
        for byte in body {
            crc ^= UInt32(byte)
            for _ in 0..<8 { crc = crc & 1 == 1 ? (crc >> 1) ^ 0xEDB8_8320 : crc >> 1 }
        }
        return [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A] + be(13) + body + be(~crc)
    }

    /// Turns the half-block drawing back into a grey image, 4 pixels per module.
    static func pgm(fromTerminal text: String) -> [UInt8] {
        let lines = text.split(separator: "\n").filter { $0.contains("█") || $0.contains("▀") || $0.contains("▄") }
        let width = lines.map(\.count).max() ?? 0
        var rows: [[Bool]] = []  // true = light
        for line in lines {
            var top: [Bool] = []
            var bottom: [Bool] = []
            for ch in line {
                top.append(ch == "█" || ch == "▀")
                bottom.append(ch == "█" || ch == "▄")
            }
            while top.count < width {
                top.append(false)
                bottom.append(false)
            }
            rows.append(top)
            rows.append(bottom)
        }
        let scale = 4
        let border = 4
        let w = (width + 2 * border) * scale
        let h = (rows.count + 2 * border) * scale
        var pixels = [UInt8](repeating: 255, count: w * h)
        for (y, row) in rows.enumerated() {
            for (x, light) in row.enumerated() where !light {
                for dy in 0..<scale {
                    for dx in 0..<scale { pixels[((y + border) * scale + dy) * w + (x + border) * scale + dx] = 0 }
                }
            }
        }
        return Array("P5\n\(w) \(h)\n255\n".utf8) + pixels
    }
}
