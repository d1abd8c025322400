import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Watches directories for names written, made, removed, renamed or changed (inotify), and
/// reports the paths that changed. One thread drains it while another may change what is
/// watched; the descriptor closes when this is dropped.
public final class DirectoryWatch: Sendable {
    /// Readable when changes wait (for a ``PollingThread``).
    public let descriptor: Int32
    private var fd: Int32 { descriptor }
    private let directories = Mutex<[Int32: String]>([:])

    /// What a name's change is: written, made, removed, renamed either way, its mode or links
    /// changed; and the folder itself removed or renamed. Never through a link, folders only.
    private static let mask =
        UInt32(IN_CLOSE_WRITE) | UInt32(IN_MOVED_TO) | UInt32(IN_MOVED_FROM) | UInt32(IN_CREATE)
        | UInt32(IN_DELETE) | UInt32(IN_ATTRIB) | UInt32(IN_DELETE_SELF) | UInt32(IN_MOVE_SELF)
        | UInt32(IN_ONLYDIR) | UInt32(IN_DONT_FOLLOW)

    /// Reported by ``drain()`` when the kernel's queue overflowed: anything may have changed.
    public static let overflow = ""

    /// - Throws: when inotify is unavailable.
    public init() throws(SystemError) {
        descriptor = inotify_init1(Int32(IN_CLOEXEC | IN_NONBLOCK))
        guard descriptor >= 0 else { throw SystemError("inotify is unavailable") }
    }

    deinit { close(fd) }

    /// Starts watching `directory`.
    public func add(_ directory: String) throws(SystemError) {
        let wd = inotify_add_watch(fd, directory, Self.mask)
        guard wd >= 0 else { throw SystemError("cannot watch \(directory): \(SystemError.describe(errno))") }
        directories.withLock { $0[wd] = directory }
    }

    /// Watches exactly `wanted`: adds the folders that are new, stops watching the others.
    /// - Returns: the folders that could not be watched (gone meanwhile, not allowed).
    @discardableResult
    public func watch(exactly wanted: Set<String>) -> [String] {
        // Added again even when watched: a folder made anew under the same name is another
        // inode, with a watch of its own.
        var kept: [Int32: String] = [:]
        var failed: [String] = []
        for directory in wanted.sorted() {
            let wd = inotify_add_watch(fd, directory, Self.mask)
            if wd >= 0 { kept[wd] = directory } else { failed.append(directory) }
        }
        let previous = directories.withLock { watched in
            defer { watched = kept }
            return watched
        }
        for wd in previous.keys where kept[wd] == nil { inotify_rm_watch(fd, wd) }
        return failed
    }

    /// The paths (directory + "/" + name; the directory alone when it was itself removed or
    /// renamed; ``overflow`` when events were lost) that changed, from the events waiting (never
    /// blocks).
    public func drain() -> [String] {
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        guard
            case .success(let n) = SystemCall.retrying({
                buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            }),
            n > 0
        else { return [] }
        var paths: [String] = []
        var offset = 0
        let headerSize = MemoryLayout<inotify_event>.size
        while offset + headerSize <= n {
            // Each record: the fixed header (read field by field at its own offset), then `len`
            // bytes of NUL-padded name.
            let event = buffer.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: offset, as: inotify_event.self) }
            let length = Int(event.len)
            let start = offset + headerSize
            let name = buffer[start..<min(n, start + length)].prefix { $0 != 0 }
            if event.mask & UInt32(IN_Q_OVERFLOW) != 0 {
                paths.append(Self.overflow)
            } else if let directory = directories.withLock({ $0[event.wd] }) {
                if name.isEmpty {
                    // The folder itself (removed, renamed), or its watch dropped (IN_IGNORED).
                    paths.append(directory)
                } else {
                    paths.append(
                        (directory == "/" ? "/" : directory + "/") + String(decoding: name, as: UTF8.self))
                }
            }
            offset = start + length
        }
        return paths
    }
}

/// Waits for any of several descriptors to be readable.
public enum Poll {
    /// - Returns: whether any is readable before `milliseconds` pass.
    @discardableResult
    public static func wait(_ descriptors: [Int32], milliseconds: Int32) -> Bool {
        guard !descriptors.isEmpty else {
            SystemClock.sleep(seconds: Double(milliseconds) / 1000)
            return false
        }
        var fds = descriptors.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
        let count = fds.count
        guard case .success(let ready) = SystemCall.retrying({ poll(&fds, nfds_t(count), milliseconds) }) else {
            return false
        }
        return ready > 0
    }
}
