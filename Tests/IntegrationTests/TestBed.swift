import Foundation
import Subprocess
import Synchronization
import SystemPackage
import Testing

/// The running test LAN (`scripts/testbed.sh up`, done by `make test`), read from its env file.
/// Integration tests fail, never skip, when it is missing.
struct TestBed: Sendable {
    enum Host: String, Sendable { case root, h1, h2, h4 }

    let values: [String: String]

    static func load() throws -> TestBed {
        let dir = stateDir
        guard let text = try? String(contentsOfFile: "\(dir)/env", encoding: .utf8) else {
            throw TestBedMissing(
                detail:
                    "no test bed at \(dir): run `make test` (as root), or `sudo scripts/testbed.sh up` before `swift test`"
            )
        }
        var values: [String: String] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1)
            if parts.count == 2 { values[String(parts[0])] = String(parts[1]) }
        }
        return TestBed(values: values)
    }

    /// Where `scripts/testbed.sh` keeps its state (`LMX_TESTBED_DIR`, default `/run/lmx-testbed`).
    static var stateDir: String {
        ProcessInfo.processInfo.environment["LMX_TESTBED_DIR"] ?? "/run/lmx-testbed"
    }

    subscript(_ key: String) -> String { values[key] ?? "" }

    func bus(_ host: Host) -> String {
        switch host {
        case .root: self["LMX_TESTBED_ROOT_BUS"]
        case .h1: self["LMX_TESTBED_H1_BUS"]
        case .h2: self["LMX_TESTBED_H2_BUS"]
        case .h4: self["LMX_TESTBED_H4_BUS"]
        }
    }

    func address(_ host: Host) -> String {
        switch host {
        case .root: self["LMX_TESTBED_ROOT_ADDR"]
        case .h1: self["LMX_TESTBED_H1_ADDR"]
        case .h2: self["LMX_TESTBED_H2_ADDR"]
        case .h4: self["LMX_TESTBED_H4_ADDR"]
        }
    }

    var noAvahiBus: String { self["LMX_TESTBED_NO_AVAHI_BUS"] }

    /// Where the built executables are: `LMX_BIN_DIR`, else this checkout's `.build/debug`. The
    /// tests run the multi-call binary through links named after its commands, as the package
    /// installs it (`make test` makes them; made here too when missing).
    static let binDir: String = {
        let repo = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let dir = ProcessInfo.processInfo.environment["LMX_BIN_DIR"] ?? repo.appendingPathComponent(".build/debug").path
        for command in ["lmx-agentd", "lmx-discover", "lmx-pair", "lmx-notify"]
        where (try? FileManager.default.destinationOfSymbolicLink(atPath: dir + "/" + command)) != "lmx-agent" {
            try? FileManager.default.removeItem(atPath: dir + "/" + command)
            try? FileManager.default.createSymbolicLink(atPath: dir + "/" + command, withDestinationPath: "lmx-agent")
        }
        return dir
    }()

    static var repo: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().path
    }

    /// Runs `scripts/testbed.sh ARGS` and fails on error.
    func control(_ arguments: String..., environment: [String: String] = [:]) async throws {
        let result = try await Command.run(self["LMX_TESTBED_SCRIPT"], arguments, environment: environment)
        guard result.status == 0 else {
            throw TestBedMissing(detail: "testbed.sh \(arguments.joined(separator: " ")) failed: \(result.stderr)")
        }
    }

    /// A short random tag so each test's service names are its own.
    static func tag() -> String {
        String(UInt32.random(in: 0...UInt32.max), radix: 36)
    }
}

struct TestBedMissing: Error, CustomStringConvertible {
    let detail: String
    var description: String { detail }
}

/// A finished command.
struct CommandResult: Sendable {
    var status: Int32
    var stdout: String
    var stderr: String
    var seconds: Double
}

