import Dispatch
import LMXCore
import LMXStore
import Logging
import ServiceLifecycle
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Follows the Opta desktop manager's address books (`~/.config/opta/lmx-connections.json`):
/// when the file is rewritten (a quick tunnel got a new URL after cloudflared restarted), its
/// entries are imported again, so the pairing of the same entry follows the new tunnel without a
/// new QR code. Watches each file's directory with inotify (the manager replaces the file), reads
/// at most 1 MiB, and imports only entries that changed.
public struct AddressBookWatcher: Service {
    let paths: [String]
    let manager: ConnectionManager
    let logger: Logger

    public init(paths: [String], manager: ConnectionManager, logger: Logger) {
        self.paths = paths
        self.manager = manager
        self.logger = logger
    }

    public func run() async throws {
        guard !paths.isEmpty else { return }
        let fd = inotify_init1(Int32(IN_CLOEXEC | IN_NONBLOCK))
        guard fd >= 0 else {
            logger.warning("address books are not followed: inotify is unavailable (\(String(cString: strerror(errno))))")
            return
        }
        var directories: [Int32: String] = [:]
        for directory in Set(paths.map(Self.directory)) {
            let mask = UInt32(IN_CLOSE_WRITE) | UInt32(IN_MOVED_TO) | UInt32(IN_CREATE) | UInt32(IN_ATTRIB)
            let wd = inotify_add_watch(fd, directory, mask)
            if wd < 0 {
                logger.warning(
                    "address book directory not followed (it is read again on SIGHUP): \(String(cString: strerror(errno)))",
                    metadata: ["directory": "\(directory)"])
            } else {
                directories[wd] = directory
            }
        }
        var lastSeen: [String: [UInt8]] = [:]
        for path in paths { await load(path, lastSeen: &lastSeen) }

        let (changes, continuation) = AsyncStream<Set<String>>.makeStream(bufferingPolicy: .bufferingNewest(16))
        // The reading thread owns the descriptor and closes it when told to stop.
        let stop = StopFlag()
        let names = Dictionary(grouping: paths, by: Self.directory)
        let thread = DispatchQueue(label: "lmx.address-book-watch")
        thread.async { [directories] in
            Self.readEvents(fd: fd, directories: directories, watched: names, stop: stop, continuation: continuation)
        }
        await withGracefulShutdownHandler {
            for await changed in changes {
                // The manager writes a temporary file and renames it: let the burst settle.
                try? await Task.sleep(for: .milliseconds(150))
                for path in changed.sorted() { await load(path, lastSeen: &lastSeen) }
            }
        } onGracefulShutdown: {
            stop.set()
            continuation.finish()
        }
        stop.set()
    }

    /// Blocks on the inotify descriptor (polling every 250 ms for the stop flag) and reports
    /// which watched files changed.
    private static func readEvents(
        fd: Int32, directories: [Int32: String], watched: [String: [String]], stop: StopFlag,
        continuation: AsyncStream<Set<String>>.Continuation
    ) {
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        while !stop.isSet {
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 250) > 0 else { continue }
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            guard n > 0 else { continue }
            var changed: Set<String> = []
            var offset = 0
            let headerSize = MemoryLayout<inotify_event>.size
            while offset + headerSize <= n {
                let (wd, length) = buffer.withUnsafeBytes { raw in
                    (raw.load(fromByteOffset: offset, as: Int32.self), Int(raw.load(fromByteOffset: offset + 12, as: UInt32.self)))
                }
                let nameBytes = buffer[(offset + headerSize)..<min(n, offset + headerSize + length)].prefix { $0 != 0 }
                let name = String(decoding: nameBytes, as: UTF8.self)
                if let directory = directories[wd] {
                    for path in watched[directory] ?? [] where path == directory + "/" + name {
                        changed.insert(path)
                    }
                }
                offset += headerSize + length
            }
            if !changed.isEmpty { continuation.yield(changed) }
        }
        continuation.finish()
    }

    static func directory(_ path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        let directory = String(path[..<slash])
        return directory.isEmpty ? "/" : directory
    }

    /// Reads the file and imports the entries that are new or changed since the store last saw
    /// them. A broken file is logged (once per content) and changes nothing.
    private func load(_ path: String, lastSeen: inout [String: [UInt8]]) async {
        guard let bytes = Self.read(path) else { return }
        guard lastSeen[path] != bytes else { return }
        lastSeen[path] = bytes
        let pairings: [Pairing]
        do {
            pairings = try PairingParser(now: Int64(time(nil))).parse(bytes)
        } catch {
            logger.warning("address book not imported: \(error.description); fix the file or remove it from address_books", metadata: ["file": "\(path)"])
            return
        }
        let stored = (try? await manager.storedPairings()) ?? []
        let changed = pairings.filter { pairing in
            !stored.contains { $0.isSameServer(as: pairing) && $0.wan?.url == pairing.wan?.url && $0.lan == pairing.lan }
        }
        guard !changed.isEmpty else { return }
        do {
            let results = try await manager.importPairings(changed)
            logger.notice(
                "address book changed: pairings updated",
                metadata: ["file": "\(path)", "updated": "\(results.filter(\.isUpdate).count)", "added": "\(results.filter { !$0.isUpdate }.count)"])
        } catch {
            logger.warning("address book not imported: \(error)", metadata: ["file": "\(path)"])
        }
    }

    /// The file's bytes (at most 1 MiB, regular files only), or nil.
    static func read(_ path: String) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG, info.st_size <= PairingParser.maxAddressBookBytes else { return nil }
        var bytes = [UInt8](repeating: 0, count: Int(info.st_size))
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress! + offset, $0.count - offset) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            offset += n
        }
        return Array(bytes.prefix(offset))
    }
}

/// A flag one thread sets and another polls.
final class StopFlag: Sendable {
    private let flag = Atomic<Bool>(false)
    func set() { flag.store(true, ordering: .relaxed) }
    var isSet: Bool { flag.load(ordering: .relaxed) }
}
