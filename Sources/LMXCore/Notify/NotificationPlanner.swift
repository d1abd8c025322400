/// A desktop notification to post (`lmx-notify`): what a person cares about, in words.
public struct DesktopNotice: Sendable, Hashable {
    /// Notices of one topic replace each other in place (one notification, not a pile).
    public enum Topic: String, Sendable, Hashable, CaseIterable {
        /// Where requests go: the LAN, the tunnel, nowhere.
        case route
        case impostor
        case pairing
    }

    /// The `urgency` hint of the Desktop Notifications specification.
    public enum Urgency: UInt8, Sendable, Hashable {
        case low = 0
        case normal = 1
        case critical = 2
    }

    public var topic: Topic
    public var summary: String
    public var body: String
    public var urgency: Urgency
    /// The specification's category (`network.connected`, `network.disconnected`, `network.error`).
    public var category: String

    public init(topic: Topic, summary: String, body: String, urgency: Urgency, category: String) {
        self.topic = topic
        self.summary = summary
        self.body = body
        self.urgency = urgency
        self.category = category
    }
}

/// Decides, from the agent's change stream, which desktop notifications to post and when. Pure:
/// lines and the time come in, notices go out.
///
/// - Quiet at start: the first snapshot is what the person already has; only changes from it are
///   told. (A pairing about to expire is told once per run, start included: it asks for action.)
/// - Where requests go is told when its kind changes (LAN, tunnel, none), at most once per
///   `interval` seconds: a change inside the interval waits for its end and is told then only if
///   it still stands (a route that flaps gives one notice per interval at most, and none when it
///   is back where the person last saw it). "No server usable" waits `noServerGrace` seconds
///   first (a restart or a failover passes through it briefly).
/// - Each impostor (a route claiming a paired server's identity from an address nobody vouches
///   for) is told once; several within an interval make one notice.
/// - Notifications carry only names the user chose (a pairing's, a configured endpoint's) and the
///   agent's own words: desktops make URLs in a body clickable, and an announcer's name, a
///   server's instance id or readiness text is anyone's on the LAN. Why a route failed is told in
///   the agent's words (``ownWords(_:)``), never as the reason's text.
public struct NotificationPlanner: Sendable {
    /// Where requests go, as a person sees it.
    public enum Place: Sendable, Hashable {
        /// The server's name when the user chose it (nil: a server found on the LAN).
        case lan(String?)
        case wan(String?)
        case none

        var kind: Int {
            switch self {
            case .lan: 0
            case .wan: 1
            case .none: 2
            }
        }
    }

    public let interval: Double
    public let noServerGrace: Double
    /// A pairing that expires within this many seconds is told of.
    public let expiryWarning: Double

    private var started = false
    /// What the person last saw (the start, or the last notice).
    private var shown: Place = .none
    private var current: Place = .none
    private var currentReason = ""
    private var currentSince = 0.0
    private var lastPost: [DesktopNotice.Topic: Double] = [:]
    private var impostorsSeen: Set<String> = []
    /// Impostors refused since the last notice of them (told as a number: their names are theirs).
    private var pendingImpostors = 0
    /// The names the user gave the servers they paired, by `instance_id`.
    private var pairedNames: [String: String] = [:]
    private var pairingsWarned: Set<String> = []
    private var pendingPairings: [(name: String, expiresAt: Double)] = []
    /// The dashboard's URL (the gateway's TCP address), when there is one.
    public private(set) var dashboardURL: String?

    public static let maxRemembered = 4096

    public init(interval: Double = 30, noServerGrace: Double = 5, expiryWarning: Double = 3 * 86_400) {
        self.interval = max(interval, 0)
        self.noServerGrace = max(noServerGrace, 0)
        self.expiryWarning = expiryWarning
    }

    /// Whether the first snapshot has come.
    public var hasStarted: Bool { started }

    public mutating func receive(_ line: StatusAPI.WatchLine, now: Double) {
        switch line.type {
        case .snapshot:
            guard let status = line.status else { return }
            gateway(status.gateway)
            let place = place(status.active)
            let routes = status.candidates.flatMap(\.routes)
            if !started {
                started = true
                shown = place
                current = place
                currentSince = now
                for route in routes where route.trust == .impostor { remember(impostor: route.id) }
                return
            }
            // The agent restarted (or the stream was resumed from a snapshot): carry on from it.
            move(to: place, reason: status.noActiveReason ?? routes.first { $0.active }?.reason ?? "", now: now)
            for route in routes where route.trust == .impostor { noteImpostor(route) }
        case .active:
            guard started else { return }
            move(to: place(line.active), reason: line.reason ?? "", now: now)
        case .health, .candidateAdded:
            guard started, let route = line.route, route.trust == .impostor else { return }
            noteImpostor(route)
        case .candidateRemoved, .heartbeat, .avahi, .unknown:
            return
        }
    }

