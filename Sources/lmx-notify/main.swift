import LMXNotifyCommand

// The command alone (development, tests, man page); the package installs the multi-call lmx-agent.
LMXNotify.main()
