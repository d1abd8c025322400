import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Standard output and error, written whole (retrying short writes and signals).
public enum StandardStream {
    case output, error

    public func write(_ text: String) {
        var text = text
        let fd: FileDescriptor = self == .output ? .standardOutput : .standardError
        // Retries short writes and signals; a closed stream is not an error worth reporting.
        _ = text.withUTF8 { try? fd.writeAll($0) }
    }

    /// Whether standard error is the journal stream named by `JOURNAL_STREAM` (`device:inode`),
    /// as systemd's documentation says to check.
    public static func errorIsJournal(_ journalStream: String?) -> Bool {
        guard let parts = journalStream?.split(separator: ":"), parts.count == 2,
            let device = UInt64(parts[0]), let inode = UInt64(parts[1])
        else { return false }
        var st = stat()
        guard fstat(STDERR_FILENO, &st) == 0 else { return false }
        return UInt64(st.st_dev) == device && UInt64(st.st_ino) == inode
    }
}

/// Limits of this process.
public enum ProcessLimits {
    /// Raises the soft limit on open files to the hard limit (at most `cap`): every local client
    /// holds a descriptor, and by hand the soft limit is often 1024.
    public static func raiseOpenFiles(cap: UInt64 = 65_536) {
        var files = rlimit()
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        if getrlimit(resource, &files) == 0, files.rlim_cur < files.rlim_max {
            files.rlim_cur = min(files.rlim_max, rlim_t(cap))
            _ = setrlimit(resource, &files)
        }
    }

    public static var processID: Int32 { getpid() }

    /// Ends the process with `code`.
    public static func exit(_ code: Int32) -> Never { Glibc.exit(code) }

    /// Ends the process with `code` after writing `message` to standard error.
    public static func exit(_ code: Int32, message: String) -> Never {
        StandardStream.error.write(message + "\n")
        Glibc.exit(code)
    }
}

/// Lines for people on standard output and standard error (commands).
public enum Console {
    public static func out(_ line: String) { StandardStream.output.write(line + "\n") }
    public static func error(_ line: String) { StandardStream.error.write(line + "\n") }
}

/// This process's environment variables.
public enum ProcessEnvironment {
    public static var current: [String: String] {
        var result: [String: String] = [:]
        var pointer = environ
        while let entry = pointer.pointee {
            let text = String(cString: entry)
            if let equals = text.firstIndex(of: "=") {
                result[String(text[..<equals])] = String(text[text.index(after: equals)...])
            }
            pointer += 1
        }
        return result
    }
}

/// Programs started and left to run on their own (a browser opening a page).
public enum Spawn {
    /// Starts `program` (looked up in `PATH` when it has no slash) with `arguments`, its output
    /// and input to /dev/null; it is not waited for. Call ``reapAutomatically()`` once first, so
    /// finished children do not linger.
    /// - Returns: whether it started.
    @discardableResult
    public static func detached(_ program: String, _ arguments: [String]) -> Bool {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for fd in [STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO] {
            posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == STDIN_FILENO ? O_RDONLY : O_WRONLY, 0)
        }
        let argv = ([program] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var pid: pid_t = 0
        return posix_spawnp(&pid, program, &actions, nil, argv, environ) == 0
    }

    /// Children are reaped by the kernel as they end (SIGCHLD ignored).
    public static func reapAutomatically() {
        signal(SIGCHLD, SIG_IGN)
    }
}
