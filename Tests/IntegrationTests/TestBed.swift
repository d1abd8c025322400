import Foundation
import Synchronization
import Testing

/// The running test LAN (`scripts/testbed.sh up`, done by `make test`), read from its env file.
/// Integration tests fail, never skip, when it is missing.
struct TestBed: Sendable {
    enum Host: String, Sendable { case root, h1, h2 }

    let values: [String: String]

    static func load() throws -> TestBed {
        let dir = stateDir
        guard let text = try? String(contentsOfFile: "\(dir)/env", encoding: .utf8) else {
            throw TestBedMissing(detail: "no test bed at \(dir): run `make test` (as root), or `sudo scripts/testbed.sh up` before `swift test`")
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
        }
    }

    func address(_ host: Host) -> String {
        switch host {
        case .root: self["LMX_TESTBED_ROOT_ADDR"]
        case .h1: self["LMX_TESTBED_H1_ADDR"]
        case .h2: self["LMX_TESTBED_H2_ADDR"]
        }
    }

    var noAvahiBus: String { self["LMX_TESTBED_NO_AVAHI_BUS"] }

    /// Where the built executables are: `LMX_BIN_DIR`, else this checkout's `.build/debug`.
    static var binDir: String {
        if let dir = ProcessInfo.processInfo.environment["LMX_BIN_DIR"] { return dir }
        let repo = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return repo.appendingPathComponent(".build/debug").path
    }

    static var repo: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
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
    static func run(_ executable: String, _ arguments: [String], environment: [String: String] = [:],
                    timeout seconds: Double = 60) async throws -> CommandResult {
        let process = LiveProcess(executable, arguments, environment: environment)
        try process.start()
        let started = ContinuousClock.now
        let status = try await process.waitForExit(timeout: seconds)
        let elapsed = ContinuousClock.now - started
        return CommandResult(status: status, stdout: process.stdout, stderr: process.stderr,
                             seconds: Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
    }

    static func discover(_ arguments: [String], bus: String? = nil, timeout: Double = 60) async throws -> CommandResult {
        var environment: [String: String] = [:]
        if let bus { environment["DBUS_SYSTEM_BUS_ADDRESS"] = bus }
        return try await run("\(TestBed.binDir)/lmx-discover", arguments, environment: environment, timeout: timeout)
    }
}

/// A child process whose output is collected line by line while it runs. Its PID is recorded
/// under the test bed's `publishers/` so `testbed.sh down` stops it even if a test crashes.
final class LiveProcess: Sendable {
    private struct Output {
        var stdout = Data()
        var stderr = Data()
        var openStreams = 2
    }

    private let process: Mutex<Process>
    private let output = Mutex(Output())
    private let stdinPipe = Pipe()
    private let pidFile: Mutex<String?> = Mutex(nil)

    init(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        self.process = Mutex(process)
    }

    func start() throws {
        let out = Pipe()
        let err = Pipe()
        let pid = try process.withLock { process in
            process.standardOutput = out
            process.standardError = err
            process.standardInput = stdinPipe
            try process.run()
            return process.processIdentifier
        }
        // One reader thread per pipe: poll and read until end of file, or until the child has
        // exited and the pipe is drained (a write end inherited by another child must not
        // hold the output back).
        startReader(out.fileHandleForReading.fileDescriptor, handle: out.fileHandleForReading, into: \.stdout)
        startReader(err.fileHandleForReading.fileDescriptor, handle: err.fileHandleForReading, into: \.stderr)
        Resources.current?.keep(self)
        let directory = "\(TestBed.stateDir)/publishers"
        let path = "\(directory)/\(pid).pid"
        try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        if FileManager.default.createFile(atPath: path, contents: Data("\(pid)\n".utf8)) {
            pidFile.withLock { $0 = path }
        }
    }

