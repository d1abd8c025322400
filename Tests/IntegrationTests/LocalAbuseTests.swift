import Foundation
import LMXCore
import LMXStatusClient
import Testing

// Trust and robustness on this machine: hostile names, another user's connections and
// directories, links planted for root, files at the socket path.
extension RobustnessTests {
    @Test("control characters in an announced name never reach the terminal or the log")
    func escapedNames() async throws {
        try await withResources {
            let agent = try await AgentProcess.start(bed, config: config())
            let name = "evil\u{1B}[2J\u{1B}[31mred\u{202E}txt \(TestBed.tag())"
            // avahi-publish passes any bytes a D-Bus client gives it (python-zeroconf refuses them).
            _ = try await Publish.avahi(bed, on: .h1, name: name, port: freePort())
            #expect(await agent.waitForRoute(timeout: 10) { $0.name.contains("evil") } != nil)
            try await Task.sleep(for: .seconds(1))
            let table = try await Command.run("\(TestBed.binDir)/lmx-status", ["--socket", agent.socket])
            let discover = try await Command.discover(["-i", "lmxbr0"], bus: bed.bus(.root))
            for text in [table.stdout, table.stderr, discover.stdout, agent.process.stderr] {
                #expect(!text.contains("\u{1B}"), "an escape character got through")
                #expect(!text.contains("\u{202E}"), "a bidi override got through")
            }
            #expect(table.stdout.contains("evil\\x1b[2J\\x1b[31mred\\u{202e}txt"))
        }
    }

    @Test("1,100 hostile connections from another user: lmx-status --url still answers fast and failover still works")
    func hostileLocalUser() async throws {
        try await withResources {
            let agent = try await agentWithTunnel()
            let port = freePort()
            let server = try await LMXServer.start(bed, on: .h1, port: port, instance: "dos-\(port)")
            _ = try await Publish.avahi(bed, on: .h1, name: "dos \(TestBed.tag())", port: port)
            #expect(await agent.waitForActive(timeout: 8) { $0?.baseURL == server.baseURL } != nil)

            let hostile = LiveProcess(
                "/usr/bin/setpriv",
                [
                    "--reuid", "nobody", "--regid", "nogroup", "--clear-groups", "--", "/usr/bin/python3",
                    "\(TestBed.repo)/scripts/fixtures/hostile-clients.py", "--socket", agent.socket, "--count", "1100",
                    "--seconds", "20",
                ])
            try await hostile.start()
            #expect(await hostile.waitForLine(containing: "open ", timeout: 30))
            let summary = hostile.stdoutLines.first { $0.hasPrefix("open ") } ?? ""
            let numbers = summary.split(separator: " ").compactMap { Int($0) }
            #expect(numbers.count == 3 && numbers[0] <= 64, "\(summary)")

            // Another user (daemon, uid 1) asks as usual.
            var times: [Double] = []
            for _ in 0..<10 {
                let result = try await Command.run(
                    "/usr/bin/setpriv",
                    [
                        "--reuid", "daemon", "--regid", "daemon", "--clear-groups", "--",
                        "\(TestBed.binDir)/lmx-status", "--url",
                        "--socket", agent.socket,
                    ])
                #expect(result.status == 0, "\(result.stderr)")
                #expect(result.stdout.hasPrefix(server.baseURL))
                times.append(result.seconds)
            }
            times.sort()
            print(
                "figure: lmx-status --url beside 1,100 hostile connections: median \(times[5] * 1000) ms, max \(times[9] * 1000) ms; \(summary)"
            )
            #expect(times[5] <= 0.03, "median \(times[5]) s")

            await server.set("dead")
            let failover = await agent.waitForActive(timeout: 5) { $0?.via == .wan }
            #expect(failover != nil)
            #expect((failover ?? 99) <= 1.5)
            await hostile.stop()
        }
    }

    // MARK: - Local users

    /// `env` without the XDG and HOME variables, then `setpriv` to nobody.
    private var nobodyPrefix: [String] {
        [
            "-u", "XDG_RUNTIME_DIR", "-u", "HOME", "-u", "LMX_SOCKET", "-u", "LMX_DB", "/usr/bin/setpriv",
            "--reuid", "nobody", "--regid", "nogroup", "--clear-groups", "--",
        ]
    }