enum Command {
    /// Runs a command to completion, reading its output concurrently (large outputs would
    /// otherwise fill the pipe and deadlock).
    static func run(
        _ executable: String, _ arguments: [String], environment: [String: String] = [:],
        timeout seconds: Double = 60
    ) async throws -> CommandResult {
        let process = LiveProcess(executable, arguments, environment: environment)
        try await process.start()
        let started = ContinuousClock.now
        let status = try await process.waitForExit(timeout: seconds)
        let elapsed = ContinuousClock.now - started
        return CommandResult(
            status: status, stdout: process.stdout, stderr: process.stderr,
            seconds: Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
    }

    static func discover(_ arguments: [String], bus: String? = nil, timeout: Double = 60) async throws -> CommandResult
    {
        var environment: [String: String] = [:]
        if let bus { environment["DBUS_SYSTEM_BUS_ADDRESS"] = bus }
        return try await run("\(TestBed.binDir)/lmx-discover", arguments, environment: environment, timeout: timeout)
    }
}

/// A child process whose output is collected while it runs, launched by swift-subprocess. Its PID
/// is recorded under the test bed's `publishers/` so `testbed.sh down` stops it even if a test
/// crashes.
///
/// swift-subprocess scopes a child to a closure; a test needs a handle it can keep, signal and
/// stop later, so the closure runs in a task of its own and reports the child's life here.
final class LiveProcess: Sendable {
    private struct State {
        var stdout: [UInt8] = []
        var stderr: [UInt8] = []
        var pid: pid_t = 0
        var running = false
        var status: Int32?
    }

    private let executable: String
    private let arguments: [String]
    private let environment: [String: String]
    private let state = Mutex(State())
    private let pidFile: Mutex<String?> = Mutex(nil)
    /// Lines for the child's standard input, written in order by the closure.
    private let input: AsyncStream<String>
    private let inputLines: AsyncStream<String>.Continuation

    init(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) {
        self.executable = executable
        self.arguments = arguments
        self.environment = environment
        (input, inputLines) = AsyncStream.makeStream(of: String.self)
    }

    /// Launches the child; returns once it runs, throws if it could not be launched.
    func start() async throws {
        let launched = Mutex<CheckedContinuation<Void, any Error>?>(nil)
        let report: @Sendable (Result<Void, any Error>) -> Void = { result in
            launched.withLock { continuation in
                continuation?.resume(with: result)
                continuation = nil
            }
        }
        let updates = Dictionary(
            uniqueKeysWithValues: environment.map { (Environment.Key(rawValue: $0.key)!, Optional($0.value)) })
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            launched.withLock { $0 = continuation }
            Task.detached { [self] in
                do {
                    let result = try await Subprocess.run(
                        .path(FilePath(executable)), arguments: Arguments(arguments),
                        environment: .inherit.updating(updates),
                        input: .inputWriter, output: .sequence, error: .sequence
                    ) { execution in
                        let pid = execution.processIdentifier.value
                        state.withLock {
                            $0.pid = pid
                            $0.running = true
                        }
                        report(.success(()))
                        await collect(
                            execution.standardOutput, execution.standardError, writer: execution.standardInputWriter)
                    }
                    let status: Int32 =
                        switch result.terminationStatus {
                        case .exited(let code): code
                        case .signaled(let signal): signal
                        }
                    state.withLock {
                        $0.running = false
                        $0.status = status
                    }
                    report(.success(()))
                } catch {
                    state.withLock {
                        $0.running = false
                        $0.status = $0.status ?? -1
                    }
                    report(.failure(error))
                }
            }
        }
        Resources.current?.keep(self)
        let directory = "\(TestBed.stateDir)/publishers"
        let path = "\(directory)/\(pid).pid"
        try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        if FileManager.default.createFile(atPath: path, contents: Data("\(pid)\n".utf8)) {
            pidFile.withLock { $0 = path }
        }
    }

    /// Reads both output streams to their end (swift-subprocess ends them when the child exits,
    /// even if a grandchild still holds the pipes) while passing `send`'s lines to standard input.
    private func collect(
        _ stdout: SubprocessOutputSequence, _ stderr: SubprocessOutputSequence,
        writer: StandardInputWriter
    ) async {
        await withTaskGroup(of: Bool.self) { group in
            group.addTask { [self] in
                do { for try await chunk in stdout { append(chunk, to: \.stdout) } } catch {}
                return true
            }
            group.addTask { [self] in
                do { for try await chunk in stderr { append(chunk, to: \.stderr) } } catch {}
                return true
            }
            group.addTask { [input] in
                for await line in input { _ = try? await writer.write(line + "\n") }
                return false
            }
            var finishedReaders = 0
            while let isReader = await group.next() {
                if isReader { finishedReaders += 1 }
                if finishedReaders == 2 { group.cancelAll() }
            }
        }
        try? await writer.finish()
    }

    private func append(_ chunk: SubprocessOutputSequence.Buffer, to field: WritableKeyPath<State, [UInt8]> & Sendable)
    {
        chunk.withUnsafeBytes { bytes in
            state.withLock { $0[keyPath: field].append(contentsOf: bytes) }
        }
    }

