import Foundation
import LMXCore
import LMXStatusClient
import Testing

/// Socket paths as real machines have them (issue 66): a long `XDG_RUNTIME_DIR` or home, a deep
/// checkout. Every path the agent binds is checked against what binding really accepts (103
/// bytes: SwiftNIO's limit, under the kernel's 107) before it is used.
@Suite("Socket paths checked against the real bind limit (real daemon, real sockets)", .serialized)
struct SocketPathTests {
    let bed: TestBed

    init() throws {
        bed = try TestBed.load()
    }

    /// A fresh directory `D` such that `D/agent.sock` is exactly `bytes` long.
    private func directory(socketBytes bytes: Int) throws -> String {
        let base = AgentProcess.makeDirectory()
        let filler = bytes - base.utf8.count - "/".utf8.count - "/agent.sock".utf8.count
        precondition(filler > 0)
        let dir = base + "/" + String(repeating: "d", count: filler)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        return dir
    }

    private func daemon(_ arguments: [String], directory: String) async throws -> CommandResult {
        try await Command.run(
            "\(TestBed.binDir)/lmx-agentd",
            ["--db", directory + "/agent.db", "--config", "/dev/null", "--no-discovery", "--gateway", "off"]
                + arguments, environment: ["LMX_SOCKET": "", "LMX_DB": ""], timeout: 20)
    }

    @Test(
        "a status socket path over 103 bytes: exit 79 at once, naming the path and the limit; nothing left behind",
        arguments: [104, 107, 108, 160])
    func statusSocketTooLong(bytes: Int) async throws {
        let dir = try directory(socketBytes: bytes)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let socket = dir + "/agent.sock"
        let result = try await daemon(["--socket", socket], directory: dir)
        #expect(result.status == ExitStatus.socketPath.rawValue, "\(result.stderr)")
        #expect(result.stderr.contains(socket))
        #expect(result.stderr.contains("\(bytes) bytes, over the 103 bytes"))
        #expect(result.seconds < 5)
        #expect(!FileManager.default.fileExists(atPath: socket))
        #expect(!FileManager.default.fileExists(atPath: dir + "/agent.db"), "stopped before opening the database")
    }

    @Test("a status socket whose bind fails (a folder no file can be made in, /proc): exit 79 naming it, no longer 0")
    func statusBindFails() async throws {
        let dir = AgentProcess.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let result = try await daemon(["--socket", "/proc/lmx-\(TestBed.tag()).sock"], directory: dir)
        #expect(result.status == ExitStatus.socketPath.rawValue, "\(result.stderr)")
        #expect(result.stderr.contains("cannot bind the status socket /proc/lmx-"))
    }

    @Test("a gateway socket named over the limit (--gateway-socket): exit 79 naming it")
    func namedGatewaySocketTooLong() async throws {
        let dir = try directory(socketBytes: 104)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let gateway = dir + "/agent.sock"
        let result = try await daemon(
            ["--socket", AgentProcess.makeDirectory() + "/agent.sock", "--gateway-socket", gateway], directory: dir)
        #expect(result.status == ExitStatus.socketPath.rawValue, "\(result.stderr)")
        #expect(result.stderr.contains("gateway socket"))
        #expect(result.stderr.contains(gateway))
    }

    @Test(
        "at 103 bytes the status socket serves; the gateway socket beside it (105) is the gateway's problem in /v1/status, never advertised"
    )
    func gatewayBesideOverTheLimit() async throws {
        try await withResources {
            let dir = try directory(socketBytes: 103)
            let agent = try await AgentProcess.start(bed, arguments: ["--no-discovery"], directory: dir)
            #expect(agent.socket.utf8.count == 103)
            let status = await agent.waitForStatus(timeout: 5) { $0.gateway?.problem != nil }
            let gateway = try #require(status?.gateway)
            #expect(gateway.socket == nil)
            #expect(gateway.problem?.contains(dir + "/gateway.sock") == true, "\(gateway)")
            #expect(gateway.problem?.contains("105 bytes, over the 103") == true, "\(gateway)")
            #expect(!FileManager.default.fileExists(atPath: dir + "/gateway.sock"))
            #expect(agent.process.stderr.contains("gateway socket beside the status socket not made"))
        }
    }

    @Test("at 101 bytes both sockets are bound (the gateway's at 103) and the gateway's is advertised once it answers")
    func bothAtTheLimit() async throws {
        try await withResources {
            let dir = try directory(socketBytes: 101)
            let agent = try await AgentProcess.start(bed, arguments: ["--no-discovery"], directory: dir)
            let path = dir + "/gateway.sock"
            #expect(path.utf8.count == 103)
            let status = await agent.waitForStatus(timeout: 5) { $0.gateway?.socket != nil }
            #expect(status?.gateway?.socket == path)
            #expect(status?.gateway?.problem == nil)
            // The gateway answers there (its dashboard, at once).
            let answer = try StatusClient(socketPath: path, timeout: 5).request("GET", "/")
            #expect(answer.status == 200)
        }
    }

    @Test(
        "a gateway socket whose bind fails (its directory is missing): the gateway's problem in /v1/status, the agent runs"
    )
    func gatewayBindFails() async throws {
        try await withResources {
            let dir = AgentProcess.makeDirectory()
            let path = dir + "/missing-directory/gateway.sock"
            let agent = try await AgentProcess.start(
                bed, arguments: ["--no-discovery", "--gateway", "off", "--gateway-socket", path], directory: dir)
            let status = await agent.waitForStatus(timeout: 5) { $0.gateway?.problem != nil }
            #expect(status?.gateway?.socket == nil)
            #expect(
                status?.gateway?.problem?.contains("\(path) cannot be bound") == true, "\(String(describing: status))")
            #expect(agent.isServing)
        }
    }
}