    private func startReader(_ fd: Int32, handle: FileHandle, into field: WritableKeyPath<Output, Data> & Sendable) {
        let thread = Thread { [self] in
            var buffer = [UInt8](repeating: 0, count: 65536)
            var exitedAt: ContinuousClock.Instant?
            while true {
                var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                let ready = poll(&pfd, 1, 50)
                if ready > 0 {
                    let count = read(fd, &buffer, buffer.count)
                    if count > 0 {
                        let chunk = Data(buffer[0..<count])
                        output.withLock { $0[keyPath: field].append(chunk) }
                        continue
                    }
                    if count < 0 && errno == EINTR { continue }
                    break  // end of file or error
                }
                if ready < 0 && errno == EINTR { continue }
                // Nothing to read: once the child is gone and the pipe stays empty, all of its
                // output has been read.
                if !isRunning {
                    if let exitedAt {
                        if ContinuousClock.now - exitedAt > .milliseconds(200) { break }
                    } else {
                        exitedAt = .now
                    }
                }
            }
            output.withLock { $0.openStreams -= 1 }
            _ = handle  // keeps the descriptor open while reading
        }
        thread.start()
    }

    var pid: Int32 { process.withLock { $0.processIdentifier } }
    var isRunning: Bool { process.withLock { $0.isRunning } }
    var stdout: String { output.withLock { String(decoding: $0.stdout, as: UTF8.self) } }
    var stderr: String { output.withLock { String(decoding: $0.stderr, as: UTF8.self) } }
    var stdoutLines: [String] { stdout.split(separator: "\n").map(String.init) }

    func send(_ line: String) {
        stdinPipe.fileHandleForWriting.write(Data((line + "\n").utf8))
    }

    func signal(_ number: Int32) {
        let pid = self.pid
        if pid > 0 { kill(pid, number) }
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

    /// Waits for the process to end; kills it past the timeout.
    @discardableResult
    func waitForExit(timeout seconds: Double) async throws -> Int32 {
        if await !waitFor(timeout: seconds, { !$0.isRunning }) {
            signal(SIGKILL)
            _ = await waitFor(timeout: 5) { !$0.isRunning }
            forget()
            throw TestBedMissing(detail: "process \(process.withLock { $0.executableURL?.lastPathComponent ?? "?" }) did not exit within \(seconds) s")
        }
        // Read everything the process wrote: both readers finish at end of file, or once the
        // exited child's pipe is drained.
        _ = await waitFor(timeout: 10) { process in process.output.withLock { $0.openStreams == 0 } }
        forget()
        return process.withLock { $0.terminationStatus }
    }

    /// Stops the process by its PID (SIGTERM, then SIGKILL) and waits for it.
    func stop(signal number: Int32 = SIGTERM) async {
        guard isRunning else { forget(); return }
        signal(number)
        if await !waitFor(timeout: 3, { !$0.isRunning }) {
            signal(SIGKILL)
            _ = await waitFor(timeout: 3) { !$0.isRunning }
        }
        forget()
    }

    private func forget() {
        pidFile.withLock { path in
            if let path { try? FileManager.default.removeItem(atPath: path) }
            path = nil
        }
    }
}

/// Publishers of `_opta-lmx._tcp` services on the test LAN.
enum Publish {
    /// `avahi-publish -s` through the avahi-daemon of `host`; returns once established.
    static func avahi(_ bed: TestBed, on host: TestBed.Host, name: String, port: Int = 1234,
                      type: String = "_opta-lmx._tcp", txt: [String] = ["path=/.well-known/opta-lmx", "service=opta-lmx"]) async throws -> LiveProcess {
        let process = LiveProcess("/usr/bin/avahi-publish", ["-s", name, type, String(port)] + txt,
                                  environment: ["DBUS_SYSTEM_BUS_ADDRESS": bed.bus(host)])
        try process.start()
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
        let process = LiveProcess("/usr/sbin/ip", [
            "netns", "exec", bed["LMX_TESTBED_H3_NS"], bed["LMX_TESTBED_PYTHON"],
            "\(TestBed.repo)/scripts/zeroconf-publish.py", "--address", bed["LMX_TESTBED_H3_ADDR"],
            "--name", name, "--ttl", String(ttl), "--port", String(port),
        ] + (announce.map { ["--announce", $0] } ?? []) + txt)
        try process.start()
        guard await process.waitForLine(containing: "registered", timeout: 15) else {
            await process.stop()
            throw TestBedMissing(detail: "zeroconf publisher '\(name)' did not register: \(process.stderr)")
        }
        return process
    }
}
