/// Event streams across a path switch: which streams the gateway opens again by their server's
/// other route, and what becomes of a stream in progress when the agent's state changes.
///
/// A run's event stream (`GET /v1/agents/runs/{id}/events`) sends whole snapshots (the server
/// polls the run and sends all of it whenever it changed), so the same stream opened again on
/// the same server by another route starts with the current snapshot: nothing is lost, and the
/// one the client has already seen is dropped. A chat completion's stream cannot be continued (no
/// server resumes a generation): it ends with the stream-lost event.
public enum StreamContinuation {
    /// The request opens a stream the gateway may open again on its server's other route.
    public static func resumable(method: String, path: String) -> Bool {
        guard method == "GET", path.hasPrefix("/v1/agents/runs/") else { return false }
        let parts = path.split(separator: "/", omittingEmptySubsequences: false)
        // "", "v1", "agents", "runs", id, "events"
        return parts.count == 6 && !parts[4].isEmpty && parts[5] == "events"
    }

    /// Streams opened again for one client's request, at most (a route that fails every time
    /// does not keep it going for ever).
    public static let maxResumes = 8

    /// What becomes of a stream in progress on a route.
    public enum Fate: Sendable, Hashable {
        /// It goes on where it is.
        case stay
        /// The agent knows the route is gone (`pathGone`: this machine left its network, or has
        /// no way to it now; otherwise its probes failed): a stream that can be opened again goes
        /// to its server's other route; another ends now if its path is gone or it went silent.
        case lost(pathGone: Bool)
        /// Its server is now best reached by another route (LAN ⇄ tunnel): a stream that can be
        /// opened again moves there; another stays.
        case moved
    }
}

extension AgentSnapshot {
    /// What becomes of a stream in progress on route `routeID` to server `instance`, by this
    /// state: gone when the route is no longer usable, moved when its server's first route is
    /// another one, else it stays.
    public func streamFate(routeID: String, instance: String?, clientHasKey: Bool) -> StreamContinuation.Fate {
        var first: String?
        if let instance,
            case .forward(let targets) = gatewayPlan(limit: 4, clientHasKey: clientHasKey, server: instance)
        {
            first = targets.first?.routeID
        }
        return streamFate(routeID: routeID, serverFirstRoute: first)
    }

    /// The same, given the first route of the stream's server's plan (nil: none known), as the
    /// gateway has it from its plans made once per state.
    public func streamFate(routeID: String, serverFirstRoute first: String?) -> StreamContinuation.Fate {
        guard let state = planner.routes[routeID] else { return .lost(pathGone: true) }
        guard planner.isUsable(state) else { return .lost(pathGone: state.offNetwork != nil) }
        guard let first else { return .stay }
        return first == routeID ? .stay : .moved
    }
}
