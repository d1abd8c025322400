import LMXCore
import LMXProbe

/// What the manager needs of probing: one route, one verdict. The HTTP prober is the real one;
/// tests of the manager in process give scripted verdicts.
public protocol RouteProber: Sendable {
    /// Probes `route` by the LMX contract within `timeout` seconds (`full`: the whole sequence,
    /// not only the discovery document), a connection attempt giving up after `connectTimeout`
    /// seconds when given; `checkAPI`: `/v1/models` asked too, and who answered it judged.
    func probe(_ route: Route, timeout: Double, full: Bool, connectTimeout: Double?, checkAPI: Bool) async
        -> ProbeReport
    /// Whether the route's host accepts a new connection within `timeout` seconds.
    func connects(_ route: Route, timeout: Double) async -> Bool
}

extension Prober: RouteProber {}