    private func runAsNobody(_ tool: String, _ arguments: [String]) async throws -> CommandResult {
        try await Command.run(
            "/usr/bin/env", nobodyPrefix + ["\(TestBed.binDir)/\(tool)"] + arguments,
            environment: ["DBUS_SYSTEM_BUS_ADDRESS": bed.bus(.root)], timeout: 20)
    }

    @Test(
        "/tmp/lmx-<uid> made by another user is refused by the daemon (73) and clients (69); made by the agent, it is 0700"
    )
    func tmpFallback() async throws {
        try await withResources {
            let directory = "/tmp/lmx-65534"
            try? FileManager.default.removeItem(atPath: directory)
            defer { try? FileManager.default.removeItem(atPath: directory) }
            // root (another user than nobody) makes the directory first, world-readable, with a socket.
            try FileManager.default.createDirectory(atPath: directory + "/lmx", withIntermediateDirectories: true)
            chmod(directory, 0o755)
            let daemon = try await runAsNobody("lmx-agentd", ["--no-discovery", "--config", "/dev/null"])
            #expect(daemon.status == 73, "\(daemon.stderr)")
            #expect(daemon.stderr.contains("belongs to uid 0"))
            let status = try await runAsNobody("lmx-status", ["--url"])
            #expect(status.status == 69)
            #expect(status.stderr.contains("/tmp/lmx-65534"))
            let pair = try await runAsNobody("lmx-pair", ["list"])
            #expect(pair.status == 69, "\(pair.stderr)")

            // Gone, it is made afresh by the daemon: nobody's own, 0700, and the daemon serves.
            try FileManager.default.removeItem(atPath: directory)
            let agent = LiveProcess(
                "/usr/bin/env",
                nobodyPrefix + ["\(TestBed.binDir)/lmx-agentd", "--no-discovery", "--config", "/dev/null"],
                environment: ["DBUS_SYSTEM_BUS_ADDRESS": bed.bus(.root)])
            Resources.current?.keep(agent)
            try await agent.start()
            #expect(
                await agent.waitFor(timeout: 10) { _ in
                    FileManager.default.fileExists(atPath: directory + "/lmx/agent.sock")
                })
            var info = stat()
            #expect(lstat(directory, &info) == 0)
            #expect(info.st_uid == 65534)
            #expect(info.st_mode & 0o777 == 0o700)
            let fine = try await runAsNobody("lmx-status", ["--json"])
            #expect(fine.status == 0 || fine.status == 1, "\(fine.stderr)")
            await agent.stop()
        }
    }

    @Test("sudo lmx-pair never follows a link planted in the agent's state directory")
    func plantedSymlink() async throws {
        try await withResources {
            let dir = "/tmp/lmx-planted-\(TestBed.tag())"
            let state = dir + "/state"
            try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(atPath: dir) }
            chmod(dir, 0o755)
            // The agent's user (here nobody) owns its state directory and plants links in it.
            chown(state, 65534, 65534)
            chmod(state, 0o700)
            let victim = dir + "/victim"
            try "root's secret\n".write(toFile: victim, atomically: true, encoding: .utf8)
            chmod(victim, 0o640)
            for suffix in ["-wal", "-shm"] { symlink(victim, state + "/agent.db" + suffix) }
            lchown(state + "/agent.db-wal", 65534, 65534)
            lchown(state + "/agent.db-shm", 65534, 65534)

            let payload = dir + "/pairing.txt"
            try "https://quiet-river-1234.trycloudflare.com".write(toFile: payload, atomically: true, encoding: .utf8)
            chmod(payload, 0o600)  // readable by root only: read before dropping to the agent's user
            let result = try await Command.run(
                "\(TestBed.binDir)/lmx-pair", [payload, "--db", state + "/agent.db", "--socket", dir + "/no.sock"])
            var info = stat()
            #expect(stat(victim, &info) == 0)
            #expect(info.st_uid == 0, "the victim was handed to uid \(info.st_uid)")
            #expect(info.st_mode & 0o777 == 0o640, "the victim's mode became \(String(info.st_mode & 0o777, radix: 8))")
            #expect(try String(contentsOfFile: victim, encoding: .utf8) == "root's secret\n")
            // It failed as the agent's user would (the links lead nowhere it may write), saying so.
            #expect(result.status == 69, "\(result.stdout) \(result.stderr)")

            // Without planted links the same import works and the database is the agent user's.
            for suffix in ["-wal", "-shm"] { unlink(state + "/agent.db" + suffix) }
            unlink(state + "/agent.db")
            let clean = try await Command.run(
                "\(TestBed.binDir)/lmx-pair", [payload, "--db", state + "/agent.db", "--socket", dir + "/no.sock"])
            #expect(clean.status == 0, "\(clean.stderr)")
            #expect(stat(state + "/agent.db", &info) == 0 && info.st_uid == 65534)
        }
    }

    @Test("a file at the socket path that is not a stale socket is never deleted: the daemon stops (73)")
    func socketPathNotOurs() async throws {
        let dir = AgentProcess.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/agent.sock"
        try "precious\n".write(toFile: path, atomically: true, encoding: .utf8)
        let result = try await Command.run(
            "\(TestBed.binDir)/lmx-agentd",
            ["--socket", path, "--db", dir + "/agent.db", "--config", "/dev/null", "--no-discovery"], timeout: 20)
        #expect(result.status == 73, "\(result.stderr)")
        #expect(result.stderr.contains("not a socket"))
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "precious\n")
    }

    // MARK: - The gateway's address

    /// Another user (nobody) listening on `host:port` until stopped.
    private func listenAsNobody(_ host: String, _ port: Int) async throws -> LiveProcess {
        let family = host.contains(":") ? "AF_INET6" : "AF_INET"
        let listener = LiveProcess(
            "/usr/bin/setpriv",
            [
                "--reuid", "nobody", "--regid", "nogroup", "--clear-groups", "--", "/usr/bin/python3", "-c",
                "import socket, time; s = socket.socket(socket.\(family)); s.bind(('\(host)', \(port))); s.listen(); print('listening', flush=True); time.sleep(120)",
            ])
        try await listener.start()
        #expect(await listener.waitForLine(containing: "listening", timeout: 10))
        return listener
    }

    /// An agent with its gateway on 127.0.0.1:`port`, and whether it came to serve and advertise
    /// it there within 10 s.
    private func agentServing(_ port: Int) async throws -> (agent: AgentProcess, served: Bool) {
        let agent = try await AgentProcess.start(
            bed, config: config(), arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(port)"])
        let served = await agent.process.waitFor(timeout: 10) { _ in
            (try? agent.status().gateway?.openAIBaseURL) == "http://127.0.0.1:\(port)/v1"
        }
        return (agent, served)
    }

    @Test(
        "the gateway holds 127.0.0.1 and ::1 (no other user can join its listening sockets); a port another user holds is not advertised, named with its user, retried; localhost refused while ::1 is theirs; a second agent of the same user does not share the port"
    )
    func gatewayAddressIsTheAgents() async throws {
        try await withResources {
            // 1. Both families free: both are the agent's, localhost is served.
            let free = freePort()
            let (agent, served) = try await agentServing(free)
            #expect(served)
            #expect(try await curl(["http://[::1]:\(free)/v1/models"]).status == 503)
            #expect(try await curl(["http://localhost:\(free)/v1/models"]).status == 503)
            // The agent's listening sockets share the port among its event loops (SO_REUSEPORT):
            // another user cannot join them to take a share of the connections.
            for (family, host) in [("AF_INET", "127.0.0.1"), ("AF_INET6", "::1")] {
                let join = try await Command.run(
                    "/usr/bin/setpriv",
                    [
                        "--reuid", "nobody", "--regid", "nogroup", "--clear-groups", "--", "/usr/bin/python3", "-c",
                        "import socket\ns = socket.socket(socket.\(family))\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\ntry:\n    s.bind(('\(host)', \(free))); s.listen(); print('joined')\nexcept OSError as e:\n    print('refused', e.errno)",
                    ])
                #expect(join.stdout.contains("refused 98"), "\(host): \(join.stdout) \(join.stderr)")
            }
            await agent.finish()

            // 2. Another user holds [::1]:port first: 127.0.0.1 is served and advertised,
            // Host: localhost is refused (it would reach them first), the status says who.
            let port6 = freePort()
            let squatter6 = try await listenAsNobody("::1", port6)
            let second = try await AgentProcess.start(
                bed, config: config(), arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(port6)"])
            let named = await second.process.waitFor(timeout: 10) { _ in
                (try? second.status().gateway?.problem)?.contains("held by nobody") == true
            }
            #expect(named, "\(String(describing: try? second.status().gateway))")
            #expect(try second.status().gateway?.openAIBaseURL == "http://127.0.0.1:\(port6)/v1")
            let byLocalhost = try await curl(["-H", "Host: localhost:\(port6)", "http://127.0.0.1:\(port6)/v1/models"])
            #expect(byLocalhost.status == 403 && byLocalhost.body.contains("localhost_not_ours"), "\(byLocalhost)")
            #expect(try await curl(["http://127.0.0.1:\(port6)/v1/models"]).status == 503)
            #expect(second.process.stderr.contains("error") && second.process.stderr.contains("held by nobody"))
            // They leave: the agent takes ::1 within its retry interval and localhost works again.
            await squatter6.stop()
            let taken6 = await second.process.waitFor(timeout: 15) { _ in
                (try? second.status().gateway?.problem) == .some(nil)
            }
            #expect(taken6)
            #expect(try await curl(["http://localhost:\(port6)/v1/models"]).status == 503)
            await second.finish()

            // 3. Another user holds 127.0.0.1:port: nothing is advertised (status, endpoint.env,
            // lmx-status say why and who) until the agent has it.
            let port4 = freePort()
            let squatter4 = try await listenAsNobody("127.0.0.1", port4)
            let third = try await AgentProcess.start(
                bed, config: config(), arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(port4)"])
            let refused = await third.process.waitFor(timeout: 10) { _ in
                (try? third.status().gateway?.problem)?.contains("127.0.0.1:\(port4) is held by nobody") == true
            }
            #expect(refused)
            #expect(try third.status().gateway?.openAIBaseURL == nil)
            let env = await third.endpointFile(containing: "LMX_GATEWAY_URL=''\n")
            #expect(env.contains("LMX_GATEWAY_URL=''\n"), "\(env)")
            let shown = try await Command.run("\(TestBed.binDir)/lmx-status", ["--socket", third.socket])
            #expect(shown.stdout.contains("Gateway: not on TCP") && shown.stdout.contains("nobody"), "\(shown.stdout)")
            await squatter4.stop()
            let advertised = await third.process.waitFor(timeout: 15) { _ in
                (try? third.status().gateway?.openAIBaseURL) == "http://127.0.0.1:\(port4)/v1"
            }
            #expect(advertised)
            let envAfter = await third.process.waitFor(timeout: 5) { _ in
                ((try? String(contentsOfFile: third.directory + "/endpoint.env", encoding: .utf8)) ?? "").contains(
                    "LMX_GATEWAY_URL='http://127.0.0.1:\(port4)/v1'")
            }
            #expect(envAfter)
            await third.finish()

            // 4. A second agent of the same user on the same port does not join the first's
            // listening sockets (the kernel would hand each a share of the connections): it says
            // the port is its own user's, advertises nothing, and takes the port once the first
            // has gone.
            let shared = freePort()
            let (first, firstServed) = try await agentServing(shared)
            #expect(firstServed)
            let twin = try await AgentProcess.start(
                bed, config: config(), arguments: ["--no-discovery", "--gateway", "127.0.0.1:\(shared)"])
            let waiting = await twin.process.waitFor(timeout: 10) { _ in
                (try? twin.status().gateway?.problem)?.contains(
                    "127.0.0.1:\(shared) is held by root (uid 0), the agent's own user (another lmx-agentd?)") == true
            }
            #expect(waiting, "\(String(describing: try? twin.status().gateway))")
            #expect(try twin.status().gateway?.openAIBaseURL == nil)
            let holders = try await Command.run("/usr/bin/ss", ["-Htlnp", "sport", "=", ":\(shared)"])
            #expect(holders.stdout.contains("pid=\(first.process.pid),"), "\(holders.stdout)")
            #expect(!holders.stdout.contains("pid=\(twin.process.pid),"), "\(holders.stdout)")
            await first.finish()
            let twinServed = await twin.process.waitFor(timeout: 15) { _ in
                (try? twin.status().gateway?.openAIBaseURL) == "http://127.0.0.1:\(shared)/v1"
            }
            #expect(twinServed)
            await twin.finish()
        }
    }
}
