/// What the agent tells people, in sentences: the same words in its log, on the dashboard's
/// timeline, in `lmx-status` and `lmx-status --watch`, and as `text` beside each event of
/// `/v1/events`. The codes (kinds, verdicts, route ids) stay in the JSON for programs; these are
/// for people, and never carry an errno number, a verdict's code or a phrase twice.
public enum EventWords {
    /// A route as a sentence names it: its server's name and the way to it.
    public struct Place: Sendable, Hashable {
        public var name: String
        public var via: Via

        public init(name: String, via: Via) {
            self.name = name
            self.via = via
        }

        /// "Studio on the LAN", "Studio through its tunnel".
        public var words: String { "\(name) \(via == .wan ? "through its tunnel" : "on the LAN")" }
        /// "on the LAN to Studio", "through the tunnel to Studio": where requests go.
        public var requestsGo: String { "\(via == .wan ? "through the tunnel" : "on the LAN") to \(name)" }
    }

    /// A verdict as the first words of a reason: "not answering", "answers but is not ready".
    public static func phrase(_ verdict: HealthVerdict) -> String {
        switch verdict {
        case .ready: "ready"
        case .aliveNotReady: "answers but is not ready"
        case .overloaded: "busy"
        case .authRejected: "refused the keys"
        case .tunnelDown: "its tunnel is down"
        case .wrongService: "another service answers there"
        case .down: "not answering"
        }
    }

    /// A verdict as what a sentence says its route does: "Studio on the LAN is not answering".
    public static func predicate(_ verdict: HealthVerdict) -> String {
        switch verdict {
        case .ready: "is ready"
        case .aliveNotReady: "answers but is not ready"
        case .overloaded: "is busy"
        case .authRejected: "refused the keys it was given"
        case .tunnelDown: "cannot be reached: its tunnel is down"
        case .wrongService: "is not the server expected: another service answers there"
        case .down: "is not answering"
        }
    }

    /// A verdict in a word or two, for a badge or a table's column.
    public static func label(_ verdict: HealthVerdict?) -> String {
        switch verdict {
        case nil: "not probed yet"
        case .ready: "ready"
        case .aliveNotReady: "no model loaded"
        case .overloaded: "busy"
        case .authRejected: "key refused"
        case .tunnelDown: "tunnel down"
        case .wrongService: "not an LMX server"
        case .down: "down"
        }
    }

    /// What a reason says past its verdict: "not answering: connection refused" with `down` is
    /// "connection refused"; "ready" with `ready` is nothing. Reasons recorded by older versions
    /// ("down: connection refused") read the same.
    public static func detail(_ reason: String, verdict: HealthVerdict?) -> String {
        var text = reason.trimmingASCIIWhitespace()
        guard let verdict else { return text }
        for lead in [phrase(verdict), verdict.rawValue] {
            if text == lead { return "" }
            if text.hasPrefix(lead + ": ") { text = String(text.dropFirst(lead.count + 2)) }
        }
        return text
    }

    /// The route's situation in a sentence's words: "Studio on the LAN is not answering (timed out)".
    public static func situation(_ place: Place, _ verdict: HealthVerdict, detail: String?) -> String {
        situation(place.words, verdict, detail: detail)
    }

    static func situation(_ subject: String, _ verdict: HealthVerdict, detail: String?) -> String {
        let rest = detail.map { Self.detail($0, verdict: verdict) } ?? ""
        let base = "\(subject) \(predicate(verdict))"
        return rest.isEmpty || base.contains(rest) ? base : "\(base) (\(rest))"
    }

    /// Where a found route came from, as the timeline says it.
    static func foundBy(_ source: String) -> String? {
        switch source {
        case RouteSource.mdns.rawValue: "announced on the LAN"
        case RouteSource.pairing.rawValue: "from a pairing"
        case RouteSource.manual.rawValue: "from the configuration"
        case RouteSource.remembered.rawValue: "remembered from before"
        default: nil
        }
    }

