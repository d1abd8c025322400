import Dispatch

#if canImport(Glibc)
import Glibc
#endif

/// Turns SIGINT and SIGTERM into a call of `handler` (a graceful stop) instead of the default
/// abrupt exit, until cancelled.
public final class StopSignals {
    private let sources: [any DispatchSourceSignal]

    public init(handler: @escaping @Sendable () -> Void) {
        sources = [SIGINT, SIGTERM].map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler(handler: handler)
            source.resume()
            return source
        }
    }

    public func cancel() {
        for source in sources { source.cancel() }
    }
}
