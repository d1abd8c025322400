#if canImport(Glibc)
import Glibc
#endif

/// Notices a suspend without logind: `CLOCK_BOOTTIME` goes on while the machine sleeps,
/// `CLOCK_MONOTONIC` stops, so their difference grows by the time slept.
public struct SuspendDetector: Sendable {
    private var gap: Double
    /// Growth below this is noise (scheduling, NTP slewing), not a sleep.
    public var threshold: Double

    public init(threshold: Double = 2) {
        self.threshold = threshold
        gap = Self.gap()
    }

    /// Seconds slept since the last check, when a sleep happened.
    public mutating func check() -> Double? { check(gap: Self.gap()) }

    /// Feeds a gap read elsewhere (tests).
    public mutating func check(gap now: Double) -> Double? {
        defer { gap = now }
        let slept = now - gap
        return slept >= threshold ? slept : nil
    }

    static func gap() -> Double {
        var boot = timespec()
        var mono = timespec()
        clock_gettime(CLOCK_BOOTTIME, &boot)
        clock_gettime(CLOCK_MONOTONIC, &mono)
        return Double(boot.tv_sec - mono.tv_sec) + Double(boot.tv_nsec - mono.tv_nsec) / 1e9
    }
}
