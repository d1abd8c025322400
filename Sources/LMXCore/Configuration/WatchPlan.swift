/// What to watch so that a file the user named is followed by its name, whatever happens on the
/// way to it: a folder made after the agent started, a folder renamed and made again, a symbolic
/// link (the file itself, or a folder on its path) pointed elsewhere, the file replaced by a
/// rename or rewritten in place.
///
/// The path is walked one name at a time, as the kernel resolves it: every folder it passes
/// through is watched for the next name (made, removed, renamed, retargeted), links are followed
/// (at most ``maxLinks``, as the kernel's `ELOOP`), and the walk stops at the first name that is
/// not there yet, whose folder then tells when it appears. Any change to one of these names can
/// change what the path names: the plan is made again and the file read again.
public struct WatchPlan: Sendable, Equatable {
    /// What one name on the way is, as `lstat` (and `readlink`) say.
    public enum Entry: Sendable, Equatable {
        case missing
        case directory
        /// A symbolic link, and where it points (as written: absolute or relative to its folder).
        case symbolicLink(String)
        /// A file, or anything else that is not a folder.
        case other
    }

    /// The most links followed on one path (Linux's `MAXSYMLINKS`).
    public static let maxLinks = 40

    /// Each folder to watch, with the names in it that matter.
    public private(set) var directories: [String: Set<String>] = [:]

    public init() {}

    /// The plan for `paths`: `lookup` says what a path is, without following a final link.
    public init(paths: [String], lookup: (String) -> Entry) {
        for path in paths { add(path, lookup: lookup) }
    }

    /// Whether a change to `path` (a name in a watched folder, or a watched folder itself) can
    /// change what one of the paths names.
    public func matters(_ path: String) -> Bool {
        if directories[path] != nil { return true }
        let (directory, name) = Self.split(path)
        return directories[directory]?.contains(name) ?? false
    }

    private mutating func add(_ path: String, lookup: (String) -> Entry) {
        var current = path.hasPrefix("/") ? "/" : "."
        var pending = Self.names(path)[...]
        var links = 0
        while let name = pending.popFirst() {
            if name == "." { continue }
            if name == ".." {
                current = Self.split(current).directory
                continue
            }
            directories[current, default: []].insert(name)
            let next = Self.join(current, name)
            switch lookup(next) {
            case .missing:
                return
            case .directory:
                current = next
            case .other:
                // The file named (or a name under a file, which can never resolve).
                return
            case .symbolicLink(let target):
                links += 1
                guard links <= Self.maxLinks, !target.isEmpty else { return }
                if target.hasPrefix("/") { current = "/" }
                pending = (Self.names(target) + pending)[...]
            }
        }
    }

    static func names(_ path: String) -> [String] {
        path.split(separator: "/", omittingEmptySubsequences: true).map(String.init)
    }

    static func join(_ directory: String, _ name: String) -> String {
        directory == "/" ? "/" + name : directory + "/" + name
    }

    /// A path's folder and last name: `/a/b` → (`/a`, `b`), `/a` → (`/`, `a`), `b` → (`.`, `b`).
    static func split(_ path: String) -> (directory: String, name: String) {
        guard let slash = path.lastIndex(of: "/") else { return (".", path) }
        let directory = String(path[..<slash])
        return (directory.isEmpty ? "/" : directory, String(path[path.index(after: slash)...]))
    }
}
