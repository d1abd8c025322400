import ArgumentParser
import LMXAgentdCommand
import LMXCore
import LMXDiscoverCommand
import LMXNotifyCommand
import LMXPairCommand
import LMXStatusCommand
import LMXSystem

// One binary, five commands: installed once, with lmx-agentd, lmx-discover, lmx-pair and lmx-notify as links
// to it; the name it was started by says which command runs. Started by any other name, the
// first argument names the command (`lmx-agent status --url`).
let arguments = CommandLine.arguments
let invokedAs = arguments.first.map { String($0.split(separator: "/").last ?? "") } ?? ""
var command = invokedAs
var rest = Array(arguments.dropFirst())
if !MultiCall.commands.contains(command) {
    switch rest.first {
    case "--experimental-dump-help":
        // Tools that document every executable (swift-argument-parser's generate-manual) get
        // the daemon's description, as the binary is installed under its name.
        command = "lmx-agentd"
    case "--help", "-h":
        StandardStream.output.write(MultiCall.usage(invokedAs) + "\n")
        ProcessLimits.exit(ExitStatus.success.rawValue)
    case let named? where !named.hasPrefix("-"):
        command = named.hasPrefix("lmx-") ? named : "lmx-" + named
        rest.removeFirst()
    default:
        break
    }
}
switch command {
case "lmx-agentd": await MultiCall.run(LMXAgentd.self, rest)
case "lmx-status": LMXStatus.start(rest)
case "lmx-discover": await MultiCall.run(LMXDiscover.self, rest)
case "lmx-pair": LMXPair.main(rest)
case "lmx-notify": LMXNotify.main(rest)
default: ProcessLimits.exit(ExitStatus.usage.rawValue, message: MultiCall.usage(invokedAs))
}

enum MultiCall {
    static let commands = ["lmx-agentd", "lmx-status", "lmx-discover", "lmx-pair", "lmx-notify"]

    /// The asynchronous entry point (top-level code would pick the synchronous overload).
    static func run<Command: AsyncParsableCommand>(_: Command.Type, _ arguments: [String]) async {
        await Command.main(arguments)
    }

    static func usage(_ name: String) -> String {
        "\(name.isEmpty ? "lmx-agent" : name): the lmx-agent commands in one binary. Run it as one of "
            + "\(commands.joined(separator: ", ")) (the package installs them as links to it), or name the command "
            + "first: lmx-agent status --url"
    }
}
