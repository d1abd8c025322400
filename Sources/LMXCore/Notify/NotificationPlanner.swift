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
///   the agent's words for the line's ``Cause`` code (``ownWords(_:)``); the reason's text is
///   never read.
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
    /// Why requests went where they go now, in the agent's words ("" when not told).
    private var currentWords = ""
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
            move(to: place, cause: status.active == nil ? status.noActiveCause : nil, now: now)
            for route in routes where route.trust == .impostor { noteImpostor(route) }
        case .active:
            guard started else { return }
            move(to: place(line.active), cause: line.cause, now: now)
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
            out.append(Self.notice(from: shown, to: current, words: currentWords))
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

    private mutating func move(to place: Place, cause: Cause?, now: Double) {
        guard place != current else { return }
        if place.kind != current.kind { currentSince = now }
        current = place
        currentWords = cause.flatMap(Self.ownWords) ?? ""
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

    static func notice(from: Place, to: Place, words: String) -> DesktopNotice {
        let why = words.isEmpty ? "" : " (\(words))"
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
                body: "No server can take requests now\(words.isEmpty ? "" : ": \(words)"). The agent keeps probing.",
                urgency: .critical, category: "network.error")
        }
    }

    /// Why requests moved, as a notice says it: the words for `cause` when it is something that
    /// went wrong with the route left; nil for a move that is no failure (the first server usable,
    /// a preferred one back) and for a code this version does not know.
    static func ownWords(_ cause: Cause) -> String? {
        switch cause {
        case .firstUsable, .preferred, .reachableAgain, .unknown: nil
        default: words(cause)
        }
    }

    /// Every cause in the agent's own words, as a notice's clause: "(the connection was refused)",
    /// "No server can take requests now: the pairing expired."
    static func words(_ cause: Cause) -> String {
        switch cause {
        case .refused: "the connection was refused"
        case .reset: "the connection was reset"
        case .timedOut: "it did not answer in time"
        case .unreachable, .addressLost: "the host cannot be reached"
        case .blocked: "a firewall on this machine blocks it"
        case .nameUnresolved: "its name does not resolve"
        case .tls: "the secure connection failed"
        case .connectionFailed: "the connection could not be made"
        case .httpStatus: "it answered with an error"
        case .keysRefused: "the server refused the keys"
        case .loginPage: "the tunnel asks for a login: its Access token is missing or stale"
        case .overloaded: "the server is busy"
        case .notReady: "the server is not ready"
        case .tunnelDown: "its tunnel is down"
        case .edgeError: "the tunnel answered with an error page"
        case .captivePortal: "the network asks for a sign-in"
        case .wrongService: "another service answers there"
        case .wrongInstance: "another server answers there"
        case .eventsSilent: "it stopped answering"
        case .linkLost: "this machine lost its link to it"
        case .leftNetwork: "this machine left its network"
        case .configRemoved: "its route was removed"
        case .pairingRemoved: "its pairing was removed"
        case .pairingExpired: "the pairing expired"
        case .unvouched: "its tunnel no longer vouches for it"
        case .forgotten: "it is no longer announced"
        case .firstUsable: "the first server usable"
        case .preferred: "a preferred route is usable"
        case .reachableAgain: "it is reachable again"
        case .impostor: "a machine claims to be it"
        case .untrusted: "the trust policy does not allow it"
        case .keyMissing: "the route carries no inference key"
        case .unknown: "for a reason this version does not know"
        }
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
