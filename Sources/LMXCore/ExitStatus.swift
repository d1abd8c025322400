/// Every exit code of the commands, by name, in one place (the numbers are sysexits.h's where one
/// fits, so scripts and systemd's `RestartPreventExitStatus=` can rely on them). Which command
/// uses which, and when: docs/exit-codes.md.
public enum ExitStatus: Int32, Sendable, CaseIterable {
    /// Done; an endpoint is active (lmx-status); a server was found (lmx-discover).
    case success = 0
    /// Nothing usable: no endpoint (lmx-status), no server found (lmx-discover).
    case nothingFound = 1
    /// Nothing usable, and the cause is known (`lmx-discover --doctor`: the findings name it).
    case causeFound = 2
    /// A usage error (EX_USAGE).
    case usage = 64
    /// The input is not valid: no pairing code in it, a bad or expired payload (EX_DATAERR).
    case invalidInput = 65
    /// A file is missing or unreadable (EX_NOINPUT).
    case noInput = 66
    /// What is needed is not there or not allowed: the agent, the database, avahi-daemon, the
    /// bus (EX_UNAVAILABLE).
    case unavailable = 69
    /// Another lmx-agentd serves the socket, or it cannot be made (EX_CANTCREAT).
    case cannotCreate = 73
    /// The database cannot be opened (EX_IOERR).
    case ioError = 74
    /// A configuration error, naming the file and key (EX_CONFIG).
    case configuration = 78
    /// A socket path that cannot be bound: longer than a Unix socket address holds, or refused by
    /// `bind` (none of sysexits.h's fits: one past them).
    case socketPath = 79
}
