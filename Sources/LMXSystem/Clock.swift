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
/// and the real time those seconds correspond to (what people and the database read).
public struct AgentClock: Sendable {
    private let origin: ContinuousClock.Instant
    /// Real time (seconds since 1970) at the origin.
    public let originWall: Double

    public init() {
        origin = ContinuousClock.now
        originWall = SystemClock.realtime()
    }

    /// Monotonic seconds since the origin.
    public func now() -> Double {
        let d = ContinuousClock.now - origin
        return Double(d.components.seconds) + Double(d.components.attoseconds) * 1e-18
    }

    /// The real time of monotonic instant `t`, as it was at the origin (no jumps).
    public func wall(_ t: Double) -> Double { originWall + t }

    /// The real-time clock now (follows corrections; expiry is read on it).
    public func realtime() -> Double { SystemClock.realtime() }
}

extension Duration {
    /// The duration in seconds.
    public var seconds: Double { Double(components.seconds) + Double(components.attoseconds) * 1e-18 }
}
