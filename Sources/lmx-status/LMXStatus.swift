import ArgumentParser
import LMXCore
import LMXStatusClient

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Glibc)
import Glibc
#endif

@main
struct LMXStatus: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lmx-status",
        abstract: "Show which Opta LMX endpoint to use now, as lmx-agentd sees it.",
        discussion: """
            With no option: a one-line summary and the table of candidates. With --watch it \
            follows every change, and waits for the daemon across its restarts.

              export OPENAI_BASE_URL="$(lmx-status --url)/v1"

            The socket is /run/lmx/agent.sock for root. Other users ask their own agent at \
            $XDG_RUNTIME_DIR/lmx/agent.sock when it runs, else the system agent at \
            /run/lmx/agent.sock. LMX_SOCKET or --socket override it.

            In scripts and units, wait until an endpoint is usable (like nm-online -t):

              lmx-status --wait=30 --url

            Exit codes: 0 an endpoint is active, 1 none is (with --wait: none became usable in \
            time), 69 lmx-agentd is not running (with --wait: it never answered), 64 usage error.
            """,
        version: StatusAPI.version)

    /// The wait when `--wait` comes without a value, as nm-online's default.
    static let defaultWait = 30.0

    /// `--wait` may come bare (`--wait`, `--wait --url`) or with seconds (`--wait=10`,
    /// `--wait 10`); the argument parser wants a value, so a bare one gets the default.
    static func main() {
        var arguments = Array(CommandLine.arguments.dropFirst())
        var index = 0
        while index < arguments.count {
            if arguments[index] == "--" { break }
            if arguments[index] == "--wait" {
                let next = index + 1 < arguments.count ? arguments[index + 1] : nil
                if next.flatMap(Double.init) == nil {
                    arguments[index] = "--wait=\(Int(defaultWait))"
                }
            }
            index += 1
        }
        main(arguments)
    }

    @Flag(name: .long, help: "Print only the active base URL (append /v1 for OpenAI clients).")
    var url = false

    @Flag(name: .long, help: "Print the full status as JSON (with --watch: the raw NDJSON lines).")
    var json = false

    @Flag(name: .long, help: "Keep running and print every change.")
    var watch = false

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Wait until an endpoint is usable, at most this many seconds (30 when given alone), then act as without it.",
            valueName: "seconds"))
    var wait: Double?

    @Option(
        name: .long,
        help: ArgumentHelp("The best usable endpoint that has this model loaded (with --url: only its URL).", valueName: "name"))
    var model: String?

    @Option(name: .long, help: ArgumentHelp("The agent's socket.", valueName: "path"))
    var socket: String?

    func validate() throws {
        if url && json { throw ValidationError("--url and --json cannot be used together") }
        if url && watch { throw ValidationError("--url and --watch cannot be used together") }
        if wait != nil && watch { throw ValidationError("--wait and --watch cannot be used together") }
        if model != nil && watch { throw ValidationError("--model and --watch cannot be used together") }
        if let model, model.isEmpty || model.utf8.count > 256 { throw ValidationError("--model takes a model name (1 to 256 bytes)") }
        if let wait, !(wait >= 0 && wait <= 86_400) { throw ValidationError("--wait takes 0 to 86400 seconds") }
    }

    func run() throws {
        let resolved = RuntimeDirectory.clientPaths(uid: geteuid(), environment: ProcessInfo.processInfo.environment)
        var path = resolved.paths.socket
        if let socket {
            path = socket
        } else if let warning = resolved.warning {
            Output.error("lmx-status: \(warning)")
            if RuntimeDirectory.fallbackContaining(path, uid: geteuid()) != nil { throw ExitCode(69) }
        }
        let client = StatusClient(socketPath: path)
        do {
            if watch { return try follow(client) }
            if let wait {
                try waitForEndpoint(client, seconds: wait)
                if !url && !json && model == nil {
                    let response = try client.request("GET", "/v1/status")
                    if let status = try? JSONDecoder().decode(StatusAPI.Status.self, from: Data(response.body)) {
                        Output.out(Self.summary(status))
                    }
                    return
                }
            }
            if let model { return try printModel(client, model) }
            if url { return try printURL(client) }
            try printStatus(client)
        } catch let error as StatusClientError {
            switch error {
            case .notRunning:
                Output.error("lmx-status: \(error.description)")
                Output.error("start it with `systemctl start lmx-agentd` (or run `lmx-agentd` in a terminal); for another socket use --socket or LMX_SOCKET")
                throw ExitCode(69)
            case .forbidden:
                Output.error("lmx-status: \(error.description); ask the administrator, or run lmx-agentd as your own user")
                throw ExitCode(69)
            default:
                Output.error("lmx-status: \(error.description)")
                throw ExitCode(69)
            }
        }
    }

    /// Polls `/v1/active` until it names an endpoint. Exits 1 when the time is up with the
    /// agent answering "none", and rethrows (69) when the agent never answered at all.
    private func waitForEndpoint(_ client: StatusClient, seconds: Double) throws {
        let clock = ContinuousClock()
        let deadline = clock.now + .milliseconds(Int64(seconds * 1000))
        var answered = false
        var reason = "unknown"
        while true {
            do {
                let response = try client.request("GET", "/v1/active")
                answered = true
                if response.status == 200 { return }
                reason = (try? JSONDecoder().decode(StatusAPI.ErrorBody.self, from: Data(response.body)))?.reason ?? "HTTP \(response.status)"
            } catch {
                if case .forbidden = error { throw error }
                // Not running yet (boot): keep waiting; if it never answers, say so at the end.
                if clock.now >= deadline && !answered { throw error }
            }
            if clock.now >= deadline {
                Output.error("lmx-status: no usable endpoint after \(Self.seconds(seconds)): \(ServerTable.printable(reason))")
                throw ExitCode(1)
            }
            let left = deadline - clock.now
            try? sleepBlocking(min(left, .milliseconds(100)))
        }
    }

    private static func seconds(_ value: Double) -> String {
        value == value.rounded() ? "\(Int(value)) s" : "\(value) s"
    }

    private func printModel(_ client: StatusClient, _ model: String) throws {
        var query = URLComponents()
        query.queryItems = [URLQueryItem(name: "model", value: model)]
        let response = try client.request("GET", "/v1/resolve" + (query.percentEncodedQuery.map { "?" + $0 } ?? ""))
        guard let resolved = try? JSONDecoder().decode(StatusAPI.Resolved.self, from: Data(response.body)) else {
            let reason = (try? JSONDecoder().decode(StatusAPI.ErrorBody.self, from: Data(response.body)))?.reason ?? "HTTP \(response.status)"
            Output.error("lmx-status: \(ServerTable.printable(reason))")
            throw ExitCode(response.status == 404 ? 69 : 1)
        }
        if json {
            Output.out(String(decoding: response.body, as: UTF8.self).trimmingNewline)
        } else if let endpoint = resolved.endpoint {
            if url {
                Output.out(endpoint.baseURL)
            } else {
                Output.out(
                    "\(ServerTable.printable(model)): \(endpoint.baseURL) via \(endpoint.via.rawValue) (\(ServerTable.printable(endpoint.name))): \(ServerTable.printable(resolved.reason))")
            }
        }
        guard resolved.endpoint != nil else {
            if !json { Output.error("lmx-status: no endpoint for \(ServerTable.printable(model)): \(ServerTable.printable(resolved.reason))") }
            throw ExitCode(1)
        }
    }

    private func printURL(_ client: StatusClient) throws {
        let response = try client.request("GET", "/v1/active")
        if response.status == 200, let active = try? JSONDecoder().decode(StatusAPI.Active.self, from: Data(response.body)) {
            Output.out(active.baseURL)
            return
        }
        let reason = (try? JSONDecoder().decode(StatusAPI.ErrorBody.self, from: Data(response.body)))?.reason ?? "HTTP \(response.status)"
        Output.error("lmx-status: no active endpoint: \(ServerTable.printable(reason))")
        throw ExitCode(1)
    }

    private func printStatus(_ client: StatusClient) throws {
        let response = try client.request("GET", "/v1/status")
        guard response.status == 200, let status = try? JSONDecoder().decode(StatusAPI.Status.self, from: Data(response.body)) else {
            throw StatusClientError.protocolError("HTTP \(response.status) for /v1/status")
        }
        if json {
            Output.out(String(decoding: response.body, as: UTF8.self).trimmingNewline)
        } else {
            Output.out(Self.summary(status))
            let rows: [[String]] = status.candidates.flatMap { candidate in candidate.routes.map(Self.row) }
            if !rows.isEmpty {
                Output.out("")
                Output.out(TextTable.render(headers: ["  NAME", "VIA", "SOURCE", "URL", "VERDICT", "LATENCY", "WHY"], rows: rows))
            }
        }
        if status.active == nil { throw ExitCode(1) }
    }

    static func row(_ route: StatusAPI.RouteStatus) -> [String] {
        let marker = route.active ? "* " : "  "
        let latency = route.latencyMS.map { "\(($0 * 10).rounded() / 10) ms" } ?? "-"
        return [
            marker + ServerTable.printable(route.name), route.via.rawValue, route.source.rawValue, route.baseURL,
            route.verdict?.rawValue ?? "unknown", latency, ServerTable.printable(route.reason),
        ]
    }

    static func summary(_ status: StatusAPI.Status) -> String {
        var trust = status.trust.map { " Trust: \($0)." } ?? ""
        if let prefer = status.prefer, !prefer.isEmpty {
            trust += " Prefer: \(prefer.map { ServerTable.printable($0) }.joined(separator: ", "))."
        }
        if let gateway = status.gateway?.openAIBaseURL { trust += " Gateway: \(gateway)." }
        guard let active = status.active else {
            return "No active endpoint: \(ServerTable.printable(status.noActiveReason ?? "unknown")). mDNS: \(status.avahi).\(trust)"
        }
        return "Active: \(active.baseURL) via \(active.via.rawValue) (\(ServerTable.printable(active.name)), \(active.verdict.rawValue)) since \(active.since). mDNS: \(status.avahi).\(trust)"
    }

    /// Follows `/v1/watch`; when the daemon goes away (a restart), waits for it and follows the
    /// new one from a fresh snapshot. Fails with 69 only if it is not running at the start.
    private func follow(_ client: StatusClient) throws {
        var connected = false
        while true {
            do {
                try followOnce(client) { connected = true }
                Output.error("lmx-status: lmx-agentd closed the stream; waiting for it to come back")
            } catch {
                guard connected else { throw error }
                if case .protocolError = error {
                    Output.error("lmx-status: \(error.description); reconnecting")
                }
            }
            usleep(500_000)
        }
    }

    private func followOnce(_ client: StatusClient, onLine: () -> Void) throws(StatusClientError) {
        try client.stream("/v1/watch") { bytes in
            onLine()
            if json {
                Output.out(String(decoding: bytes, as: UTF8.self))
                return true
            }
            guard let line = try? JSONDecoder().decode(StatusAPI.WatchLine.self, from: Data(bytes)) else { return true }
            switch line.type {
            case "snapshot":
                if let status = line.status { Output.out("\(line.at) \(Self.summary(status))") }
            case "active":
                if let active = line.active {
                    Output.out("\(line.at) active → \(active.baseURL) via \(active.via.rawValue) (\(active.verdict.rawValue)): \(ServerTable.printable(line.reason ?? ""))")
                } else {
                    Output.out("\(line.at) no active endpoint: \(ServerTable.printable(line.reason ?? ""))")
                }
            case "health":
                if let route = line.route {
                    Output.out("\(line.at) \(ServerTable.printable(route.name)) [\(route.via.rawValue)] is \(route.verdict?.rawValue ?? "unknown"): \(ServerTable.printable(line.reason ?? ""))")
                }
            case "candidate-added", "candidate-removed":
                if let route = line.route {
                    let verb = line.type == "candidate-added" ? "added" : "removed"
                    Output.out("\(line.at) \(verb) \(ServerTable.printable(route.name)) \(route.baseURL) (\(route.source.rawValue))")
                }
            case "avahi":
                Output.out("\(line.at) avahi-daemon \(line.avahi ?? "?")\(line.reason.map { ": \(ServerTable.printable($0))" } ?? "")")
            default:
                break
            }
            return true
        }
    }
}

extension String {
    fileprivate var trimmingNewline: String {
        var s = self
        while s.hasSuffix("\n") { s.removeLast() }
        return s
    }
}

/// A blocking sleep for a command-line tool with no event loop.
private func sleepBlocking(_ duration: Duration) throws {
    let (seconds, attoseconds) = duration.components
    guard seconds > 0 || attoseconds > 0 else { return }
    var request = timespec(tv_sec: Int(seconds), tv_nsec: Int(attoseconds / 1_000_000_000))
    var remaining = timespec()
    while nanosleep(&request, &remaining) != 0 && errno == EINTR { request = remaining }
}

enum Output {
    static func out(_ line: String) { write(line + "\n", to: STDOUT_FILENO) }
    static func error(_ line: String) { write(line + "\n", to: STDERR_FILENO) }

    private static func write(_ text: String, to fd: Int32) {
        var text = text
        text.withUTF8 { buffer in
            var offset = 0
            while offset < buffer.count {
                let written = Glibc.write(fd, buffer.baseAddress! + offset, buffer.count - offset)
                if written < 0 && errno == EINTR { continue }
                guard written > 0 else { return }
                offset += written
            }
        }
    }
}
