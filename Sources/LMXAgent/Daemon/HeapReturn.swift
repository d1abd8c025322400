import LMXSystem
import Logging
import ServiceLifecycle

/// Gives the memory a burst of gateway traffic used back to the system once the traffic stops.
/// Large request bodies and many connections at once leave freed buffers in the allocator's
/// arenas, and glibc returns only what lies at the top of a heap: measured after 64 clients
/// sending 64 KB to 4 MB bodies, the daemon stayed at 12.8 MiB of anonymous memory (4.3 before)
/// until it exited; `malloc_trim` brought it to 5.7 within a millisecond.
///
/// Every `interval` it looks at the gateway's count of answers (``GatewayTraffic/recorded``) and
/// at the anonymous memory resident beyond what the allocator has handed out
/// (``HeapMemory/residentBeyondAllocatedBytes()``: freed, still held); once answers have been
/// counted and then a whole interval passes without one, or once that freed part grew by a MiB
/// (connections that held memory closed, whether or not anything was answered: 64 connections
/// with requests pipelined behind a long head left 7 MiB resident, none of it counted as an
/// answer), it gives the free pages back (``HeapMemory/returnFreePages()``), once. Nothing is done
/// while answers keep coming (what was freed is about to be used again) or while nothing was
/// freed; nothing is added to a request's path.
struct HeapReturn: Service {
    let traffic: GatewayTraffic
    let interval: Duration
    let logger: Logger

    init(traffic: GatewayTraffic, interval: Duration = .seconds(5), logger: Logger) {
        self.traffic = traffic
        self.interval = interval
        self.logger = logger
    }

    func run() async throws {
        var schedule = HeapReturnSchedule()
        while !Task.isShuttingDownGracefully, !Task.isCancelled {
            try? await cancelWhenGracefulShutdown { try await Task.sleep(for: interval) }
            guard !Task.isShuttingDownGracefully, !Task.isCancelled else { return }
            guard schedule.due(answers: traffic.recorded, freed: HeapMemory.residentBeyondAllocatedBytes()) else {
                continue
            }
            // The figures are read for the debug line only.
            guard logger.logLevel <= .debug else {
                HeapMemory.returnFreePages()
                continue
            }
            let before = HeapMemory.anonymousResidentKiB()
            let clock = ContinuousClock()
            let start = clock.now
            HeapMemory.returnFreePages()
            let took = clock.now - start
            logger.debug(
                "gateway quiet: free heap memory given back to the system",
                metadata: [
                    "anonymous_kib_before": "\(before.map(String.init) ?? "-")",
                    "anonymous_kib_after": "\(HeapMemory.anonymousResidentKiB().map(String.init) ?? "-")",
                    "took": "\(took)",
                ])
        }
    }
}

/// When ``HeapReturn`` gives memory back: the first look after answers were counted that finds no
/// new one, or a look (without new answers) that finds the memory freed and still resident
/// ``freedBytes`` above the least it was since the last return.
struct HeapReturnSchedule: Sendable {
    /// How much more freed memory must be resident for a look to give it back.
    static let freedBytes = 1 << 20
    private var seen = 0
    private var pending = false
    private var floor: Int?

    init() {}

    /// `answers`: the count now; `freed`: the anonymous memory resident beyond what the allocator
    /// has handed out, bytes (nil: unknown). True when the gateway has answered since the last
    /// return and not since the last look, or when the freed memory grew by ``freedBytes`` over
    /// its least since the last return and nothing was answered since the last look.
    mutating func due(answers: Int, freed: Int? = nil) -> Bool {
        if let freed { floor = min(floor ?? freed, freed) }
        if answers != seen {
            seen = answers
            pending = true
            return false
        }
        let grown = freed.map { $0 - (floor ?? $0) >= Self.freedBytes } ?? false
        guard pending || grown else { return false }
        pending = false
        // What this return cannot give back (free memory inside pages still in use) is not
        // asked for again: the next looks lower the floor as far as the return went.
        if let freed { floor = freed }
        return true
    }
}
