import LMXCore

#if canImport(Glibc)
import Glibc
#endif

/// The per-user runtime directory used when `XDG_RUNTIME_DIR` is not set: `/tmp/lmx-<uid>`.
/// `/tmp` is everybody's, so another user can make that directory first, or plant a socket in
/// it for clients to trust. As the XDG base directory specification requires of a runtime
/// directory, it is used only when it is a real directory owned by the user with mode 0700.
public enum RuntimeDirectory {
    public static func fallback(uid: uid_t) -> String { AgentPaths.fallbackRuntimeDirectory(uid: uid) }

    /// The fallback directory that `socket` lies in, if it does.
    public static func fallbackContaining(_ socket: String, uid: uid_t) -> String? {
        let directory = fallback(uid: uid)
        return socket.hasPrefix(directory + "/") ? directory : nil
    }

    /// Why `directory` must not be used by user `uid`, or nil when it is safe.
    public static func problem(with directory: String, uid: uid_t) -> String? {
        var info = stat()
        guard lstat(directory, &info) == 0 else { return nil }  // missing: whoever makes it first is checked then
        if (info.st_mode & S_IFMT) == S_IFLNK { return "\(directory) is a symbolic link" }
        guard (info.st_mode & S_IFMT) == S_IFDIR else { return "\(directory) is not a directory" }
        if info.st_uid != uid { return "\(directory) belongs to uid \(info.st_uid), not to you (uid \(uid))" }
        if info.st_mode & 0o077 != 0 {
            return "\(directory) has mode \(String(info.st_mode & 0o777, radix: 8)), not 700"
        }
        return nil
    }

    /// Creates the fallback directory (0700) if it is missing, then checks it.
    /// - Returns: why it cannot be used, or nil.
    public static func prepare(uid: uid_t) -> String? {
        let directory = fallback(uid: uid)
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            return "cannot create \(directory): \(String(cString: strerror(errno)))"
        }
        return problem(with: directory, uid: uid)
    }

    /// The paths a client uses (`AgentPaths.client`), never trusting an unsafe fallback
    /// directory: a socket there counts as absent, and `warning` says why.
    public static func clientPaths(uid: uid_t, environment: [String: String]) -> (paths: AgentPaths, warning: String?) {
        func unsafe(_ path: String) -> String? {
            guard let directory = fallbackContaining(path, uid: uid), let problem = problem(with: directory, uid: uid) else {
                return nil
            }
            return "refusing \(path): \(problem) (XDG_RUNTIME_DIR is not set, and another user may have made it); set XDG_RUNTIME_DIR, or remove \(directory)"
        }
        // A socket in an unsafe directory counts as absent when choosing between agents.
        let paths = AgentPaths.client(uid: uid, environment: environment) { path in
            unsafe(path) == nil && access(path, F_OK) == 0
        }
        // Said also when the system agent was chosen instead of the user's own refused socket.
        let own = AgentPaths.standard(uid: uid, environment: environment)
        return (paths, unsafe(paths.socket) ?? unsafe(paths.database) ?? unsafe(own.socket))
    }
}
