import ArgumentParser
import Testing

@testable import LMXStatusCommand

/// lmx-status parses its common short forms without the argument parser (start-up time); these
/// tests hold that quick parse to the parser's own result for every form it accepts, and check it
/// hands everything else to the parser.
@Suite("lmx-status quick parse")
struct StatusQuickParseTests {
    /// Every ordering of every subset of `pieces`, flattened into argument lists.
    private static func arrangements(_ pieces: [[String]]) -> [[String]] {
        var result: [[String]] = [[]]
        func permute(_ chosen: [[String]], _ rest: [[String]]) {
            if !chosen.isEmpty { result.append(chosen.flatMap { $0 }) }
            for (index, piece) in rest.enumerated() {
                var remaining = rest
                remaining.remove(at: index)
                permute(chosen + [piece], remaining)
            }
        }
        permute([], pieces)
        return result
    }

    private static func parsed(_ arguments: [String]) -> StatusRequest? {
        (try? LMXStatus.parse(arguments))?.request
    }

    @Test("every form it accepts is what the argument parser makes of it")
    func sameAsParser() {
        let pieces = [
            ["--url"], ["--json"], ["--socket", "/run/user/1000/lmx/agent.sock"], ["--socket=/tmp/a b.sock"],
        ]
        var quick = 0
        for arguments in Self.arrangements(pieces) {
            guard let request = StatusRequest(quick: arguments) else { continue }
            quick += 1
            // Valid: the same values; invalid (--url with --json): the parser refuses it too.
            let valid = (try? request.validate()) != nil
            #expect(Self.parsed(arguments) == (valid ? request : nil), "\(arguments)")
        }
        // At most one of the two --socket forms, with --url, --json, both or neither, in any order.
        #expect(quick == 27)
    }

    @Test("the forms it accepts, and what it leaves to the parser")
    func accepted() {
        #expect(
            StatusRequest(quick: ["--url"])
                == StatusRequest(url: true, json: false, watch: false, wait: nil, model: nil, socket: nil))
        #expect(StatusRequest(quick: ["--socket", "/s", "--url"])?.socket == "/s")
        #expect(StatusRequest(quick: ["--socket=-odd"])?.socket == "-odd")
        for arguments in [
            ["--url", "--url"], ["--socket"], ["--socket", "--url"], ["--socket", ""], ["--socket="],
            ["--socket", "/a", "--socket", "/b"],
            ["-h"], ["--help"], ["--version"], ["--watch"], ["--wait"], ["--wait=3"], ["--model", "m"], ["url"], ["--"],
            ["--url", "extra"], ["--URL"], ["--socket=/a", "--socket=/b"],
        ] {
            #expect(StatusRequest(quick: arguments) == nil, "\(arguments)")
        }
    }

    @Test("a quick parse that is invalid is left to the parser, which reports it")
    func invalidGoesToParser() throws {
        let request = try #require(StatusRequest(quick: ["--url", "--json"]))
        #expect(throws: ValidationError.self) { try request.validate() }
        #expect(throws: (any Error).self) { try LMXStatus.parse(["--url", "--json"]) }
    }
}
