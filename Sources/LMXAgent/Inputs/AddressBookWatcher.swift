import LMXCore
import LMXSystem
import Logging
import ServiceLifecycle

/// Follows the Opta desktop manager's address books (`~/.config/opta/lmx-connections.json`):
/// when the file is rewritten (a quick tunnel got a new URL after cloudflared restarted), its
/// entries are imported again, so the pairing of the same entry follows the new tunnel without a
/// new QR code. Watches each file's directory with inotify (the manager replaces the file), reads
/// at most 1 MiB, and imports only entries that changed.
public struct AddressBookWatcher: Service {
    let paths: [String]
    let manager: ConnectionManager
    let store: StoreExecutor
    let logger: Logger

    public init(paths: [String], manager: ConnectionManager, store: StoreExecutor, logger: Logger) {
        self.paths = paths
        self.manager = manager
        self.store = store
        self.logger = logger
    }

    public func run() async throws {
        guard !paths.isEmpty else { return }
        let watch: DirectoryWatch
        do {
            watch = try DirectoryWatch()
        } catch {
            logger.warning("address books are not followed: \(error)")
            return
        }
        for directory in Set(paths.map(FileSystem.directory(of:))) {
            do {
                try watch.add(directory)
            } catch {
                logger.warning(
                    "address book directory not followed (it is read again on SIGHUP): \(error)",
                    metadata: ["directory": "\(directory)"])
            }
        }
        var lastSeen: [String: [UInt8]] = [:]
        for path in paths { await load(path, lastSeen: &lastSeen) }

        // A thread of its own blocks on inotify until a change or the stop.
        let watched = Set(paths)
        let box = UncheckedBox(watch)
        let changes: AsyncStream<Set<String>>
        let thread: PollingThread
        do {
            (changes, thread) = try PollingThread.start(label: "lmx.address-book-watch", buffering: 16) {
                poller, send in
                while case .readable = poller.wait(for: [box.value.descriptor], milliseconds: -1) {
                    let changed = Set(box.value.drain()).intersection(watched)
                    if !changed.isEmpty { send(changed) }
                }
            }
        } catch {
            logger.warning("address books are not followed: \(error)")
            return
        }
        await withGracefulShutdownHandler {
            for await changed in changes {
                // The manager writes a temporary file and renames it: let the burst settle.
                try? await Task.sleep(for: .milliseconds(150))
                for path in changed.sorted() { await load(path, lastSeen: &lastSeen) }
            }
        } onGracefulShutdown: {
            thread.stop()
        }
        thread.stop()
    }

    /// Reads the file and imports the entries that are new or changed since the store last saw
    /// them. A broken file is logged (once per content) and changes nothing.
    private func load(_ path: String, lastSeen: inout [String: [UInt8]]) async {
        // Regular files only, never blocking on a FIFO planted in its place.
        guard let bytes = try? FileSystem.read(path, limit: PairingParser.maxAddressBookBytes, nonBlocking: true) else {
            return
        }
        guard lastSeen[path] != bytes else { return }
        lastSeen[path] = bytes
        let pairings: [Pairing]
        do {
            pairings = try PairingParser(now: SystemClock.unixTime()).parse(bytes)
        } catch {
            logger.warning(
                "address book not imported: \(error.description); fix the file or remove it from address_books",
                metadata: ["file": "\(path)"])
            return
        }
        let stored = (try? await store.read { try $0.pairings() }.map(\.pairing)) ?? []
        let changed = pairings.filter { pairing in
            !stored.contains {
                $0.isSameServer(as: pairing) && $0.wan?.url == pairing.wan?.url && $0.lan == pairing.lan
            }
        }
        guard !changed.isEmpty else { return }
        do {
            let results = try await manager.importPairings(changed)
            logger.notice(
                "address book changed: pairings updated",
                metadata: [
                    "file": "\(path)", "updated": "\(results.filter(\.isUpdate).count)",
                    "added": "\(results.filter { !$0.isUpdate }.count)",
                ])
        } catch {
            logger.warning("address book not imported: \(error)", metadata: ["file": "\(path)"])
        }
    }
}

/// Hands a value used by one thread only to that thread.
struct UncheckedBox<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}
