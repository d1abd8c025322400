import LMXCore

#if canImport(Glibc)
import Glibc
#endif

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
    public var directory: String {
        path.lastIndex(of: "/").map { String(path[..<$0]) } ?? "."
    }

    /// The file beside a socket path.
    public static func beside(socket: String) -> EndpointFile {
        EndpointFile(path: EndpointFile(path: socket).directory + "/endpoint.env")
    }

    /// The file's text for an active endpoint, or for none.
    public static func render(_ active: StatusAPI.Active?, reason: String?, gateway: String? = nil, updated: String) -> String {
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
        let temporary = path + ".tmp-\(getpid())"
        unlink(temporary)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return "cannot create \(temporary): \(String(cString: strerror(errno)))" }
        fchmod(fd, 0o644)  // whatever the umask
        var bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeMutableBytes { Glibc.write(fd, $0.baseAddress! + offset, $0.count - offset) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else {
                let reason = String(cString: strerror(errno))
                close(fd)
                unlink(temporary)
                return "cannot write \(temporary): \(reason)"
            }
            offset += n
        }
        close(fd)
        guard rename(temporary, path) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(temporary)
            return "cannot replace \(path): \(reason)"
        }
        return nil
    }

    /// Removes the file (at a clean stop: no daemon, no answer).
    public func remove() {
        unlink(path)
    }
}
