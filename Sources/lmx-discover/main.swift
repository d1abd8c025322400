import ArgumentParser
import LMXDiscoverCommand

// The command alone (development and tests); the package installs the multi-call lmx-agent.
func start<Command: AsyncParsableCommand>(_: Command.Type) async { await Command.main() }
await start(LMXDiscover.self)
