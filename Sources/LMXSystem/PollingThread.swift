import CLinux
import Dispatch
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A thread that blocks in `poll` on the descriptors its loop names, and an `eventfd` that wakes
/// it at once to stop: no stop flag read every so many milliseconds. What the loop sees is
/// delivered as an `AsyncStream`, which finishes when the loop returns.
///
///     let (events, thread) = try PollingThread.start(label: "lmx.watch") { poller, send in
///         while case .readable(let ready) = poller.wait(for: [fd], milliseconds: -1) { … send(x) }
///     }
///     …  thread.stop()
public final class PollingThread: Sendable {
    private let wakeDescriptor: Int32
    private let stopped = Atomic<Bool>(false)

    /// What a wait ended with.
    public enum Wait: Equatable, Sendable {
        /// These of the descriptors waited for are readable (or hung up).
        case readable(Set<Int32>)
        /// The time given passed with none readable.
        case timedOut
        /// ``stop()`` was called: the loop should return.
        case stopped
    }

    private init() throws(SystemError) {
        let fd = eventfd(0, Int32(EFD_CLOEXEC) | Int32(EFD_NONBLOCK))
        guard fd >= 0 else { throw SystemError("cannot make an eventfd") }
        wakeDescriptor = fd
    }

    deinit { close(wakeDescriptor) }

    /// Starts `loop` on a thread of its own; its events arrive on the stream (the newest
    /// `buffering` kept when the reader is slow).
    public static func start<Event: Sendable>(
        label: String, buffering: Int = 64,
        _ loop: @escaping @Sendable (PollingThread, (Event) -> Void) -> Void
    ) throws(SystemError) -> (events: AsyncStream<Event>, thread: PollingThread) {
        let thread = try PollingThread()
        let (events, input) = AsyncStream<Event>.makeStream(bufferingPolicy: .bufferingNewest(buffering))
        DispatchQueue(label: label).async {
            loop(thread) { input.yield($0) }
            input.finish()
        }
        return (events, thread)
    }

    /// Whether ``stop()`` was called.
    public var isStopped: Bool { stopped.load(ordering: .acquiring) }

    /// Wakes the thread and makes every later ``wait(for:milliseconds:)`` answer `.stopped`.
    public func stop() {
        stopped.store(true, ordering: .releasing)
        var one: UInt64 = 1
        _ = SystemCall.retrying { Glibc.write(wakeDescriptor, &one, MemoryLayout<UInt64>.size) }
    }

    /// Waits until one of `descriptors` is readable, `milliseconds` pass (-1: no limit), or
    /// ``stop()`` is called.
    public func wait(for descriptors: [Int32], milliseconds: Int32) -> Wait {
        if isStopped { return .stopped }
        var fds =
            [pollfd(fd: wakeDescriptor, events: Int16(POLLIN), revents: 0)]
            + descriptors.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
        let count = fds.count
        switch SystemCall.retrying({ poll(&fds, nfds_t(count), milliseconds) }) {
        case .failure, .success(0):
            return isStopped ? .stopped : .timedOut
        case .success:
            if isStopped || fds[0].revents != 0 { return .stopped }
            return .readable(Set(fds.dropFirst().filter { $0.revents != 0 }.map(\.fd)))
        }
    }
}
