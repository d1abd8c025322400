import ArgumentParser
import LMXAgentdCommand

// The command alone (development and tests); the package installs the multi-call lmx-agent.
func start<Command: AsyncParsableCommand>(_: Command.Type) async { await Command.main() }
await start(LMXAgentd.self)
