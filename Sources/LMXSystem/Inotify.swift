#if canImport(Glibc)
import Glibc
#endif

/// Watches directories for files written, renamed in, created or changed (inotify), and reports
/// the names that changed. Used from one thread; the descriptor closes when this is dropped.
public final class DirectoryWatch {
    /// Readable when changes wait (for a ``PollingThread``).
    public let descriptor: Int32
    private var fd: Int32 { descriptor }
    private var directories: [Int32: String] = [:]

    /// - Throws: when inotify is unavailable.
    public init() throws(SystemError) {
        descriptor = inotify_init1(Int32(IN_CLOEXEC | IN_NONBLOCK))
        guard descriptor >= 0 else { throw SystemError("inotify is unavailable") }
    }

    deinit { close(fd) }

    /// Starts watching `directory` for files closed after writing, moved in, created or changed.
    public func add(_ directory: String) throws(SystemError) {
        let mask = UInt32(IN_CLOSE_WRITE) | UInt32(IN_MOVED_TO) | UInt32(IN_CREATE) | UInt32(IN_ATTRIB)
        let wd = inotify_add_watch(fd, directory, mask)
        guard wd >= 0 else { throw SystemError("cannot watch \(directory)") }
        directories[wd] = directory
    }

    /// The paths (directory + "/" + name) that changed, from the events waiting (never blocks).
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
            if let directory = directories[event.wd], !name.isEmpty {
                paths.append(directory + "/" + String(decoding: name, as: UTF8.self))
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
