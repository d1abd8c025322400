import ArgumentParser
import Dispatch
import LMXBus
import LMXCore
import LMXStatusClient
import LMXSystem
import Synchronization

/// `lmx-notify`: desktop notifications of what the agent does, for the person at this desktop.
/// Runs in the user's session (a `systemd --user` unit wanted by `graphical-session.target`),
/// follows the agent's change stream over its socket, and posts through the session bus's
/// notification server. Decisions are ``NotificationPlanner``'s.
public struct LMXNotify: ParsableCommand {
    public init() {}

    public static let configuration = CommandConfiguration(
        commandName: "lmx-notify",
        abstract: "Desktop notifications when lmx-agentd switches between the LAN and the tunnel.",
        discussion: """
            Follows lmx-agentd's change stream and tells, through the desktop's notification \
            server (org.freedesktop.Notifications on the session bus): switched to the tunnel and \
            why, back home on the LAN, no server usable, an impostor refused, a pairing about to \
            expire. Quiet at start; one notification per kind, replaced in place; at most one \
            per --interval while a route flaps. Clicking it opens the dashboard.

            Enable it for your desktop sessions:

              systemctl --user enable --now lmx-notify

            Exit codes: 0 stopped (a signal, or the session ended), 64 usage error, 69 no \
            session bus or notification server.
            """,
        version: StatusAPI.version)

    @Option(
        name: .long,
        help: ArgumentHelp("The agent's socket (default: your agent's, else the system agent's).", valueName: "path"))
    var socket: String?

    @Option(
        name: .long, help: ArgumentHelp("Least seconds between two notifications of one kind.", valueName: "seconds"))
    var interval: Double = 30

    @Option(name: .long, help: ArgumentHelp("Warn of a pairing this many hours before it expires.", valueName: "hours"))
    var expiryWarning: Double = 72

    @Option(
        name: .long,
        help: ArgumentHelp(
            "The program that opens the dashboard's URL when a notification is clicked.", valueName: "program"))
    var openWith = "xdg-open"

    public func validate() throws {
        guard interval.isFinite, interval >= 0, interval <= 86_400 else {
            throw ValidationError("--interval: give seconds from 0 to 86400")
        }
        guard expiryWarning.isFinite, expiryWarning >= 0, expiryWarning <= 24 * 365 else {
            throw ValidationError("--expiry-warning: give hours from 0 to 8760")
        }
        guard !openWith.isEmpty else { throw ValidationError("--open-with: give a program") }
    }

    public func run() throws {
        let bus: DesktopNotifications
        do {
            bus = try DesktopNotifications()
        } catch {
            Console.error("lmx-notify: \(error)")
            Console.error("run it in your desktop session: systemctl --user start lmx-notify")
            throw ExitCode(ExitStatus.unavailable.rawValue)
        }
        let uid = Users.effective
        let resolved = RuntimeDirectory.clientPaths(uid: uid, environment: ProcessEnvironment.current)
        if socket == nil, let warning = resolved.warning { Console.error("lmx-notify: \(warning)") }
        let client = AgentClient(socketPath: socket ?? resolved.paths.socket)
        Console.error("lmx-notify: following lmx-agentd at \(client.socketPath)")

        let stop = Atomic<Bool>(false)
        let signals = StopSignals { stop.store(true, ordering: .relaxed) }
        defer { signals.cancel() }
        Spawn.reapAutomatically()
        let inbox = Inbox()
        DispatchQueue(label: "lmx-notify.watch").async { Self.follow(client, into: inbox) }

        var planner = NotificationPlanner(interval: interval, expiryWarning: expiryWarning * 3_600)
        var ids: [DesktopNotice.Topic: UInt32] = [:]
        var nextPairingCheck = 0.0
        while !stop.load(ordering: .relaxed) {
            let now = SystemClock.monotonic()
            let wait = min(max((planner.nextDue() ?? .infinity) - now, 0), 0.2)
            Poll.wait([bus.descriptor], milliseconds: Int32(wait * 1000) + 1)
            let (actions, connected) = bus.drain()
            if !connected {
                Console.error("lmx-notify: the session bus is gone (the session ended); stopping")
                return
            }
            // Clicks on our own notifications only (`drain` keeps no other).
            for _ in actions {
                guard let url = planner.dashboardURL else { continue }
                if !Spawn.detached(openWith, [url]) {
                    Console.error("lmx-notify: could not start \(openWith) to open \(url)")
                }
            }
            for item in inbox.take() {
                switch item {
                case .line(let line): planner.receive(line, now: SystemClock.monotonic())
                case .said(let text): Console.error("lmx-notify: \(text)")
                }
            }
            if planner.hasStarted, now >= nextPairingCheck {
                nextPairingCheck = now + 600
                if let pairings = try? client.pairings() { planner.pairings(pairings, wallNow: SystemClock.realtime()) }
            }
            let due = planner.due(now: SystemClock.monotonic())
            // The gateway's address may have come after the snapshot (its port was busy then).
            if !due.isEmpty, planner.dashboardURL == nil, let status = try? client.status().status {
                planner.gateway(status.gateway)
            }
            for notice in due {
                do {
                    ids[notice.topic] = try bus.notify(
                        appName: "lmx-agent", replacing: ids[notice.topic] ?? 0, icon: "network-server",
                        summary: notice.summary,
                        body: notice.body, actions: planner.dashboardURL == nil ? [] : ["default", "Open dashboard"],
                        urgency: notice.urgency.rawValue, category: notice.category)
                    Console.error("lmx-notify: told: \(notice.summary)")
                } catch {
                    Console.error("lmx-notify: \(error)")
                }
            }
        }
    }

    /// The change stream, for as long as the process lives: after the agent goes away (a
    /// restart), it is followed again from a fresh snapshot once it is back.
    static func follow(_ client: AgentClient, into inbox: Inbox) {
        var waiting = false
        while true {
            var connected = false
            do {
                try client.watch { line, _ in
                    if !connected {
                        connected = true
                        if waiting { inbox.put(.said("lmx-agentd is back")) }
                        waiting = false
                    }
                    if let line, line.type != .heartbeat { inbox.put(.line(line)) }
                    return true
                }
            } catch {
                if !waiting { inbox.put(.said("\(error); waiting for lmx-agentd")) }
                waiting = true
            }
            if connected, !waiting {
                inbox.put(.said("lmx-agentd closed the stream; waiting for it to come back"))
                waiting = true
            }
            SystemClock.sleep(seconds: 1)
        }
    }
}

/// What the watch thread hands to the main loop.
final class Inbox: Sendable {
    enum Item: Sendable {
        case line(StatusAPI.WatchLine)
        case said(String)
    }

    private let items = Mutex<[Item]>([])

    func put(_ item: Item) {
        items.withLock { list in
            // A main loop that stopped taking (it never does for long) does not grow this.
            if list.count < 10_000 { list.append(item) }
        }
    }

    func take() -> [Item] {
        items.withLock { list in
            defer { list.removeAll() }
            return list
        }
    }
}