    var pid: Int32 { state.withLock { $0.pid } }
    var isRunning: Bool { state.withLock { $0.running } }
    var stdout: String { state.withLock { String(decoding: $0.stdout, as: UTF8.self) } }
    var stderr: String { state.withLock { String(decoding: $0.stderr, as: UTF8.self) } }
    var stdoutLines: [String] { stdout.split(separator: "\n").map(String.init) }

    func send(_ line: String) {
        inputLines.yield(line)
    }

    func signal(_ number: Int32) {
        // The child is reaped only after `running` turns false, so this PID is still ours.
        state.withLock { state in
            if state.running && state.pid > 0 { kill(state.pid, number) }
        }
    }

    /// Waits until `predicate` holds for the output so far; returns false on timeout.
    func waitFor(timeout seconds: Double, _ predicate: (LiveProcess) -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
        while ContinuousClock.now < deadline {
            if predicate(self) { return true }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return predicate(self)
    }

    func waitForLine(containing text: String, timeout seconds: Double) async -> Bool {
        await waitFor(timeout: seconds) { $0.stdout.contains(text) || $0.stderr.contains(text) }
    }

    /// Waits for the process to end and its output to be read; kills it past the timeout.
    /// Returns its exit code, or the signal that ended it.
    @discardableResult
    func waitForExit(timeout seconds: Double) async throws -> Int32 {
        if await !waitFor(timeout: seconds, { !$0.isRunning }) {
            signal(SIGKILL)
            _ = await waitFor(timeout: 5) { !$0.isRunning }
            forget()
            throw TestBedMissing(
                detail: "process \((executable as NSString).lastPathComponent) did not exit within \(seconds) s")
        }
        forget()
        return state.withLock { $0.status ?? -1 }
    }

    /// Stops the process by its PID (SIGTERM, then SIGKILL) and waits for it.
    func stop(signal number: Int32 = SIGTERM) async {
        guard isRunning else {
            forget()
            return
        }
        signal(number)
        if await !waitFor(timeout: 3, { !$0.isRunning }) {
            signal(SIGKILL)
            _ = await waitFor(timeout: 3) { !$0.isRunning }
        }
        forget()
    }

    private func forget() {
        inputLines.finish()
        pidFile.withLock { path in
            if let path { try? FileManager.default.removeItem(atPath: path) }
            path = nil
        }
    }
}

/// Publishers of `_opta-lmx._tcp` services on the test LAN.
enum Publish {
    /// `avahi-publish -s` through the avahi-daemon of `host`; returns once established.
    static func avahi(
        _ bed: TestBed, on host: TestBed.Host, name: String, port: Int = 1234,
        type: String = "_opta-lmx._tcp", txt: [String] = ["path=/.well-known/opta-lmx", "service=opta-lmx"]
    ) async throws -> LiveProcess {
        let process = LiveProcess(
            "/usr/bin/avahi-publish", ["-s", name, type, String(port)] + txt,
            environment: ["DBUS_SYSTEM_BUS_ADDRESS": bed.bus(host)])
        try await process.start()
        guard await process.waitForLine(containing: "Established under name", timeout: 10) else {
            await process.stop()
            throw TestBedMissing(detail: "avahi-publish '\(name)' on \(host) was not established: \(process.stderr)")
        }
        return process
    }

    /// A python-zeroconf responder in namespace lmxh3, bound to its test address.
    /// - Parameter announce: an IPv4 address to put in the A record instead of h3's own.
    static func zeroconf(
        _ bed: TestBed, name: String, ttl: Int, port: Int = 1234, txt: [String], announce: String? = nil
    ) async throws -> LiveProcess {
        let process = LiveProcess(
            "/usr/sbin/ip",
            [
                "netns", "exec", bed["LMX_TESTBED_H3_NS"], bed["LMX_TESTBED_PYTHON"],
                "\(TestBed.repo)/scripts/fixtures/zeroconf-publish.py", "--address", bed["LMX_TESTBED_H3_ADDR"],
                "--name", name, "--ttl", String(ttl), "--port", String(port),
            ] + (announce.map { ["--announce", $0] } ?? []) + txt)
        try await process.start()
        guard await process.waitForLine(containing: "registered", timeout: 15) else {
            await process.stop()
            throw TestBedMissing(detail: "zeroconf publisher '\(name)' did not register: \(process.stderr)")
        }
        return process
    }
}
