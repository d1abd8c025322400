import Dispatch
import LMXCore
import LMXSystem
import Logging
import Synchronization

/// `endpoint.env` beside the socket (`/run/lmx/endpoint.env` for the system agent): the active
/// endpoint as `KEY='value'` lines that a shell can `source` and systemd can read with
/// `EnvironmentFile=`. Rewritten atomically (a new file renamed over the old one) on every change,
/// so a reader sees the old file or the new one, never half of one. It holds no secret.
public struct EndpointFile: Sendable {
    public let path: String

    public init(path: String) {
        self.path = path
    }

    /// The directory holding the file.
    public var directory: String { FileSystem.directory(of: path) }

    /// The file beside a socket path.
    public static func beside(socket: String) -> EndpointFile {
        EndpointFile(path: EndpointFile(path: socket).directory + "/endpoint.env")
    }

    /// The file's text for an active endpoint, or for none.
    public static func render(_ active: StatusAPI.Active?, reason: String?, gateway: String? = nil, updated: String)
        -> String
    {
        var lines = ["# lmx-agentd's active endpoint; rewritten on every change. No secrets."]
        func add(_ key: String, _ value: String?) {
            // Values come partly from the network (an instance id): anything that could end the
            // quoting or hide in a terminal is left out rather than escaped.
            guard let value, value.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F && $0 != 0x27 && $0 != 0x5C }) else {
                lines.append("\(key)=''")
                return
            }
            lines.append("\(key)='\(value)'")
        }
        add("LMX_ACTIVE", active == nil ? "0" : "1")
        add("LMX_BASE_URL", active?.baseURL ?? "")
        add("OPENAI_BASE_URL", active?.openAIBaseURL ?? "")
        add("LMX_VIA", active?.via.rawValue ?? "")
        add("LMX_INSTANCE_ID", active?.instanceID ?? "")
        add("LMX_ROUTE_ID", active?.routeID ?? "")
        add("LMX_REASON", active == nil ? (reason ?? "") : "")
        // The gateway's fixed URL: follows failover and adds the route's credentials.
        add("LMX_GATEWAY_URL", gateway ?? "")
        add("LMX_UPDATED", updated)
        return lines.joined(separator: "\n") + "\n"
    }

    /// Writes `text` to a new file (never following or reusing an existing one) and renames it
    /// over the old. Returns an error description, or nil.
    @discardableResult
    public func write(_ text: String) -> String? {
        do {
            try FileSystem.writeAtomically(Array(text.utf8), to: path, mode: 0o644)
            return nil
        } catch {
            return error.description
        }
    }

    /// Removes the file (at a clean stop: no daemon, no answer).
    public func remove() { FileSystem.remove(path) }
}

/// Keeps `endpoint.env` in step with the active endpoint and the gateway; removes it at a clean
/// stop (no daemon, no answer). The text is made on the manager's executor (cheap) and written on
/// a serial queue of its own: the manager never waits on the file system, and a burst of changes
/// writes the newest text once.
public final class EndpointFileWriter: AgentEventSink {
    let file: EndpointFile
    private let logger: Logger
    private let failing = Mutex(false)
    private let queue = DispatchQueue(label: "lmx.endpoint-file")
    /// The newest text not yet written.
    private let pending = Mutex<String?>(nil)

    public init(file: EndpointFile, logger: Logger) {
        self.file = file
        self.logger = logger
    }

    public func receive(_ events: [AgentEvent], snapshot: AgentSnapshot, now: Double) {
        let relevant = events.contains {
            switch $0 {
            case .activeChanged, .configured: true
            default: false
            }
        }
        guard relevant else { return }
        write(snapshot, now: now)
    }

    /// Writes the file for `snapshot` (at start, and when the gateway's address is known).
    public func write(_ snapshot: AgentSnapshot, now: Double) {
        let active = snapshot.activeEndpoint(now: now)
        let text = EndpointFile.render(
            active, reason: active == nil ? snapshot.noActiveReason : nil, gateway: snapshot.gateway?.openAIBaseURL,
            updated: snapshot.iso(now))
        let queued = pending.withLock { pending in
            defer { pending = text }
            return pending != nil
        }
        guard !queued else { return }  // a write is queued: it takes the newest text
        queue.async { self.writePending() }
    }

    private func writePending() {
        guard
            let text = pending.withLock({ pending in
                defer { pending = nil }
                return pending
            })
        else { return }
        let problem = file.write(text)
        let first = failing.withLock { failing in
            defer { failing = problem != nil }
            return problem != nil && !failing
        }
        if first, let problem { logger.warning("\(problem)") }
    }

    /// Waits for the queued write, then removes the file.
    public func remove() {
        queue.sync {
            pending.withLock { $0 = nil }
            file.remove()
        }
    }

    /// Waits until the newest text is written (tests).
    func flush() { queue.sync {} }
}
