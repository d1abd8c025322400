import LMXCore
import Logging

/// The log lines for what happens (inputs log their own notes where they are handled).
public struct EventLog: AgentEventSink {
    let logger: Logger

    public init(logger: Logger) { self.logger = logger }

    public func receive(_ events: [AgentEvent], snapshot: AgentSnapshot, now: Double) {
        for event in events {
            // The sentence the timeline shows (names are announcers' words: shown printable).
            let text = event.sentence(in: snapshot).map(ServerTable.printable) ?? ""
            switch event {
            case .routeAdded(let state, let quiet):
                if !quiet {
                    logger.info(
                        "\(text)", metadata: ["route": "\(state.id)", "source": "\(state.route.source.rawValue)"])
                }
            case .routeRemoved(let state, _, let cause):
                logger.info("\(text)", metadata: ["route": "\(state.id)", "cause": "\(cause.rawValue)"])
            case .healthChanged(let state, let from, _, let cause):
                var metadata: Logger.Metadata = [
                    "route": "\(state.id)", "from": "\(from?.rawValue ?? "unknown")",
                    "to": "\(state.verdict?.rawValue ?? "unknown")",
                ]
                if let cause { metadata["cause"] = "\(cause.rawValue)" }
                logger.info("\(text)", metadata: metadata)
            case .activeChanged(let from, let to, _, let cause):
                var metadata: Logger.Metadata = ["previous": "\(from?.id ?? "none")", "cause": "\(cause.rawValue)"]
                if let to {
                    metadata["route"] = "\(to.id)"
                    metadata["url"] = "\(to.route.baseURL)"
                    logger.notice("\(text)", metadata: metadata)
                } else {
                    logger.warning("\(text)", metadata: metadata)
                }
            case .impostor(let state, let owner, _):
                logger.warning(
                    "\(text) It is never used and never sent a key.",
                    metadata: ["route": "\(state.id)", "owner": "\(ServerTable.printable(owner))"])
            case .vouchesChanged(let tunnelID, let urls, _):
                let name = snapshot.place(tunnelID).map { ServerTable.printable($0.name) } ?? "a paired server"
                logger.info(
                    "\(urls.isEmpty ? "The tunnel to \(name) vouches for no LAN address now." : "The tunnel to \(name) vouches for its LAN addresses: they get its keys.")",
                    metadata: [
                        "route": "\(tunnelID)", "addresses": "\(urls.isEmpty ? "none" : urls.joined(separator: " "))",
                    ])
            case .pairing(_, let id, _, let routes):
                var metadata: Logger.Metadata = ["pairing": "\(id)"]
                if !routes.isEmpty { metadata["routes"] = "\(routes.sorted().joined(separator: " "))" }
                logger.notice("\(text)", metadata: metadata)
            case .discoveryChanged(let state):
                logger.info("\(EventWords.discovery(state.name, detail: state.detail.map(ServerTable.printable)))")
            case .machine:
                logger.notice("\(text)")
            case .serverSeen, .probed, .announcementIgnored, .serverEventReceived, .configured:
                break
            }
        }
    }
}