    /// Where the gateway listens (from a snapshot, or `/v1/status` read since): the dashboard is
    /// at its root.
    public mutating func gateway(_ gateway: StatusAPI.Gateway?) {
        if let base = gateway?.openAIBaseURL {
            dashboardURL = base.hasSuffix("/v1") ? String(base.dropLast(2)) : base
        } else {
            dashboardURL = nil
        }
    }

    /// The pairings as the agent lists them, with the real time now (expiry is real time).
    public mutating func pairings(_ list: [PairingSummary], wallNow: Double) {
        pairedNames = [:]
        for pairing in list.prefix(Self.maxRemembered) {
            if let instance = pairing.instance, let name = pairing.name { pairedNames[instance] = Self.printable(name) }
        }
        for pairing in list.prefix(Self.maxRemembered) {
            guard !pairingsWarned.contains(pairing.id), let expires = pairing.expiresAt.flatMap(Timestamp.parse),
                expires - wallNow <= expiryWarning
            else { continue }
            guard pairingsWarned.count < Self.maxRemembered else { return }
            pairingsWarned.insert(pairing.id)
            pendingPairings.append((Self.printable(pairing.name ?? pairing.id), expires - wallNow))
        }
    }

    /// The notices to post now, in order.
    public mutating func due(now: Double) -> [DesktopNotice] {
        var out: [DesktopNotice] = []
        if started, current.kind != shown.kind, let at = routeDue(), now >= at {
            out.append(Self.notice(from: shown, to: current, reason: currentReason))
            shown = current
            lastPost[.route] = now
        }
        if pendingImpostors > 0, now >= (lastPost[.impostor] ?? -.infinity) + interval {
            let count = pendingImpostors
            pendingImpostors = 0
            lastPost[.impostor] = now
            let see = dashboardURL.map { "The dashboard shows them: \($0)" } ?? "lmx-status lists them."
            out.append(
                DesktopNotice(
                    topic: .impostor,
                    summary: count == 1 ? "An impostor was refused" : "\(count) impostors were refused",
                    body: count == 1
                        ? "A machine on the local network claims to be a server you paired, from an address nobody vouches for. It gets no keys and no requests. \(see)"
                        : "Machines on the local network claim to be servers you paired, from addresses nobody vouches for. They get no keys and no requests. \(see)",
                    urgency: .normal, category: "network.error"))
        }
        if !pendingPairings.isEmpty, now >= (lastPost[.pairing] ?? -.infinity) + interval {
            let soon = pendingPairings.sorted { $0.expiresAt < $1.expiresAt }
            pendingPairings.removeAll()
            lastPost[.pairing] = now
            let first = soon[0]
            let when = first.expiresAt <= 0 ? "has expired" : "expires in \(Self.duration(first.expiresAt))"
            out.append(
                DesktopNotice(
                    topic: .pairing,
                    summary: soon.count == 1 ? "Pairing “\(first.name)” \(when)" : "\(soon.count) pairings expire soon",
                    body:
                        "Pair again with a fresh code from the server (lmx-pair pairing.png); without it, the tunnel is not used once it expires.",
                    urgency: first.expiresAt <= 0 ? .critical : .normal, category: "network"))
        }
        return out
    }

    /// When `due` has something next (nil: nothing waits).
    public func nextDue() -> Double? {
        var times: [Double] = []
        if started, current.kind != shown.kind, let at = routeDue() { times.append(at) }
        if pendingImpostors > 0 { times.append((lastPost[.impostor] ?? -.infinity) + interval) }
        if !pendingPairings.isEmpty { times.append((lastPost[.pairing] ?? -.infinity) + interval) }
        return times.min()
    }

    private func routeDue() -> Double? {
        var at = (lastPost[.route] ?? -.infinity) + interval
        if current == .none { at = max(at, currentSince + noServerGrace) }
        return at
    }

    private mutating func move(to place: Place, reason: String, now: Double) {
        guard place != current else { return }
        if place.kind != current.kind { currentSince = now }
        current = place
        currentReason = Self.ownWords(reason) ?? ""
    }

