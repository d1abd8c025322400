import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Paths and files, as the agent needs them: never following a link where one could be planted.
public enum FileSystem {
    /// The directory holding `path`: `/` for `/x`, `.` for a bare name.
    public static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        let directory = String(path[..<slash])
        return directory.isEmpty ? "/" : directory
    }

    public enum Kind: Sendable, Equatable { case file, directory, symbolicLink, socket, other }

    /// What `lstat` says of a path (the link itself, never its target).
    public struct Info: Sendable {
        public var kind: Kind
        public var owner: UInt32
        public var group: UInt32
        /// Permission bits (0o777).
        public var mode: UInt32
        public var size: Int
    }

    /// Nil when nothing is there.
    public static func info(_ path: String) -> Info? {
        var st = stat()
        guard lstat(path, &st) == 0 else { return nil }
        return Info(st)
    }

    public static func exists(_ path: String) -> Bool { access(path, F_OK) == 0 }

    /// Where a symbolic link points, as written; nil when `path` is not a link.
    public static func readLink(_ path: String) -> String? {
        var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX))
        let count = buffer.withUnsafeMutableBufferPointer { out in
            out.baseAddress!.withMemoryRebound(to: CChar.self, capacity: out.count) {
                readlink(path, $0, out.count)
            }
        }
        guard count >= 0 else { return nil }
        return String(decoding: buffer[0..<count], as: UTF8.self)
    }

    public static func remove(_ path: String) { unlink(path) }

    public static func setMode(_ path: String, _ mode: UInt32) { chmod(path, mode_t(mode)) }

    /// Creates `directory` and its missing parents with `mode` (set whatever the umask).
    public static func makeDirectories(_ directory: String, mode: UInt32) throws(SystemError) {
        var prefix = directory.hasPrefix("/") ? "" : "."
        for component in directory.split(separator: "/") {
            prefix += "/" + component
            if mkdir(prefix, mode_t(mode)) == 0 {
                chmod(prefix, mode_t(mode))
            } else if errno != EEXIST {
                throw SystemError("cannot create directory \(prefix)")
            }
        }
    }

    /// Creates one directory (`mode`); an existing one is fine.
    public static func makeDirectory(_ path: String, mode: UInt32) throws(SystemError) {
        if mkdir(path, mode_t(mode)) != 0 && errno != EEXIST { throw SystemError("cannot create \(path)") }
    }

    /// Sets the process's file creation mask: the one it replaces.
    @discardableResult
    public static func setUmask(_ mask: UInt32) -> UInt32 { UInt32(umask(mode_t(mask))) }

    /// Renames `path` to `destination` (replacing it, on the same file system).
    public static func rename(_ path: String, to destination: String) throws(SystemError) {
        if Glibc.rename(path, destination) != 0 { throw SystemError("cannot move \(path) to \(destination)") }
    }

    /// Writes `bytes` to a new file beside `path` (never following or reusing an existing one),
    /// with `mode` whatever the umask, syncs it and renames it over `path`: a reader sees the old
    /// file or the new one, never half of one.
    public static func writeAtomically(_ bytes: [UInt8], to path: String, mode: UInt32) throws(SystemError) {
        let temporary = path + ".tmp-\(getpid())"
        unlink(temporary)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode_t(mode))
        guard fd >= 0 else { throw SystemError("cannot create \(temporary)") }
        fchmod(fd, mode_t(mode))
        do {
            _ = try FileDescriptor(rawValue: fd).writeAll(bytes)
        } catch {
            close(fd)
            unlink(temporary)
            throw SystemError("cannot write \(temporary)", code: (error as? Errno)?.rawValue ?? EIO)
        }
        let synced = fsync(fd) == 0
        let syncError = errno
        close(fd)
        guard synced else {
            unlink(temporary)
            throw SystemError("cannot write \(temporary)", code: syncError)
        }
        guard Glibc.rename(temporary, path) == 0 else {
            let error = SystemError("cannot replace \(path)")
            unlink(temporary)
            throw error
        }
    }

    public enum ReadError: Error, Sendable {
        /// Nothing at the path.
        case missing
        /// Could not open or read (permission, a directory, an I/O error).
        case unreadable(String)
        /// Larger than the limit (`size`: what was seen).
        case tooLarge(size: Int)
    }

    /// Reads a whole file, or standard input for `-`, refusing more than `limit` bytes before
    /// reading them when the size is known. `nonBlocking`: a FIFO planted in place of a file
    /// cannot block the reader.
    public static func read(_ path: String, limit: Int, nonBlocking: Bool = false) throws(ReadError) -> [UInt8] {
        let fd: Int32
        if path == "-" {
            fd = STDIN_FILENO
        } else {
            fd = open(path, O_RDONLY | O_CLOEXEC | (nonBlocking ? O_NONBLOCK : 0))
            guard fd >= 0 else {
                let code = errno
                if code == ENOENT { throw .missing }
                throw .unreadable(code == EACCES ? "permission denied" : SystemError.describe(code))
            }
        }
        defer { if fd != STDIN_FILENO { close(fd) } }
        var st = stat()
        if fstat(fd, &st) == 0 {
            if (st.st_mode & S_IFMT) == S_IFDIR { throw .unreadable("is a directory") }
            if nonBlocking && (st.st_mode & S_IFMT) != S_IFREG { throw .unreadable("not a regular file") }
            if (st.st_mode & S_IFMT) == S_IFREG && Int(st.st_size) > limit { throw .tooLarge(size: Int(st.st_size)) }
        }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65_536)
        let descriptor = FileDescriptor(rawValue: fd)
        while true {
            let n: Int
            do {
                n = try chunk.withUnsafeMutableBytes { try descriptor.read(into: $0) }  // retries EINTR
            } catch {
                throw .unreadable(SystemError.describe((error as? Errno)?.rawValue ?? EIO))
            }
            if n == 0 { break }
            bytes += chunk[0..<n]
            if bytes.count > limit { throw .tooLarge(size: bytes.count) }
        }
        return bytes
    }
}

extension FileSystem.Info {
    init(_ st: stat) {
        let kind: FileSystem.Kind =
            switch st.st_mode & S_IFMT {
            case S_IFREG: .file
            case S_IFDIR: .directory
            case S_IFLNK: .symbolicLink
            case S_IFSOCK: .socket
            default: .other
            }
        self.init(
            kind: kind, owner: st.st_uid, group: st.st_gid, mode: UInt32(st.st_mode & 0o777), size: Int(st.st_size))
    }
}
