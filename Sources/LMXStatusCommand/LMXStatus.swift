import ArgumentParser
import LMXCore
import LMXStatusClient
import LMXSystem

public struct LMXStatus: ParsableCommand {
    public init() {}

    public static let configuration = CommandConfiguration(
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
    public static func main() {
        start(Array(CommandLine.arguments.dropFirst()))
    }

    /// Runs with `arguments` (the multi-call binary's entry).
    public static func start(_ arguments: [String]) {
        var arguments = arguments
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
        // The common short forms (`--url`, `--json`, `--socket P`) skip the argument parser's
        // reflection, a third of the command's start-up; anything else, or anything invalid, goes
        // through it, so help, errors and their exit codes are the parser's own.
        if let request = StatusRequest(quick: arguments), (try? request.validate()) != nil {
            request.runAndExit()
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
        help: ArgumentHelp(
            "The best usable endpoint that has this model loaded (with --url: only its URL).", valueName: "name"))
    var model: String?

    @Flag(
        name: .long,
        help: "Each route's last day as a ribbon of characters (with --json: /v1/history's answer).")
    var history = false

    @Option(
        name: .long,
        help: ArgumentHelp(
            "With --history: how far back (1h, 24h, 7d; at most 8d), or an ISO 8601 time.", valueName: "duration"))
    var since: String?

    @Option(name: .long, help: ArgumentHelp("The agent's socket.", valueName: "path"))
    var socket: String?

    /// What was asked, as plain values.
    var request: StatusRequest {
        StatusRequest(
            url: url, json: json, watch: watch, wait: wait, model: model, socket: socket, history: history,
            since: since)
    }

    public func validate() throws { try request.validate() }

    public func run() throws { try request.run() }
}

/// One invocation of lmx-status as plain values: what the argument parser produced, or what the
/// quick parse of the common short forms did.
struct StatusRequest: Equatable {
    var url = false
    var json = false
    var watch = false
    var wait: Double?
    var model: String?
    var socket: String?
    var history = false
    var since: String?

    func validate() throws(ValidationError) {
        if history && (url || watch || wait != nil || model != nil) {
            throw ValidationError("--history goes alone or with --json and --since")
        }
        if since != nil && !history { throw ValidationError("--since goes with --history") }
        if let since, since.isEmpty || since.utf8.count > 64 {
            throw ValidationError("--since takes a duration (24h, 7d) or an ISO 8601 time")
        }
        if url && json { throw ValidationError("--url and --json cannot be used together") }
        if url && watch { throw ValidationError("--url and --watch cannot be used together") }
        if wait != nil && watch { throw ValidationError("--wait and --watch cannot be used together") }
        if model != nil && watch { throw ValidationError("--model and --watch cannot be used together") }
        if let model, model.isEmpty || model.utf8.count > 256 {
            throw ValidationError("--model takes a model name (1 to 256 bytes)")
        }
        if let wait, !(wait >= 0 && wait <= 86_400) { throw ValidationError("--wait takes 0 to 86400 seconds") }
    }

    /// Runs outside the argument parser and exits with the command's code.
    func runAndExit() -> Never {
        do {
            try run()
            ProcessLimits.exit(ExitStatus.success.rawValue)
        } catch let code as ExitCode {
            ProcessLimits.exit(code.rawValue)
        } catch {
            LMXStatus.exit(withError: error)
        }
    }

    func run() throws {
        let uid = Users.effective
        let resolved = RuntimeDirectory.clientPaths(uid: uid, environment: ProcessEnvironment.current)
        var path = resolved.paths.socket
        if let socket {
            path = socket
        } else if let warning = resolved.warning {
            Console.error("lmx-status: \(warning)")
            if RuntimeDirectory.fallbackContaining(path, uid: uid) != nil {
                throw ExitCode(ExitStatus.unavailable.rawValue)
            }
        }
        let client = AgentClient(socketPath: path)
        do {
            if watch { return try follow(client) }
            if history { return try printHistory(client) }
            if let wait {
                try waitForEndpoint(client, seconds: wait)
                if !url && !json && model == nil { return Console.out(Self.summary(try client.status().status)) }
            }
            if let model { return try printModel(client, model) }
            if url { return try printURL(client) }
            try printStatus(client)
        } catch let error as StatusClientError {
            Console.error("lmx-status: \(error.description)")
            switch error {
            case .notRunning:
                Console.error(
                    "start it with `systemctl start lmx-agentd` (or run `lmx-agentd` in a terminal); for another socket use --socket or LMX_SOCKET"
                )
            case .forbidden:
                Console.error("ask the administrator, or run lmx-agentd as your own user")
            default:
                break
            }
            throw ExitCode(ExitStatus.unavailable.rawValue)
        }
    }

    /// Polls `/v1/active` until it names an endpoint. Exits 1 when the time is up with the
    /// agent answering "none", and rethrows (69) when the agent never answered at all.
    private func waitForEndpoint(_ client: AgentClient, seconds: Double) throws {
        let deadline = SystemClock.monotonic() + seconds
        var answered = false
        var reason = "unknown"
        while true {
            do {
                let answer = try client.active()
                answered = true
                if answer.active != nil { return }
                reason = answer.reason
            } catch {
                if case .forbidden = error { throw error }
                // Not running yet (boot): keep waiting; if it never answers, say so at the end.
                if SystemClock.monotonic() >= deadline && !answered { throw error }
            }
            let left = deadline - SystemClock.monotonic()
            if left <= 0 {
                Console.error(
                    "lmx-status: no server usable after \(seconds == seconds.rounded() ? "\(Int(seconds))" : "\(seconds)") s: \(ServerTable.printable(reason))"
                )
                throw ExitCode(ExitStatus.nothingFound.rawValue)
            }
            SystemClock.sleep(seconds: min(left, 0.1))
        }
    }

    private func printModel(_ client: AgentClient, _ model: String) throws {
        let answer: (resolved: StatusAPI.Resolved, json: [UInt8])
        do { answer = try client.resolve(model: model) } catch .answered(let status, let reason) {
            Console.error("lmx-status: \(ServerTable.printable(reason))")
            throw ExitCode((status == 404 ? ExitStatus.unavailable : .nothingFound).rawValue)
        }
        let resolved = answer.resolved
        if json {
            Console.out(String(decoding: answer.json, as: UTF8.self).trimmingNewline)
        } else if let endpoint = resolved.endpoint {
            Console.out(
                url
                    ? endpoint.baseURL
                    : "\(ServerTable.printable(model)): \(EventWords.Place(name: ServerTable.printable(endpoint.name), via: endpoint.via).words) at \(endpoint.baseURL): \(ServerTable.printable(resolved.reason))"
            )
        }
        guard resolved.endpoint != nil else {
            if !json {
                Console.error(
                    "lmx-status: no endpoint for \(ServerTable.printable(model)): \(ServerTable.printable(resolved.reason))"
                )
            }
            throw ExitCode(ExitStatus.nothingFound.rawValue)
        }
    }

    /// The ribbons of `--history`, or its JSON; a window the agent refuses is a usage error (64).
    private func printHistory(_ client: AgentClient) throws {
        let answer: Result<(history: StatusAPI.History, json: [UInt8]), StatusClientError>
        do { answer = .success(try client.history(since: since ?? "24h")) } catch { answer = .failure(error) }
        switch answer {
        case .failure(.answered(let status, let reason)):
            Console.error("lmx-status: \(ServerTable.printable(reason))")
            throw ExitCode(status == 400 ? ExitCode.validationFailure.rawValue : ExitStatus.unavailable.rawValue)
        case .failure(let error):
            throw error
        case .success(let (history, raw)):
            if json { return Console.out(String(decoding: raw, as: UTF8.self).trimmingNewline) }
            let routes = history.routes.count
            Console.out("From \(history.since) to \(history.until), \(routes) route\(routes == 1 ? "" : "s"):")
            for line in HistoryRibbon.render(history) { Console.out(line) }
        }
    }

    private func printURL(_ client: AgentClient) throws {
        let answer = try client.active()
        guard let active = answer.active else {
            Console.error("lmx-status: no server is usable now: \(ServerTable.printable(answer.reason))")
            throw ExitCode(ExitStatus.nothingFound.rawValue)
        }
        Console.out(active.baseURL)
    }

    private func printStatus(_ client: AgentClient) throws {
        let (status, raw) = try client.status()
        if json {
            Console.out(String(decoding: raw, as: UTF8.self).trimmingNewline)
        } else {
            Console.out(Self.summary(status))
            let rows: [[String]] = status.candidates.flatMap { candidate in candidate.routes.map(Self.row) }
            if !rows.isEmpty {
                Console.out("")
                Console.out(
                    TextTable.render(
                        headers: ["  NAME", "VIA", "SOURCE", "URL", "STATE", "LATENCY", "WHY"], rows: rows))
            }
            if let findings = status.discoveryFindings, !findings.isEmpty {
                Console.out("")
                Console.out(Self.findings(findings))
            }
        }
        if status.active == nil { throw ExitCode(ExitStatus.nothingFound.rawValue) }
    }

    /// Why discovery finds nothing usable: the agent's discovery checks, as `lmx-discover --doctor`
    /// says them.
    static func findings(_ findings: [DoctorFinding]) -> String {
        var lines = ["Why nothing is found (the agent's discovery checks; `lmx-discover --doctor` says more):"]
        for finding in findings {
            let scope = [finding.interface.map { "on \($0)" }, finding.server].compactMap { $0 }.map {
                ServerTable.printable($0)
            }.joined(separator: ", ")
            lines.append(
                "* \(finding.cause.rawValue)\(scope.isEmpty ? "" : " (\(scope))"): \(ServerTable.printable(finding.says))"
            )
            lines.append("  Next: \(ServerTable.printable(finding.next))")
        }
        return lines.joined(separator: "\n")
    }

    static func row(_ route: StatusAPI.RouteStatus) -> [String] {
        let marker = route.active ? "* " : "  "
        let latency = route.latencyMS.map { "\(($0 * 10).rounded() / 10) ms" } ?? "-"
        let source =
            route.foundBy.map { "\(route.source.rawValue) (\(ServerTable.printable($0)))" } ?? route.source.rawValue
        return [
            marker + ServerTable.printable(route.name), route.via == .wan ? "tunnel" : "LAN", source,
            route.baseURL, EventWords.label(route.verdict), latency, ServerTable.printable(route.reason),
        ]
    }

    /// The first line: where requests go and why, then discovery, trust and the gateway.
    static func summary(_ status: StatusAPI.Status) -> String {
        var trust = status.trust.map { " Trust: \($0)." } ?? ""
        if let prefer = status.prefer, !prefer.isEmpty {
            trust += " Prefer: \(prefer.map { ServerTable.printable($0) }.joined(separator: ", "))."
        }
        if let gateway = status.gateway?.openAIBaseURL { trust += " Gateway: \(gateway)." }
        if let problem = status.gateway?.problem { trust += " Gateway: \(ServerTable.printable(problem))." }
        let mdns = " mDNS: \(status.avahi)."
        guard let active = status.active else {
            let why = ServerTable.printable(status.noActiveReason ?? "unknown")
            return "No server is usable now: \(why.hasSuffix(".") ? String(why.dropLast()) : why).\(mdns)\(trust)"
        }
        let place = EventWords.Place(name: ServerTable.printable(active.name), via: active.via)
        return
            "Active: \(place.words) at \(active.baseURL), \(EventWords.label(active.verdict)) since \(active.since).\(mdns)\(trust)"
    }

    /// Follows `/v1/watch`; when the daemon goes away (a restart), waits for it and follows the
    /// new one from a fresh snapshot. Fails with 69 only if it is not running at the start.
    private func follow(_ client: AgentClient) throws {
        var connected = false
        while true {
            do {
                try client.watch { line, bytes in
                    connected = true
                    if json {
                        Console.out(String(decoding: bytes, as: UTF8.self))
                    } else if let line, let text = Self.describe(line) {
                        Console.out(text)
                    }
                    return true
                }
                Console.error("lmx-status: lmx-agentd closed the stream; waiting for it to come back")
            } catch {
                guard connected else { throw error }
                if case .protocolError = error { Console.error("lmx-status: \(error.description); reconnecting") }
            }
            SystemClock.sleep(seconds: 0.5)
        }
    }

    static func describe(_ line: StatusAPI.WatchLine) -> String? {
        if line.type == .snapshot { return line.status.map { "\(line.at) \(summary($0))" } }
        return line.sentence.map { "\(line.at) \(ServerTable.printable($0))" }
    }
}

// In an extension, so the memberwise initializer stays (what the argument parser's values fill).
extension StatusRequest {
    /// Parses only `--url`, `--json`, `--socket PATH` and `--socket=PATH`, each at most once; nil
    /// for anything else (the argument parser then handles it).
    init?(quick arguments: [String]) {
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            if argument == "--url", !url {
                url = true
            } else if argument == "--json", !json {
                json = true
            } else if argument == "--socket", socket == nil, index + 1 < arguments.count,
                let value = arguments[index + 1].first, value != "-"
            {
                socket = arguments[index + 1]
                index += 1
            } else if argument.hasPrefix("--socket="), socket == nil, argument.utf8.count > 9 {
                socket = String(argument.dropFirst(9))
            } else {
                return nil
            }
            index += 1
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
