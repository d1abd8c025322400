import Foundation
import Testing

/// The multi-call binary the package installs: each command by the name it is started by, or
/// named first; anything else is a usage error.
@Suite("The multi-call binary")
struct MultiCallTests {
    @Test(
        "links named lmx-agentd, lmx-status, lmx-discover, lmx-pair, lmx-notify run that command; `lmx-agent status …` too; bare --wait works through it"
    )
    func dispatchByName() async throws {
        let binary = TestBed.binDir + "/lmx-agent"
        let dir = NSTemporaryDirectory() + "lmx-multicall-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        for name in ["lmx-agentd", "lmx-status", "lmx-discover", "lmx-pair", "lmx-notify"] {
            try FileManager.default.createSymbolicLink(atPath: "\(dir)/\(name)", withDestinationPath: binary)
            let help = try await Command.run("\(dir)/\(name)", ["--help"])
            #expect(help.status == 0, "\(name): \(help.stderr)")
            #expect(help.stdout.contains("USAGE: \(name)"), "\(name): \(help.stdout.prefix(200))")
        }
        // lmx-status's own argument handling (a bare --wait) survives the dispatch.
        let missing = dir + "/no-agent.sock"
        let viaLink = try await Command.run(
            "\(dir)/lmx-status", ["--wait", "--url", "--socket", missing], environment: ["LMX_SOCKET": ""])
        #expect(viaLink.status == 69, "\(viaLink.stderr)")
        let named = try await Command.run(
            binary, ["status", "--wait=0", "--url", "--socket", missing], environment: ["LMX_SOCKET": ""])
        #expect(named.status == 69, "\(named.stderr)")
        let unknown = try await Command.run(binary, ["frobnicate"])
        #expect(unknown.status == 64)
        #expect(unknown.stderr.contains("lmx-agentd, lmx-status, lmx-discover, lmx-pair, lmx-notify"))
    }
}
