import Foundation
import Testing

/// The documentation a newcomer meets: the README's first screen and every link in the docs.
@Suite("Documentation")
struct DocsTests {
    private let checker = "\(TestBed.repo)/scripts/checks/check-docs.py"

    @Test("every link in the Markdown files resolves inside the repository")
    func links() async throws {
        let result = try await Command.run("/usr/bin/python3", [checker, TestBed.repo])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.contains("resolve inside the repository"))
    }

    @Test("the checker finds a missing file, a missing heading and a link out of the repository")
    func checkerFails() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("lmx-docs-\(getpid())").path
        try FileManager.default.createDirectory(atPath: directory + "/docs", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try "# Title\n\n## A heading\n".write(toFile: directory + "/docs/a.md", atomically: true, encoding: .utf8)
        try """
        # Project
        [fine](docs/a.md#a-heading) [missing](docs/b.md) [heading](docs/a.md#nowhere) [outside](../shared/CONTRACT.md)
        """.write(toFile: directory + "/README.md", atomically: true, encoding: .utf8)
        let result = try await Command.run("/usr/bin/python3", [checker, directory])
        #expect(result.status == 1)
        #expect(result.stderr.contains("docs/b.md does not exist"))
        #expect(result.stderr.contains("has no heading #nowhere"))
        #expect(result.stderr.contains("leaves the repository"))
        #expect(!result.stderr.contains("fine"))
    }

    @Test("the README is a front page: the two commands on its first screen, at most 250 lines")
    func frontPage() throws {
        let readme = try String(contentsOfFile: TestBed.repo + "/README.md", encoding: .utf8)
        let lines = readme.split(separator: "\n", omittingEmptySubsequences: false)
        #expect(lines.count <= 250)
        let firstScreen = lines.prefix(24).joined(separator: "\n")
        #expect(firstScreen.contains("sudo make run"))
        #expect(firstScreen.contains("sudo make test"))
        #expect(
            firstScreen.contains("http://127.0.0.1:1235/") && firstScreen.contains("lmx-notify"),
            "the dashboard and lmx-notify")
    }

    @Test(
        "the benchmark page holds the current tables in at most 300 lines; docs/gateway.md describes the one path, the README's gateway part stays short"
    )
    func shortPages() throws {
        let benchmarks = try String(contentsOfFile: TestBed.repo + "/Benchmarks/README.md", encoding: .utf8)
        #expect(benchmarks.split(separator: "\n", omittingEmptySubsequences: false).count <= 300)
        for section in ["## Discovery", "## Footprint", "## The agent", "## The gateway beside nginx", "## Pairing"] {
            #expect(benchmarks.contains(section), "\(section)")
        }
        let readme = try String(contentsOfFile: TestBed.repo + "/README.md", encoding: .utf8)
        let gateway =
            readme.components(separatedBy: "**The gateway**").dropFirst().first?
            .components(separatedBy: "**Asking the agent**").first ?? ""
        #expect(!gateway.isEmpty && gateway.split(separator: "\n").count <= 25, "the README's gateway part")
        let page = try String(contentsOfFile: TestBed.repo + "/docs/gateway.md", encoding: .utf8)
        #expect(page.contains("ClientConnectionState") && page.contains("GatewayExchange"))
    }

    @Test("man pages: real EXIT STATUS, ENVIRONMENT and FILES sections; no subcommands claimed where there are none")
    func manPages() throws {
        for command in ["lmx-agentd", "lmx-status", "lmx-discover", "lmx-pair", "lmx-notify"] {
            let page = try String(contentsOfFile: "\(TestBed.repo)/Packaging/man/\(command).1", encoding: .utf8)
            #expect(!page.contains(".Ex -std"), "\(command): the generic exit status")
            for section in [".Sh ENVIRONMENT", ".Sh FILES", ".Sh \"EXIT STATUS\"", ".Sh \"SEE ALSO\""] {
                #expect(page.contains(section), "\(command): \(section)")
            }
            let synopsis = page.components(separatedBy: ".Sh SYNOPSIS")[1].components(separatedBy: ".Sh DESCRIPTION")[0]
            #expect(synopsis.contains(".Ar subcommand") == (command == "lmx-pair"), "\(command)")
            #expect(page.contains(".It 64"), "\(command): usage errors")
        }
    }
}
