import Foundation
import LMXCore
import LMXStatusClient
import Testing

/// The Debian package built by `make deb` (run by `make test` before the tests) and the systemd
/// unit: lintian, a real `dpkg -i` on this machine, the packaged daemon run as its service user
/// the way systemd starts it, then `dpkg -r` and `--purge`.
@Suite("The Debian package and the systemd unit", .serialized)
struct PackagingTests {
    let bed: TestBed
    let deb: String

    init() throws {
        bed = try TestBed.load()
        if let path = ProcessInfo.processInfo.environment["LMX_DEB"] {
            deb = path
        } else {
            let names = (try? FileManager.default.contentsOfDirectory(atPath: TestBed.repo)) ?? []
            guard let name = names.filter({ $0.hasPrefix("lmx-agent_") && $0.hasSuffix(".deb") }).sorted().last else {
                throw TestBedMissing(detail: "no lmx-agent_*.deb in \(TestBed.repo): run `make deb` (make test does)")
            }
            deb = TestBed.repo + "/" + name
        }
    }

    private static let unit = TestBed.repo + "/Packaging/systemd/lmx-agentd.service"

    /// The hot-code linker script names sections by their functions' symbols: after code changes
    /// some no longer exist and match nothing (the link goes on; only memory is lost). It must
    /// still name the code the release build has, or be made again (scripts/release/order-file.py).
    @Test("Packaging/lmx-agent-hot.ld is not stale: at least 90 % of the functions it places are in the release build")
    func hotCodeScriptCurrent() async throws {
        let binary = TestBed.repo + "/.build/release/lmx-agent"
        guard FileManager.default.fileExists(atPath: binary) else {
            throw TestBedMissing(detail: "no release build at \(binary): run `make deb` (make test does)")
        }
        // The release uses the script only with the dependency versions it was made with.
        let recorded = try String(contentsOfFile: TestBed.repo + "/Packaging/lmx-agent-hot.versions", encoding: .utf8)
        let resolved = try await run(
            "/bin/bash", ["-c", "cd '\(TestBed.repo)' && . scripts/lib.sh && resolved_versions"])
        #expect(
            resolved.status == 0 && resolved.stdout == recorded,
            "the dependencies resolved are not those the hot-code script was made with (the release links without it): remake it with sudo python3 scripts/release/order-file.py and commit Packaging/lmx-agent-hot.ld and .versions"
        )
        let script = try String(contentsOfFile: TestBed.repo + "/Packaging/lmx-agent-hot.ld", encoding: .utf8)
        // Section names `.text.<symbol>`; local labels (`.L…`) have no symbol to look for.
        let named = Set(
            script.split(whereSeparator: { $0 == " " || $0 == "(" || $0 == ")" || $0 == "\n" })
                .filter { $0.hasPrefix(".text.") && !$0.hasPrefix(".text..L") && $0 != ".text.lmx_hot" }
                .map { String($0.dropFirst(6)) })
        let nm = try await run("/usr/bin/nm", ["--defined-only", binary])
        #expect(nm.status == 0, "\(nm.stderr)")
        let symbols = Set(
            nm.stdout.split(separator: "\n").compactMap { $0.split(separator: " ").last.map(String.init) })
        let present = named.filter(symbols.contains).count
        let share = Double(present) / Double(max(named.count, 1))
        print(
            "figure: the hot-code script names \(named.count) functions; \(present) (\(Int(share * 100)) %) are in the release build"
        )
        #expect(named.count > 1000)
        #expect(
            share >= 0.9,
            "the hot-code linker script is stale: run `sudo scripts/testbed.sh up && make release && sudo python3 scripts/release/order-file.py` and commit Packaging/lmx-agent-hot.ld and .versions"
        )
    }

    private func run(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) async throws
        -> CommandResult
    {
        try await Command.run(executable, arguments, environment: environment, timeout: 300)
    }

    private func exists(_ path: String) -> Bool { access(path, F_OK) == 0 }

    private func mode(_ path: String) -> (mode: mode_t, uid: uid_t, gid: gid_t)? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return (info.st_mode & 0o7777, info.st_uid, info.st_gid)
    }

    private func lookup(_ database: String, _ key: String) async throws -> [String] {
        let result = try await run("/usr/bin/getent", [database, key])
        return result.status == 0
            ? result.stdout.trimmingCharacters(in: .newlines).split(separator: ":").map(String.init) : []
    }

    @Test("lintian reports no errors and no warnings")
    func lintian() async throws {
        let result = try await run("/usr/bin/lintian", ["--tag-display-limit", "0", deb])
        #expect(result.status == 0, "\(result.stdout)\(result.stderr)")
        let tags = result.stdout.split(separator: "\n").filter { $0.hasPrefix("E:") || $0.hasPrefix("W:") }
        #expect(tags.isEmpty, "\(tags)")
    }

    @Test(
        "the package's fields: version from the binaries, Depends from their libraries (dh_shlibdeps), the units, the sysusers file and docs inside"
    )
    func contents() async throws {
        let fields = try await run("/usr/bin/dpkg-deb", ["--field", deb, "Package", "Version", "Depends"])
        #expect(fields.status == 0)
        #expect(fields.stdout.contains("Version: \(StatusAPI.version)"))
        let changelog = try String(contentsOfFile: TestBed.repo + "/Packaging/debian/changelog", encoding: .utf8)
        #expect(
            changelog.hasPrefix("lmx-agent (\(StatusAPI.version))"),
            "Packaging/debian/changelog has no entry for \(StatusAPI.version)")
        for dependency in [
            "libavahi-client3", "libzbar0", "libpng16-16", "libturbojpeg0", "libqrencode4", "libsqlite3-0",
            "avahi-daemon", "systemd-sysusers",
        ] {
            #expect(fields.stdout.contains(dependency), "Depends lacks \(dependency)")
        }
        let listing = try await run("/usr/bin/dpkg-deb", ["--contents", deb])
        for path in [
            "./usr/bin/lmx-agentd", "./usr/bin/lmx-status", "./usr/bin/lmx-discover", "./usr/bin/lmx-pair",
            "./usr/lib/systemd/system/lmx-agentd.service", "./usr/lib/systemd/user/lmx-agentd.service",
            "./usr/lib/sysusers.d/lmx-agent.conf", "./etc/lmx/agent.json", "./usr/share/doc/lmx-agent/copyright",
            "./usr/share/man/man1/lmx-pair.1.gz", "./usr/share/bash-completion/completions/lmx-status",
            "./usr/share/zsh/vendor-completions/_lmx-pair", "./usr/share/fish/vendor_completions.d/lmx-discover.fish",
            "./usr/bin/lmx-notify", "./usr/lib/systemd/user/lmx-notify.service", "./usr/share/man/man1/lmx-notify.1.gz",
        ] {
            #expect(listing.stdout.contains(path), "the package lacks \(path)")
        }
        // No Swift runtime is needed on the target: it is linked in.
        #expect(!fields.stdout.contains("swift"))
        // One multi-call binary: lmx-discover and lmx-pair are links to lmx-agentd.
        #expect(listing.stdout.contains("./usr/bin/lmx-discover -> lmx-agentd"))
        #expect(listing.stdout.contains("./usr/bin/lmx-pair -> lmx-agentd"))
        #expect(listing.stdout.contains("./usr/bin/lmx-notify -> lmx-agentd"))
        // The footprint budget: a package of at most 15 MB that installs at most 50 MB.
        let bytes = (try? FileManager.default.attributesOfItem(atPath: deb)[.size] as? Int) ?? .max
        #expect(bytes <= 15_000_000, "package: \(bytes) bytes")
        let installed = try await run("/usr/bin/dpkg-deb", ["--field", deb, "Installed-Size"])
        let kib = Int(installed.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? .max
        #expect(kib * 1024 <= 50_000_000, "installed: \(kib) KiB")
    }

    @Test("the unit passes systemd-analyze security with a low exposure and keeps the required settings")
    func unitHardening() async throws {
        let text = try String(contentsOfFile: Self.unit, encoding: .utf8)
        for line in [
            "Type=notify", "WatchdogSec=", "Wants=avahi-daemon.service", "After=network.target avahi-daemon.service",
            "RuntimeDirectory=lmx", "StateDirectory=lmx", "ConfigurationDirectory=lmx", "User=lmx", "Group=lmx",
            "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes", "PrivateDevices=yes",
            "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK", "MemoryDenyWriteExecute=yes",
            "SystemCallFilter=@system-service",
        ] {
            #expect(text.contains(line), "the unit lacks \(line)")
        }
        let result = try await run("/usr/bin/systemd-analyze", ["security", "--offline=yes", "--no-pager", Self.unit])
        let level = result.stdout.split(separator: "\n").first { $0.contains("Overall exposure level") }
        let score = level.flatMap { line in
            line.split(separator: ":").last?.split(separator: " ").first.flatMap { Double($0) }
        }
        #expect(score != nil, "\(result.stdout)\(result.stderr)")
        #expect((score ?? 10) <= 2.0, "exposure \(score ?? -1)")
    }

    @Test(
        "dpkg -i, the commands from /usr/bin, systemd-analyze verify, the service as user lmx, remove keeps the state, purge deletes it"
    )
    func installRunRemove() async throws {
        // A clean start, whatever an earlier run left.
        _ = try await run("/usr/bin/dpkg", ["--purge", "lmx-agent"])
        do {
            try await installed()
        } catch {
            _ = try? await run("/usr/bin/dpkg", ["--purge", "lmx-agent"])
            throw error
        }
    }

    private func installed() async throws {
        try await withResources {
            let install = try await run("/usr/bin/dpkg", ["-i", deb])
            #expect(install.status == 0, "\(install.stdout)\(install.stderr)")

            // The commands, from the package.
            let help = try await run("/usr/bin/lmx-status", ["--help"])
            #expect(help.status == 0)
            #expect(help.stdout.contains("lmx-status"))
            let version = try await run("/usr/bin/lmx-agentd", ["--version"])
            #expect(version.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == StatusAPI.version)
            // The release layout: lmx-status a static PIE (no program interpreter, position
            // independent), the daemon's hot code gathered by Packaging/lmx-agent-hot.ld.
            let statusHeaders = try await run("/usr/bin/readelf", ["-hlW", "/usr/bin/lmx-status"])
            #expect(
                statusHeaders.stdout.contains("DYN (Position-Independent Executable file)"),
                "\(statusHeaders.stdout.prefix(400))")
            #expect(!statusHeaders.stdout.contains("INTERP"), "lmx-status is not static")
            let sections = try await run("/usr/bin/readelf", ["-SW", "/usr/bin/lmx-agentd"])
            #expect(sections.stdout.contains(".text.lmx_hot"), "lmx-agentd has no hot-code section")
            // The image libraries are opened by lmx-pair when needed, never linked into the daemon.
            let needed = try await run("/usr/bin/readelf", ["-dW", "/usr/bin/lmx-agentd"])
            for library in ["libzbar", "libpng", "libturbojpeg", "libqrencode"] {
                #expect(!needed.stdout.contains(library), "lmx-agentd links \(library)")
            }
            let port = Int.random(in: 40_000...49_999)
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "packaged-\(port)")
            let name = "packaged \(TestBed.tag())"
            _ = try await Publish.avahi(bed, on: .h1, name: name, port: port)
            let discover = try await run(
                "/usr/bin/lmx-discover", ["--json", "--timeout", "5"],
                environment: ["DBUS_SYSTEM_BUS_ADDRESS": bed.bus(.root)])
            #expect(discover.status == 0, "\(discover.stderr)")
            #expect(discover.stdout.contains(name))
            let scratch = AgentProcess.makeDirectory()
            let dryRun = try await run(
                "/usr/bin/lmx-pair",
                [
                    TestBed.repo + "/examples/pairing/v1-token.png", "--dry-run", "--db", scratch + "/agent.db",
                    "--socket", scratch + "/x.sock",
                ])
            #expect(dryRun.status == 0, "\(dryRun.stderr)")
            #expect(dryRun.stdout.contains("would import"))

            // What the maintainer scripts and the package set up.
            let user = try await lookup("passwd", "lmx")
            #expect(user.count == 7 && user[5] == "/var/lib/lmx", "\(user)")
            let group = try await lookup("group", "lmx")
            #expect(!group.isEmpty)
            let config = mode("/etc/lmx/agent.json")
            #expect(config?.mode == 0o640)
            #expect(config?.uid == 0 && config?.gid == gid_t(group.count > 2 ? Int(group[2]) ?? -1 : -1))
            #expect(
                exists("/etc/systemd/system/multi-user.target.wants/lmx-agentd.service"), "the service was not enabled")
            #expect(
                !exists("/etc/systemd/user/default.target.wants/lmx-agentd.service"),
                "the per-user unit was enabled for every user")
            #expect(
                !exists("/etc/systemd/user/graphical-session.target.wants/lmx-notify.service"),
                "lmx-notify was enabled for every user")
            #expect(try await run("/usr/bin/man", ["-w", "lmx-notify"]).status == 0)
            #expect(try await run("/usr/bin/man", ["-w", "lmx-pair"]).status == 0)

            let verify = try await run(
                "/usr/bin/systemd-analyze", ["verify", "/usr/lib/systemd/system/lmx-agentd.service"])
            #expect(verify.status == 0, "\(verify.stdout)\(verify.stderr)")
            // The user unit, as a user manager reads it (it wants a runtime directory of its own).
            let runtime = FileManager.default.temporaryDirectory.appendingPathComponent("lmx-verify-\(getpid())").path
            try FileManager.default.createDirectory(
                atPath: runtime, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            defer { try? FileManager.default.removeItem(atPath: runtime) }
            let verifyUser = try await run(
                "/usr/bin/systemd-analyze", ["--user", "verify", "/usr/lib/systemd/user/lmx-notify.service"],
                environment: ["XDG_RUNTIME_DIR": runtime])
            #expect(verifyUser.status == 0, "\(verifyUser.stdout)\(verifyUser.stderr)")

            // The daemon as systemd starts it: user lmx, RuntimeDirectory=, StateDirectory=,
            // ConfigurationDirectory=, a umask of 077; it reads the shipped (commented) config.
            let uid = user.count > 2 ? user[2] : "0"
            let gid = user.count > 3 ? user[3] : "0"
            for (path, mode) in [("/run/lmx", "0755"), ("/var/lib/lmx", "0700")] {
                _ = try await run("/usr/bin/install", ["-d", "-o", "lmx", "-g", "lmx", "-m", mode, path])
            }
            let daemon = LiveProcess(
                "/usr/bin/setpriv",
                [
                    "--reuid", uid, "--regid", gid, "--init-groups", "--", "/bin/sh", "-c",
                    "umask 077; exec /usr/bin/lmx-agentd",
                ],
                environment: [
                    "RUNTIME_DIRECTORY": "/run/lmx", "STATE_DIRECTORY": "/var/lib/lmx",
                    "CONFIGURATION_DIRECTORY": "/etc/lmx",
                    "HOME": "/var/lib/lmx", "DBUS_SYSTEM_BUS_ADDRESS": bed.bus(.root), "LMX_SOCKET": "", "LMX_DB": "",
                ])
            try await daemon.start()

            // Any local user reaches the system agent with no option, and it found the server.
            let system = StatusClient(socketPath: "/run/lmx/agent.sock", timeout: 5)
            var found = false
            for _ in 0..<100 where !found {
                if let response = try? system.request("GET", "/v1/active"), response.status == 200,
                    let active = try? JSONDecoder().decode(StatusAPI.Active.self, from: Data(response.body))
                {
                    found = active.baseURL == server.baseURL
                }
                if !found { try await Task.sleep(for: .milliseconds(100)) }
            }
            #expect(found, "the packaged agent did not make \(server.baseURL) active: \(daemon.stderr)")
            let asNobody = try await run(
                "/usr/bin/setpriv",
                ["--reuid", "nobody", "--regid", "nogroup", "--clear-groups", "--", "/usr/bin/lmx-status", "--url"],
                environment: ["LMX_SOCKET": "", "XDG_RUNTIME_DIR": "/nonexistent", "HOME": "/nonexistent"])
            #expect(asNobody.status == 0, "\(asNobody.stderr)")
            #expect(asNobody.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == server.baseURL)
            // Changes are for root and lmx: another user's import is refused, root's goes through.
            let code = TestBed.repo + "/examples/pairing/account-link.png"
            let refused = try await run(
                "/usr/bin/setpriv",
                ["--reuid", "nobody", "--regid", "nogroup", "--clear-groups", "--", "/usr/bin/lmx-pair", code],
                environment: [
                    "LMX_SOCKET": "", "LMX_DB": "", "XDG_RUNTIME_DIR": "/nonexistent", "HOME": "/nonexistent",
                ])
            #expect(refused.status == 69)
            #expect(refused.stderr.contains("sudo"))
            let database = mode("/var/lib/lmx/agent.db")
            #expect(database?.mode == 0o600)
            #expect(database?.uid == uid_t(Int(uid) ?? -1))

            daemon.signal(SIGTERM)
            #expect(try await daemon.waitForExit(timeout: 10) == 0)
            #expect(!exists("/run/lmx/agent.sock"))
            try? FileManager.default.removeItem(atPath: "/run/lmx")
            try? FileManager.default.removeItem(atPath: scratch)

            // With the service stopped, `sudo lmx-pair` writes the database directly, and leaves
            // it to the service's user, who must still open it at the next start.
            let offline = try await run(
                "/usr/bin/lmx-pair", [TestBed.repo + "/examples/pairing/account-link.png"],
                environment: ["LMX_SOCKET": "", "LMX_DB": ""])
            #expect(offline.status == 0, "\(offline.stderr)")
            #expect(offline.stdout.contains("lmx-agentd is not running: saved to /var/lib/lmx/agent.db"))
            for file in ["/var/lib/lmx/agent.db", "/var/lib/lmx/agent.db-wal", "/var/lib/lmx/agent.db-shm"]
            where exists(file) {
                #expect(mode(file)?.uid == uid_t(Int(uid) ?? -1), "\(file) is not the service user's")
            }

            // Remove: the commands go, the pairings and history stay.
            let remove = try await run("/usr/bin/dpkg", ["-r", "lmx-agent"])
            #expect(remove.status == 0, "\(remove.stderr)")
            #expect(!exists("/usr/bin/lmx-agentd"))
            #expect(exists("/var/lib/lmx/agent.db"))
            #expect(!(try await lookup("passwd", "lmx")).isEmpty)

            // The lmx user plants a link in its state directory; installing again (postinst runs
            // as root) must not hand the link's target to lmx.
            let victim = "/tmp/lmx-victim-\(TestBed.tag())"
            try "root's\n".write(toFile: victim, atomically: true, encoding: .utf8)
            chmod(victim, 0o640)
            defer { unlink(victim) }
            unlink("/var/lib/lmx/agent.db-wal")
            symlink(victim, "/var/lib/lmx/agent.db-wal")
            let reinstall = try await run("/usr/bin/dpkg", ["-i", deb])
            #expect(reinstall.status == 0, "\(reinstall.stderr)")
            #expect(mode(victim)?.uid == 0, "postinst handed \(victim) to the service user")
            #expect(mode(victim)?.mode == 0o640)
            unlink("/var/lib/lmx/agent.db-wal")
            // Purge: the state and the config go too.
            let purge = try await run("/usr/bin/dpkg", ["--purge", "lmx-agent"])
            #expect(purge.status == 0, "\(purge.stderr)")
            #expect(!exists("/var/lib/lmx"))
            #expect(!exists("/etc/lmx"))
            #expect(!exists("/etc/systemd/system/multi-user.target.wants/lmx-agentd.service"))
        }
    }

    @Test(
        "make install (PREFIX, DESTDIR): commands, man pages, completions, the system and user units, the sysusers file; make uninstall removes them"
    )
    func makeInstall() async throws {
        let stage = FileManager.default.temporaryDirectory.appendingPathComponent("lmx-install-\(getpid())").path
        defer { try? FileManager.default.removeItem(atPath: stage) }
        let install = try await Command.run(
            "/usr/bin/make", ["-C", TestBed.repo, "install", "DESTDIR=\(stage)", "PREFIX=/opt/lmx"], timeout: 120)
        #expect(install.status == 0, "\(install.stderr)")
        var expected = [
            "/opt/lmx/lib/systemd/system/lmx-agentd.service", "/opt/lmx/lib/systemd/user/lmx-agentd.service",
            "/opt/lmx/share/doc/lmx-agent/agent.json", "/opt/lmx/lib/sysusers.d/lmx-agent.conf",
            "/opt/lmx/lib/systemd/user/lmx-notify.service",
        ]
        for command in ["lmx-agentd", "lmx-status", "lmx-discover", "lmx-pair", "lmx-notify"] {
            expected += [
                "/opt/lmx/bin/\(command)", "/opt/lmx/share/man/man1/\(command).1",
                "/opt/lmx/share/bash-completion/completions/\(command)",
                "/opt/lmx/share/zsh/site-functions/_\(command)",
                "/opt/lmx/share/fish/vendor_completions.d/\(command).fish",
            ]
        }
        for path in expected { #expect(FileManager.default.fileExists(atPath: stage + path), "\(path)") }
        for unit in ["system", "user"] {
            let text = try String(
                contentsOfFile: stage + "/opt/lmx/lib/systemd/\(unit)/lmx-agentd.service", encoding: .utf8)
            #expect(
                text.contains(
                    unit == "system"
                        ? "ExecStart=/opt/lmx/bin/lmx-agentd\n" : "ExecStart=/opt/lmx/bin/lmx-agentd --gateway off\n"),
                "\(unit) unit")
            #expect(!text.contains("@BINDIR@"))
        }
        // The service user, as `sudo systemd-sysusers PREFIX/lib/sysusers.d/lmx-agent.conf` makes it
        // (here in the staging root's /etc).
        try FileManager.default.createDirectory(atPath: stage + "/etc", withIntermediateDirectories: true)
        let sysusers = try await Command.run(
            "/usr/bin/systemd-sysusers", ["--root=\(stage)", stage + "/opt/lmx/lib/sysusers.d/lmx-agent.conf"])
        #expect(sysusers.status == 0, "\(sysusers.stderr)")
        let passwd = (try? String(contentsOfFile: stage + "/etc/passwd", encoding: .utf8)) ?? ""
        #expect(
            passwd.split(separator: "\n").contains {
                $0.hasPrefix("lmx:") && $0.hasSuffix(":/var/lib/lmx:/usr/sbin/nologin")
            }, "\(passwd)")
        let version = try await Command.run(stage + "/opt/lmx/bin/lmx-status", ["--version"])
        #expect(version.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == StatusAPI.version)
        let uninstall = try await Command.run(
            "/usr/bin/make", ["-C", TestBed.repo, "uninstall", "DESTDIR=\(stage)", "PREFIX=/opt/lmx"])
        #expect(uninstall.status == 0)
        for path in expected { #expect(!FileManager.default.fileExists(atPath: stage + path), "\(path) left behind") }
    }

    @Test(
        "under a real systemd (this OS booted with systemd-nspawn): started, notify, watchdog, sandboxed, finds a server, reload, upgrade, stop"
    )
    func underSystemd() async throws {
        let result = try await Command.run(TestBed.repo + "/scripts/checks/systemd-check.sh", [deb], timeout: 300)
        #expect(result.status == 0, "\(result.stdout)\(result.stderr)")
        let lines = result.stdout.split(separator: "\n").map(String.init)
        for check in [
            "started", "enabled", "status-text", "user", "seccomp", "no-new-privileges", "no-capabilities",
            "finds-server",
            "watchdog", "nobody-reads-status", "database", "reload", "stop", "journal", "gateway", "gateway-socket",
            "endpoint-env", "journal-priorities", "upgrade",
        ] {
            #expect(
                lines.contains("CHECK \(check) ok"),
                "\(check): \(lines.first { $0.hasPrefix("CHECK \(check) ") } ?? "not reported")")
        }
    }
}
