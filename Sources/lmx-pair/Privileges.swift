#if canImport(Glibc)
import Glibc
#endif

/// Switching from root to the user who owns the agent's state, so that root never follows a
/// path that user controls.
enum Privileges {
    struct Identity {
        var uid: uid_t
        var gid: gid_t
    }

    /// The owner of `directory` when it is not root; nil when it is missing or root's.
    /// - Throws: `Failure.unavailable` when it is a symbolic link or not a directory.
    static func owner(ofDirectory directory: String) throws -> Identity? {
        var info = stat()
        guard lstat(directory, &info) == 0 else { return nil }
        guard (info.st_mode & S_IFMT) == S_IFDIR else {
            throw Failure.unavailable(
                "\(directory) is not a directory (a symbolic link?): root does not follow it; pass the real path with --db")
        }
        guard info.st_uid != 0 else { return nil }
        let gid = getpwuid(info.st_uid).map { $0.pointee.pw_gid } ?? info.st_gid
        return Identity(uid: info.st_uid, gid: gid)
    }

    /// Becomes `identity` for the rest of the process (real, effective and saved ids: root's
    /// setgid and setuid set all three): groups, then group, then user; checked by failing to
    /// become root again.
    static func drop(to identity: Identity) throws {
        guard setgroups(0, nil) == 0, setgid(identity.gid) == 0,
            setuid(identity.uid) == 0, setuid(0) != 0
        else {
            throw Failure.unavailable("could not switch to uid \(identity.uid): \(String(cString: strerror(errno)))")
        }
    }

    /// Runs `body` with `identity` as the effective user and group (nil: as is), then returns to
    /// root. For work that must end as root (writing a file where the caller asked).
    static func acting<T>(as identity: Identity?, _ body: () throws -> T) throws -> T {
        guard let identity else { return try body() }
        var groups = [gid_t](repeating: 0, count: 256)
        let count = getgroups(Int32(groups.count), &groups)
        guard setgroups(0, nil) == 0, setegid(identity.gid) == 0, seteuid(identity.uid) == 0 else {
            throw Failure.unavailable("could not act as uid \(identity.uid): \(String(cString: strerror(errno)))")
        }
        defer {
            _ = seteuid(0)
            _ = setegid(0)
            if count >= 0 { _ = setgroups(Int(count), groups) }
        }
        return try body()
    }
}