    private mutating func noteImpostor(_ route: StatusAPI.RouteStatus) {
        guard !impostorsSeen.contains(route.id), impostorsSeen.count < Self.maxRemembered else { return }
        remember(impostor: route.id)
        pendingImpostors += 1
    }

    private mutating func remember(impostor id: String) {
        if impostorsSeen.count < Self.maxRemembered { impostorsSeen.insert(id) }
    }

    /// Where requests go, with the server's name only when the user chose it: a configured
    /// endpoint's or a pairing's (its own route, or a LAN route of the server it pairs).
    func place(_ active: StatusAPI.Active?) -> Place {
        guard let active else { return .none }
        let name =
            active.source.isSetUp ? Self.printable(active.name) : active.instanceID.flatMap { pairedNames[$0] }
        return active.via == .lan ? .lan(name) : .wan(name)
    }

    static func notice(from: Place, to: Place, reason: String) -> DesktopNotice {
        let why = reason.isEmpty ? "" : " (\(reason))"
        switch to {
        case .wan(let name):
            let server = name ?? "the server"
            let body =
                from.kind == 0
                ? "The LAN route is not usable\(why). Requests go to \(server) through the tunnel."
                : "Requests go to \(server) through the tunnel\(why)."
            return DesktopNotice(
                topic: .route, summary: "Switched to the tunnel", body: body, urgency: .normal,
                category: "network.disconnected")
        case .lan(let name):
            return DesktopNotice(
                topic: .route, summary: "Back home on the LAN",
                body: name.map { "Requests go to \($0) on the local network again." }
                    ?? "Requests go to a server on the local network again.",
                urgency: .low, category: "network.connected")
        case .none:
            return DesktopNotice(
                topic: .route, summary: "No LMX server usable",
                body: "No server can take requests now\(reason.isEmpty ? "" : ": \(reason)"). The agent keeps probing.",
                urgency: .critical, category: "network.error")
        }
    }

    /// Why a route stopped, in the agent's own words: the first of the causes it knows that the
    /// reason names (its text is never copied: it holds names, ids and readiness text servers
    /// chose). Nil when it names none of them.
    static func ownWords(_ reason: String) -> String? {
        let lower = reason.lowercased()
        let causes: [(needle: String, words: String)] = [
            ("connection refused", "the connection was refused"),
            ("nothing accepts connections", "the connection was refused"),
            ("no way to that network", "the host cannot be reached"),
            ("no address on a network", "the host cannot be reached"),
            ("not answering", "it stopped answering"),
            ("tunnel is down", "its tunnel is down"),
            ("refused the keys", "the server refused the keys"),
            ("is out of reach", "the host cannot be reached"),
            ("is busy", "the server is busy"),
            ("is not ready", "the server is not ready"),
            ("another service answers", "another service answers there"),
            ("connection reset", "the connection was reset"),
            ("timed out", "it did not answer in time"),
            ("host unreachable", "the host cannot be reached"),
            ("no route", "the host cannot be reached"),
            ("name not resolved", "its name does not resolve"),
            ("tls", "the secure connection failed"),
            ("overloaded", "the server is overloaded"),
            ("alive-not-ready", "the server is not ready"),
            ("wrong-service", "another service answers there"),
            ("not opta-lmx", "another service answers there"),
            ("expired", "the pairing expired"),
            ("removed", "its route was removed"),
            ("down", "it stopped answering"),
        ]
        return causes.first { lower.contains($0.needle) }?.words
    }

    /// Server-supplied text as it may appear in a notification: bounded, one line, no markup
    /// (notification servers may read `<b>` and `&` as markup).
    static func printable(_ text: String) -> String {
        var out = ""
        for character in text.prefix(160) {
            switch character {
            case "<": out += "‹"
            case ">": out += "›"
            case "&": out += "+"
            default:
                out.append(
                    character.isNewline || (character.asciiValue.map { $0 < 0x20 || $0 == 0x7F } ?? false)
                        ? " " : character)
            }
        }
        return out
    }

    static func duration(_ seconds: Double) -> String {
        if seconds >= 86_400 * 1.5 { return "\(Int((seconds / 86_400).rounded())) days" }
        if seconds >= 5_400 { return "\(Int((seconds / 3_600).rounded())) hours" }
        return "\(max(1, Int((seconds / 60).rounded()))) minutes"
    }
}
