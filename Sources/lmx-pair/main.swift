import LMXPairCommand

// The command alone (development and tests); the package installs the multi-call lmx-agent.
LMXPair.main()
