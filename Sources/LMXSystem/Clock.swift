import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The kernel's clocks, in seconds.
public enum SystemClock {
    /// Real time (seconds since 1970): follows clock corrections. Expiry dates are read on it.
    public static func realtime() -> Double { read(CLOCK_REALTIME) }
    /// Monotonic time: never jumps, stops during suspend.
    public static func monotonic() -> Double { read(CLOCK_MONOTONIC) }
    /// Whole seconds since 1970.
    public static func unixTime() -> Int64 { Int64(time(nil)) }

    private static func read(_ clock: clockid_t) -> Double {
        var ts = timespec()
        clock_gettime(clock, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    /// Sleeps the calling thread (commands with no event loop), resuming after signals.
    public static func sleep(seconds: Double) {
        guard seconds > 0 else { return }
        var request = timespec(tv_sec: Int(seconds), tv_nsec: Int((seconds - Double(Int(seconds))) * 1e9))
        var remaining = timespec()
        while nanosleep(&request, &remaining) != 0 && errno == EINTR { request = remaining }
    }
}

/// The agent's clock: monotonic seconds since the agent started (what the planner works in),
/// and the real time those seconds correspond to (what people and the database read). A manual
/// clock (``ManualTime``) stands in for both in tests: time moves only when the test says.
public struct AgentClock: Sendable {
    private let origin: ContinuousClock.Instant
    /// Real time (seconds since 1970) at the origin.
    public let originWall: Double
    private let manual: ManualTime?

    public init() {
        origin = ContinuousClock.now
        originWall = SystemClock.realtime()
        manual = nil
    }

    /// A clock that moves only with `time` (tests of the deciding code in process).
    public init(manual time: ManualTime) {
        origin = ContinuousClock.now
        originWall = time.wallAtStart
        manual = time
    }

    /// Monotonic seconds since the origin.
    public func now() -> Double {
        if let manual { return manual.now }
        let d = ContinuousClock.now - origin
        return Double(d.components.seconds) + Double(d.components.attoseconds) * 1e-18
    }

    /// The real time of monotonic instant `t`, as it was at the origin (no jumps): for showing
    /// when something happened, not for comparing with dates.
    public func wall(_ t: Double) -> Double { originWall + t }

    /// The real-time clock now (follows corrections; expiry is read on it).
    public func realtime() -> Double { manual?.wall ?? SystemClock.realtime() }

    /// Waits `seconds` of this clock (on a manual clock: until the test has moved it that far).
    public func sleep(seconds: Double) async {
        if let manual { return await manual.sleep(until: manual.now + seconds) }
        try? await Task.sleep(for: .milliseconds(Int64(max(seconds, 0) * 1000) + 1))
    }
}

/// Time that moves only when told (`advance`), for tests: sleepers wake when it reaches them.
public final class ManualTime: Sendable {
    private struct State {
        var now = 0.0
        var wall: Double
        var sleepers: [(id: UInt64, until: Double, continuation: CheckedContinuation<Void, Never>)] = []
        var nextID: UInt64 = 0
    }
    private let state: Mutex<State>
    public let wallAtStart: Double

    public init(wall: Double = 1_800_000_000) {
        wallAtStart = wall
        state = Mutex(State(wall: wall))
    }

    public var now: Double { state.withLock { $0.now } }
    public var wall: Double { state.withLock { $0.wall } }

    /// Moves both clocks forward by `seconds`; wakes whoever sleeps until then.
    public func advance(by seconds: Double) {
        let due = state.withLock { s -> [CheckedContinuation<Void, Never>] in
            s.now += seconds
            s.wall += seconds
            let now = s.now
            let due = s.sleepers.filter { $0.until <= now }.map(\.continuation)
            s.sleepers.removeAll { $0.until <= now }
            return due
        }
        for continuation in due { continuation.resume() }
    }

    /// Moves the real-time clock alone (a correction, or a wake after sleep).
    public func setWall(_ wall: Double) { state.withLock { $0.wall = wall } }

    /// How many wait now.
    public var sleeping: Int { state.withLock { $0.sleepers.count } }

    /// Returns once the clock reaches `t`, or the task is cancelled (as `Task.sleep` does).
    func sleep(until t: Double) async {
        let id = state.withLock { s -> UInt64 in
            s.nextID += 1
            return s.nextID
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let ready = state.withLock { s -> Bool in
                    if t <= s.now || Task.isCancelled { return true }
                    s.sleepers.append((id, t, continuation))
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            let sleeper = state.withLock { s -> CheckedContinuation<Void, Never>? in
                guard let index = s.sleepers.firstIndex(where: { $0.id == id }) else { return nil }
                return s.sleepers.remove(at: index).continuation
            }
            sleeper?.resume()
        }
    }
}

extension Duration {
    /// The duration in seconds.
    public var seconds: Double {
        // `components` once: each reading of it divides a 128-bit count of attoseconds.
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) * 1e-18
    }
}