    /// One event of the history as a sentence. `place` names a route by its id (from the
    /// agent's state, or the event's own route); a route it no longer knows is "a server".
    public static func sentence(
        kind: String, routeID: String?, to: String?, reason: String, place: (String) -> Place?
    ) -> String {
        let here = routeID.flatMap(place)
        let reason = reason.trimmingASCIIWhitespace()
        func with(_ lead: String, _ why: String) -> String {
            finished(why.isEmpty ? lead : "\(lead): \(why)")
        }
        switch kind {
        case "health":
            let verdict = to.flatMap(HealthVerdict.init(rawValue:))
            let subject = here?.words ?? "A server"
            guard let verdict else { return with("\(subject) changed", reason) }
            return finished(situation(subject, verdict, detail: reason))
        case "active":
            guard to != nil else { return with("No server is usable now", reason) }
            return with("Requests now go \(here?.requestsGo ?? "to another server")", reason)
        case "candidate-added":
            // The name it was found by; the way to it too, unless "announced on the LAN" says it.
            let (source, name) = labelled(reason)
            let by = foundBy(String(source)).map { " (\($0))" } ?? ""
            let named = name.isEmpty ? "a server" : String(name)
            let what =
                source == Substring(RouteSource.mdns.rawValue)
                ? named : here.map { Place(name: named, via: $0.via).words } ?? named
            return "Found \(what)\(by)."
        case "candidate-removed":
            return with("\(here?.words ?? "A server") is no longer followed", reason)
        case "impostor":
            return with("Refused a machine on the LAN", reason)
        case "pairing-added":
            return finished("Paired with \(orServer(labelled(reason).1))")
        case "pairing-updated":
            return finished("The pairing with \(orServer(labelled(reason).1)) was updated")
        case "pairing-removed":
            return finished("The pairing with \(orServer(Substring(reason))) was removed")
        case "pairing-expired":
            return "A pairing expired: pair again with a fresh code (lmx-pair)."
        case "network":
            return with("This machine’s network changed", reason)
        case "wake":
            return with("This machine woke from sleep", reason)
        default:
            return with(kind, reason)
        }
    }

    /// mDNS discovery's state (`avahi` in `/v1/status`) as a sentence.
    public static func discovery(_ name: String, detail: String?) -> String {
        let why = detail.map { $0.trimmingASCIIWhitespace() }.flatMap { $0.isEmpty ? nil : $0 }
        let text: String =
            switch name {
            case "running": "mDNS discovery is running: servers announced on the LAN are found"
            case "waiting": "mDNS discovery is waiting for avahi-daemon" + (why.map { ": \($0)" } ?? "")
            case "reconnecting": "mDNS discovery lost avahi-daemon and is connecting again"
            case "disabled": "mDNS discovery is turned off in the configuration"
            case "stopped": "mDNS discovery stopped"
            case "failed": "mDNS discovery failed" + (why.map { ": \($0)" } ?? "")
            default: "mDNS discovery is \(name)" + (why.map { ": \($0)" } ?? "")
            }
        return finished(text)
    }

    /// "what: name" as the agent records a found server or a pairing.
    static func labelled(_ reason: String) -> (Substring, Substring) {
        guard let colon = reason.firstRange(of: ": ") else { return ("", reason[...]) }
        return (reason[..<colon.lowerBound], reason[colon.upperBound...])
    }

    static func orServer(_ name: Substring) -> Substring { name.isEmpty ? "a server" : name }

    /// Ends a sentence with a full stop unless it ends with one already.
    static func finished(_ text: String) -> String {
        guard let last = text.last else { return text }
        return ".!?".contains(last) ? text : text + "."
    }
}

extension StatusAPI.WatchLine {
    /// The change as a sentence for people (`lmx-status --watch`), the words of the timeline;
    /// nil for snapshots and heartbeats. Names are as servers sent them: print them with
    /// ``ServerTable/printable(_:)``.
    public var sentence: String? {
        let reason = reason ?? ""
        switch type {
        case .active:
            guard let active else {
                return EventWords.sentence(
                    kind: "active", routeID: nil, to: nil, reason: reason, place: { _ in nil })
            }
            let place = EventWords.Place(name: active.name, via: active.via)
            return EventWords.sentence(
                kind: "active", routeID: active.routeID, to: active.routeID, reason: reason,
                place: { _ in place })
        case .health, .candidateAdded, .candidateRemoved:
            guard let route else { return nil }
            let place = EventWords.Place(name: route.name, via: route.via)
            let kind = type == .health ? "health" : type.rawValue
            let said = type == .candidateAdded ? "\(route.source.rawValue): \(route.name)" : reason
            return EventWords.sentence(
                kind: kind, routeID: route.id, to: route.verdict?.rawValue, reason: said,
                place: { _ in place })
        case .avahi:
            return EventWords.discovery(avahi ?? "unknown", detail: reason.isEmpty ? nil : reason)
        case .snapshot, .heartbeat, .unknown:
            return nil
        }
    }
}
