/// The changes an address-book watcher has not handled yet, folded into one: the paths that
/// changed and whether every file is to be read again (SIGHUP). However many changes arrive while
/// one is being handled (another local user making and removing a name in `/tmp` as fast as the
/// kernel lets them), what waits stays bounded, and the next pass handles them all at once.
public struct PendingChanges: Sendable, Equatable {
    /// The most paths kept; past them, ``everything`` stands for all.
    public static let maxPaths = 256

    /// Stands for any change (inotify's own overflow is reported as the same empty path).
    public static let everything = ""

    public private(set) var paths: Set<String> = []
    public private(set) var reread = false

    public init() {}

    public var isEmpty: Bool { paths.isEmpty && !reread }

    /// Adds the paths that changed.
    public mutating func add(_ changed: Set<String>) {
        guard !paths.contains(Self.everything) else { return }
        paths.formUnion(changed)
        if paths.count > Self.maxPaths { paths = [Self.everything] }
    }

    /// Asks for every file to be read again.
    public mutating func requestReread() { reread = true }

    /// What waits, leaving nothing.
    public mutating func take() -> PendingChanges {
        defer { self = PendingChanges() }
        return self
    }
}
