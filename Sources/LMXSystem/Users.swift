import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Users and groups of this machine, and switching between them.
public enum Users {
    /// This process's effective user.
    public static var effective: UInt32 { geteuid() }

    /// Root, or the user this process runs as: the ones who administer it.
    public static func isAdministrator(_ uid: UInt32) -> Bool { uid == 0 || uid == geteuid() }

    /// A group's id, or nil when there is no such group.
    public static func groupID(named name: String) -> UInt32? {
        var entry = Glibc.group()
        var result: UnsafeMutablePointer<Glibc.group>?
        var buffer = [CChar](repeating: 0, count: 16384)
        guard getgrnam_r(name, &entry, &buffer, buffer.count, &result) == 0, result != nil else { return nil }
        return entry.gr_gid
    }

    /// Whether user `uid` belongs to group `gid` (primary or supplementary). A uid with no
    /// account is in no group.
    public static func isMember(uid: UInt32, ofGroup gid: UInt32) -> Bool {
        var account = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 16384)
        guard getpwuid_r(uid, &account, &buffer, buffer.count, &result) == 0, result != nil else { return false }
        if account.pw_gid == gid { return true }
        var count: Int32 = 64
        while true {
            var groups = [gid_t](repeating: 0, count: Int(count))
            var wanted = count
            if getgrouplist(account.pw_name, account.pw_gid, &groups, &wanted) >= 0 {
                return groups.prefix(Int(wanted)).contains(gid)
            }
            guard wanted > count, wanted <= 65536 else { return false }
            count = wanted
        }
    }

    /// `name (uid N)`, or `uid N` for a uid with no account: for messages.
    public static func describe(_ uid: UInt32) -> String {
        var account = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 16384)
        guard getpwuid_r(uid, &account, &buffer, buffer.count, &result) == 0, result != nil, let name = account.pw_name
        else {
            return "uid \(uid)"
        }
        return "\(String(cString: name)) (uid \(uid))"
    }

    /// A user and the group it acts with.
    public struct Identity: Sendable, Equatable {
        public var uid: UInt32
        public var gid: UInt32
    }

    /// The owner of `directory` when it is not root; nil when it is missing or root's.
    /// - Throws: when it is a symbolic link or not a directory (root never follows it).
    public static func owner(ofDirectory directory: String) throws(SystemError) -> Identity? {
        guard let info = FileSystem.info(directory) else { return nil }
        guard info.kind == .directory else {
            throw SystemError("\(directory) is not a directory (a symbolic link?)", code: ENOTDIR)
        }
        guard info.owner != 0 else { return nil }
        let gid = getpwuid(info.owner).map { $0.pointee.pw_gid } ?? info.group
        return Identity(uid: info.owner, gid: gid)
    }

    /// Becomes `identity` for the rest of the process (real, effective and saved ids: root's
    /// setgid and setuid set all three): groups, then group, then user; checked by failing to
    /// become root again.
    public static func become(_ identity: Identity) throws(SystemError) {
        guard setgroups(0, nil) == 0, setgid(identity.gid) == 0, setuid(identity.uid) == 0, setuid(0) != 0 else {
            throw SystemError("could not switch to uid \(identity.uid)")
        }
    }

    /// Runs `body` with `identity` as the effective user and group (nil: as is), then returns to
    /// root: for work that must end as root (writing a file where the caller asked).
    public static func acting<T, E: Error>(as identity: Identity?, _ body: () throws(E) -> T) throws -> T {
        guard let identity else { return try body() }
        var groups = [gid_t](repeating: 0, count: 256)
        let count = getgroups(Int32(groups.count), &groups)
        guard setgroups(0, nil) == 0, setegid(identity.gid) == 0, seteuid(identity.uid) == 0 else {
            throw SystemError("could not act as uid \(identity.uid)")
        }
        defer {
            _ = seteuid(0)
            _ = setegid(0)
            if count >= 0 { _ = setgroups(Int(count), groups) }
        }
        return try body()
    }
}

/// Membership of one group, looked up per user and kept for `ttl`, so that `gpasswd -a` and
/// `-d` take effect within seconds without a restart.
public final class GroupMembership: Sendable {
    public let group: String
    let ttl: Duration
    private let cache = Mutex<[UInt32: (member: Bool, at: ContinuousClock.Instant)]>([:])

    public init(group: String, ttl: Duration = .seconds(5)) {
        self.group = group
        self.ttl = ttl
    }

    /// What ``allows(_:)`` would say without looking anything up: true for root and this
    /// process's user, a member's answer while it is fresh; nil when the account database must
    /// be asked (which may wait on a directory service: not on an event loop).
    public func knownAnswer(_ uid: UInt32) -> Bool? {
        if Users.isAdministrator(uid) { return true }
        guard let known = cache.withLock({ $0[uid] }), ContinuousClock.now - known.at < ttl else { return nil }
        return known.member
    }

    /// Whether `uid` is root, this process's user or a member; nil when the group is gone.
    public func allows(_ uid: UInt32) -> Bool? {
        if Users.isAdministrator(uid) { return true }
        let now = ContinuousClock.now
        if let known = cache.withLock({ $0[uid] }), now - known.at < ttl { return known.member }
        guard let gid = Users.groupID(named: group) else { return nil }
        let member = Users.isMember(uid: uid, ofGroup: gid)
        cache.withLock { entries in
            if entries.count >= 1024 { entries.removeAll() }  // one entry per local user: a bound, not a policy
            entries[uid] = (member, now)
        }
        return member
    }
}

extension Users {
    /// For root (`invokingUID` 0) working on a file of an agent that runs as another user (the
    /// packaged service runs as `lmx` and owns `/var/lib/lmx`): the owner of the file's directory,
    /// to act as, so that a file or link that user planted there (`agent.db-wal -> /etc/shadow`)
    /// reaches only what that user may reach. Nil: not root, or the directory is missing or root's.
    /// - Throws: when the directory is a symbolic link or not a directory (root never follows it).
    public static func stateOwner(of path: String, invokingUID: UInt32) throws(SystemError) -> Identity? {
        guard invokingUID == 0, effective == 0 else { return nil }
        return try owner(ofDirectory: FileSystem.directory(of: path))
    }
}
