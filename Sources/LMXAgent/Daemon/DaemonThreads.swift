import LMXSystem
import NIOCore

/// How many threads and heaps the daemon's process keeps, set once before anything starts.
///
/// SwiftNIO's shared event loops (the gateway, probes, the status API) default to one thread per
/// core, and glibc's allocator to up to eight heaps per core, each keeping its own freed memory
/// resident. A local agent idles almost always, and two loops carry its gateway far beyond what
/// a model server answers (Benchmarks/README.md: the gateway beside nginx, on two
/// cores). Measured with the event loops of a 16-core machine (`NIO_SINGLETON_GROUP_LOOP_COUNT=16`)
/// after some gateway traffic: 22 threads and 5.5 MiB of anonymous memory against 8 threads and
/// 4.6 MiB with two loops.
public enum DaemonThreads {
    /// The shared group's event loops, unless `NIO_SINGLETON_GROUP_LOOP_COUNT` says otherwise.
    public static let eventLoops = 2
    /// glibc's heaps, unless `GLIBC_TUNABLES` or `MALLOC_ARENA_MAX` sets them.
    public static let heaps = 2

    /// Sets the counts (`environment`: the process's). Call once, first thing in the daemon's
    /// process: SwiftNIO traps when its counts are set after its singletons were used.
    public static func configure(environment: [String: String]) {
        let loops = min(eventLoops, System.coreCount)
        if environment["NIO_SINGLETON_GROUP_LOOP_COUNT"] == nil {
            NIOSingletons.groupLoopCountSuggestion = loops
        }
        if environment["MALLOC_ARENA_MAX"] == nil, environment["GLIBC_TUNABLES"]?.contains("arena_max") != true {
            HeapMemory.limitArenas(heaps)
        }
    }
}
