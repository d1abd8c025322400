import LMXCore
import Logging

/// The log lines for what happens (inputs log their own notes where they are handled).
public struct EventLog: AgentEventSink {
    let logger: Logger

    public init(logger: Logger) { self.logger = logger }

    public func receive(_ events: [AgentEvent], snapshot: AgentSnapshot, now: Double) {
        for event in events {
            switch event {
            case .routeAdded(let state, let quiet):
                if !quiet {
                    logger.info(
                        "endpoint added",
                        metadata: ["route": "\(state.id)", "source": "\(state.route.source.rawValue)"])
                }
            case .routeRemoved(let state, let reason):
                logger.info("endpoint removed: \(reason)", metadata: ["route": "\(state.id)"])
            case .healthChanged(let state, let from, let reason):
                logger.info(
                    "health \(from?.rawValue ?? "unknown") → \(state.verdict?.rawValue ?? "unknown")",
                    metadata: ["route": "\(state.id)", "reason": "\(reason)"])
            case .activeChanged(let from, let to, let reason):
                if let to {
                    logger.notice(
                        "active endpoint: \(to.route.baseURL) via \(to.route.via.rawValue)",
                        metadata: ["route": "\(to.id)", "reason": "\(reason)", "previous": "\(from?.id ?? "none")"])
                } else {
                    logger.warning(
                        "no usable endpoint", metadata: ["reason": "\(reason)", "previous": "\(from?.id ?? "none")"])
                }
            case .impostor(let state, let owner, let why):
                logger.warning(
                    "an announced server \(why): never used, never sent a key",
                    metadata: ["route": "\(state.id)", "owner": "\(ServerTable.printable(owner))"])
            case .vouchesChanged(let tunnelID, let urls, _):
                logger.info(
                    "the tunnel vouches for LAN addresses",
                    metadata: [
                        "route": "\(tunnelID)", "addresses": "\(urls.isEmpty ? "none" : urls.joined(separator: " "))",
                    ])
            case .pairing(let change, let id, _, let routes):
                let text: String =
                    switch change {
                    case .added: "pairing imported"
                    case .updated: "pairing updated"
                    case .removed: "pairing removed"
                    case .expired: "pairing expired; its routes are no longer used"
                    }
                var metadata: Logger.Metadata = ["pairing": "\(id)"]
                if !routes.isEmpty { metadata["routes"] = "\(routes.sorted().joined(separator: " "))" }
                logger.notice("\(text)", metadata: metadata)
            case .discoveryChanged(let state):
                logger.info("avahi-daemon \(state.name)\(state.detail.map { ": \($0)" } ?? "")")
            case .machine(let change, let detail):
                logger.notice("\(change == .wake ? "woke from sleep" : "this machine's network changed"): \(detail)")
            case .serverSeen, .probed, .announcementIgnored, .serverEventReceived, .configured:
                break
            }
        }
    }
}
