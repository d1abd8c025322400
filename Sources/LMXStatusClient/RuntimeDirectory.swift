import LMXCore
import LMXSystem

/// The per-user runtime directory used when `XDG_RUNTIME_DIR` is not set: `/tmp/lmx-<uid>`.
/// `/tmp` is everybody's, so another user can make that directory first, or plant a socket in
/// it for clients to trust. As the XDG base directory specification requires of a runtime
/// directory, it is used only when it is a real directory owned by the user with mode 0700.
public enum RuntimeDirectory {
    public static func fallback(uid: UInt32) -> String { AgentPaths.fallbackRuntimeDirectory(uid: uid) }

    /// The fallback directory that `socket` lies in, if it does.
    public static func fallbackContaining(_ socket: String, uid: UInt32) -> String? {
        let directory = fallback(uid: uid)
        return socket.hasPrefix(directory + "/") ? directory : nil
    }

    /// Why `directory` must not be used by user `uid`, or nil when it is safe.
    public static func problem(with directory: String, uid: UInt32) -> String? {
        // Missing: whoever makes it first is checked then.
        guard let info = FileSystem.info(directory) else { return nil }
        if info.kind == .symbolicLink { return "\(directory) is a symbolic link" }
        guard info.kind == .directory else { return "\(directory) is not a directory" }
        if info.owner != uid { return "\(directory) belongs to uid \(info.owner), not to you (uid \(uid))" }
        if info.mode & 0o077 != 0 { return "\(directory) has mode \(String(info.mode, radix: 8)), not 700" }
        return nil
    }

    /// Creates the fallback directory (0700) if it is missing, then checks it.
    /// - Returns: why it cannot be used, or nil.
    public static func prepare(uid: UInt32) -> String? {
        let directory = fallback(uid: uid)
        do { try FileSystem.makeDirectory(directory, mode: 0o700) } catch { return error.description }
        return problem(with: directory, uid: uid)
    }

    /// The paths a client uses (`AgentPaths.client`), never trusting an unsafe fallback
    /// directory: a socket there counts as absent, and `warning` says why.
    public static func clientPaths(uid: UInt32, environment: [String: String]) -> (paths: AgentPaths, warning: String?)
    {
        func unsafe(_ path: String) -> String? {
            guard let directory = fallbackContaining(path, uid: uid), let problem = problem(with: directory, uid: uid)
            else {
                return nil
            }
            return
                "refusing \(path): \(problem) (XDG_RUNTIME_DIR is not set, and another user may have made it); set XDG_RUNTIME_DIR, or remove \(directory)"
        }
        // A socket in an unsafe directory counts as absent when choosing between agents.
        let paths = AgentPaths.client(uid: uid, environment: environment) { path in
            unsafe(path) == nil && FileSystem.exists(path)
        }
        // Said also when the system agent was chosen instead of the user's own refused socket.
        let own = AgentPaths.standard(uid: uid, environment: environment)
        return (paths, unsafe(paths.socket) ?? unsafe(paths.database) ?? unsafe(own.socket))
    }

    /// Why a client must not use the default socket or database (the ones not given on the
    /// command line): they are in an unsafe fallback directory. Nil when they are safe.
    public static func unsafeDefault(socketGiven: Bool, databaseGiven: Bool, uid: UInt32, environment: [String: String])
        -> String?
    {
        guard !(socketGiven && databaseGiven) else { return nil }
        let resolved = clientPaths(uid: uid, environment: environment)
        guard let warning = resolved.warning else { return nil }
        let unsafeSocket = !socketGiven && fallbackContaining(resolved.paths.socket, uid: uid) != nil
        let unsafeDatabase = !databaseGiven && fallbackContaining(resolved.paths.database, uid: uid) != nil
        return unsafeSocket || unsafeDatabase ? warning : nil
    }
}
