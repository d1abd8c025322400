import LMXCore
import LMXSystem
import Logging
import ServiceLifecycle
import Synchronization

/// Follows the Opta desktop manager's address books (`~/.config/opta/lmx-connections.json`):
/// when the file is rewritten (a quick tunnel got a new URL after cloudflared restarted), its
/// entries are imported again, so the pairing of the same entry follows the new tunnel without a
/// new QR code. Reads at most 1 MiB, and imports only entries that changed.
///
/// What is followed is the path as the user named it: every folder on the way to the file is
/// watched with inotify (``WatchPlan``), so a folder made after the start, a folder renamed and
/// made again, a link pointed elsewhere, or the file replaced by a rename or rewritten in place
/// all lead to the file being read again. SIGHUP (``reread()``) reads every file again.
public struct AddressBookWatcher: Service {
    let paths: [String]
    let manager: ConnectionManager
    let store: StoreExecutor
    let logger: Logger
    private let rereads: AsyncStream<Void>
    private let rereadInput: AsyncStream<Void>.Continuation

    public init(paths: [String], manager: ConnectionManager, store: StoreExecutor, logger: Logger) {
        self.paths = paths
        self.manager = manager
        self.store = store
        self.logger = logger
        (rereads, rereadInput) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    /// Reads every address book again (SIGHUP), even those whose content did not change, and
    /// watches their paths afresh.
    public func reread() {
        rereadInput.yield()
    }

    public func run() async throws {
        guard !paths.isEmpty else { return }
        let watch: DirectoryWatch
        do {
            watch = try DirectoryWatch()
        } catch {
            logger.warning("address books are not followed (read again on SIGHUP only): \(error)")
            var lastSeen: [String: [UInt8]] = [:]
            for path in paths { await load(path, lastSeen: &lastSeen) }
            for await _ in rereads.cancelOnGracefulShutdown() {
                lastSeen = [:]
                for path in paths { await load(path, lastSeen: &lastSeen) }
            }
            return
        }
        var plan = arm(watch, previous: nil)
        var lastSeen: [String: [UInt8]] = [:]
        for path in paths { await load(path, lastSeen: &lastSeen) }

        // A thread of its own blocks on inotify until a change or the stop.
        let changes: AsyncStream<Set<String>>
        let thread: PollingThread
        do {
            (changes, thread) = try PollingThread.start(label: "lmx.address-book-watch", buffering: 16) {
                poller, send in
                while case .readable = poller.wait(for: [watch.descriptor], milliseconds: -1) {
                    let changed = Set(watch.drain())
                    if !changed.isEmpty { send(changed) }
                }
            }
        } catch {
            logger.warning("address books are not followed: \(error)")
            return
        }
        // Changes fold into one pending value while one is handled, and a wake-up waits at most
        // once: a storm of changes (another user making and removing a name in /tmp) leaves one
        // pass to do, not one per change.
        let pending = PendingBox()
        let (wakeUps, wake) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
        await withDiscardingTaskGroup { group in
            group.addTask {
                for await changed in changes {
                    pending.state.withLock { $0.add(changed) }
                    wake.yield()
                }
                wake.finish()
            }
            group.addTask { [rereads] in
                for await _ in rereads {
                    pending.state.withLock { $0.requestReread() }
                    wake.yield()
                }
            }
            await withGracefulShutdownHandler {
                for await _ in wakeUps {
                    let next = pending.state.withLock { $0.take() }
                    let relevant = next.paths.contains { $0 == PendingChanges.everything || plan.matters($0) }
                    guard relevant || next.reread else { continue }
                    if relevant {
                        // The manager writes a temporary file and renames it: let the burst settle.
                        // (A SIGHUP meanwhile waits for the next pass.)
                        try? await Task.sleep(for: .milliseconds(150))
                    }
                    if next.reread { lastSeen = [:] }
                    plan = arm(watch, previous: plan)
                    for path in paths { await load(path, lastSeen: &lastSeen) }
                }
            } onGracefulShutdown: {
                thread.stop()
                rereadInput.finish()
            }
            thread.stop()
            rereadInput.finish()
        }
    }

    /// Watches the folders on the way to every path, again until nothing changed meanwhile (a
    /// folder made while the watches were being set), so that no change falls between the plan
    /// and the watches.
    private func arm(_ watch: DirectoryWatch, previous: WatchPlan?) -> WatchPlan {
        var plan = WatchPlan(paths: paths, lookup: Self.entry)
        for _ in 0..<8 {
            let failed = watch.watch(exactly: Set(plan.directories.keys))
            let again = WatchPlan(paths: paths, lookup: Self.entry)
            if again == plan {
                if !failed.isEmpty, plan != previous {
                    logger.warning(
                        "address book folders not followed (the files are read again on SIGHUP): \(failed.joined(separator: ", "))"
                    )
                }
                break
            }
            plan = again
        }
        return plan
    }

    /// What a path is, for the plan: `lstat`, and `readlink` for a link.
    private static func entry(_ path: String) -> WatchPlan.Entry {
        guard let info = FileSystem.info(path) else { return .missing }
        switch info.kind {
        case .directory: return .directory
        case .symbolicLink: return FileSystem.readLink(path).map { .symbolicLink($0) } ?? .missing
        default: return .other
        }
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

/// The changes waiting for the watcher's next pass, shared with the tasks that add to them.
private final class PendingBox: Sendable {
    let state = Mutex(PendingChanges())
}

/// Hands a value used by one thread only to that thread.
struct UncheckedBox<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}
