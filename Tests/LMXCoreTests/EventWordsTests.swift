import Testing

@testable import LMXCore

/// The words people read: the log, the timeline, `lmx-status` and `/v1/events`' `text` all come
/// from ``EventWords``.
@Suite struct EventWordsTests {
    /// Codes and system words no sentence may carry.
    static let forbidden = [
        "→", "alive-not-ready", "auth-rejected", "tunnel-down", "wrong-service", "errno", "socket error",
        "Invalid argument",
        "ECONN", "(lan ", "(wan ", "endpoint",
    ]

    /// A sentence a person reads: starts with a capital, ends with a full stop, carries no code
    /// and says no phrase twice.
    static func check(_ sentence: String, _ context: String = "") {
        // Every name here is capitalised; "mDNS" is spelt so.
        #expect(sentence.first?.isUppercase == true || sentence.hasPrefix("mDNS"), "\(sentence) \(context)")
        #expect(sentence.hasSuffix("."), "\(sentence) \(context)")
        for word in forbidden { #expect(!sentence.contains(word), "\(word) in \(sentence) \(context)") }
        // No phrase of two words or more said twice in a row ("down: down", "ready: ready").
        let parts = sentence.dropLast().split(separator: ":").map { String($0).trimmingASCIIWhitespace().lowercased() }
        for (a, b) in zip(parts, parts.dropFirst()) { #expect(a != b, "\(sentence) repeats \(a)") }
        #expect(!sentence.contains(": :") && !sentence.contains(".."), "\(sentence)")
    }

    @Test("a failover and a return, from the planner's own events: the sentences the timeline and the log show")
    func failoverInSentences() {
        var lanUp = true
        var h = PlannerHarness { id, _ in id.hasPrefix("wan") ? .ready : (lanUp ? .ready : .down) }
        var tunnel = wan("https://t.example.com")
        tunnel.name = "Studio"  // the pairing's name: the LAN route of its server takes it too
        h.add(tunnel)
        h.add(lan("10.0.0.1", name: "Studio"))
        h.run(until: 5)
        lanUp = false
        h.run(until: 20)
        lanUp = true
        h.run(until: 60)
        let snapshot = AgentSnapshot(planner: h.planner, discovery: .running, originWall: 0)
        let agentEvents = AgentEvent.from(h.events, of: h.planner)
        let sentences = agentEvents.compactMap { $0.sentence(in: snapshot) }
        for sentence in sentences { Self.check(sentence) }
        let moves = sentences.filter { $0.hasPrefix("Requests now go") }
        #expect(
            moves.contains {
                $0.hasPrefix("Requests now go through the tunnel to Studio: Studio on the LAN is not answering")
            }, "\(moves)")
        #expect(
            moves.last?.hasPrefix(
                "Requests now go on the LAN to Studio: Studio on the LAN has answered well for 10 s and is preferred to Studio through its tunnel"
            ) == true, "\(moves)")
        #expect(sentences.contains("Studio on the LAN is not answering (scripted)."), "\(sentences)")
        #expect(sentences.contains("Studio on the LAN is ready."), "\(sentences)")
        #expect(sentences.contains("Found Studio (announced on the LAN)."), "\(sentences)")
        // The stored rows read the same once the agent has moved on (the history's `text`).
        for event in agentEvents {
            guard let row = event.record, let said = event.sentence(in: snapshot) else { continue }
            let told = snapshot.told(
                StatusAPI.Event(
                    id: 1, at: "", kind: row.kind, routeID: row.routeID, from: row.from, to: row.to, reason: row.reason)
            )
            #expect(told.text == said)
        }
        // A sentence recorded with the event is kept: the names of then, not of now.
        let kept = snapshot.told(
            StatusAPI.Event(
                id: 1, at: "", kind: "active", routeID: "gone", from: nil, to: "gone", reason: "x", text: "As told."))
        #expect(kept.text == "As told.")
    }

    @Test("each verdict as a sentence, from the planner's reasons and from older versions' (\"down: …\")")
    func verdicts() {
        let studio = EventWords.Place(name: "Studio", via: .lan)
        for verdict in HealthVerdict.allCases {
            for reason in [
                EventWords.phrase(verdict), "\(EventWords.phrase(verdict)): HTTP 503", verdict.rawValue,
                "\(verdict.rawValue): HTTP 503", "",
            ] {
                let sentence = EventWords.sentence(
                    kind: "health", routeID: "r", to: verdict.rawValue, reason: reason,
                    place: { _ in studio })
                Self.check(sentence, reason)
                #expect(sentence.hasPrefix("Studio on the LAN \(EventWords.predicate(verdict))"), "\(sentence)")
                #expect(sentence.contains("HTTP 503") == reason.contains("HTTP 503"), "\(sentence)")
            }
            #expect(!EventWords.label(verdict).contains("-"))
        }
        let tunnel = EventWords.Place(name: "Studio", via: .wan)
        #expect(
            EventWords.situation(tunnel, .tunnelDown, detail: "HTTP 530")
                == "Studio through its tunnel cannot be reached: its tunnel is down (HTTP 530)")
        #expect(EventWords.situation(studio, .down, detail: "not answering") == "Studio on the LAN is not answering")
    }

    @Test("every kind of the history as a sentence; a route the agent no longer knows is \"a server\"")
    func kinds() {
        let known = ["lan-1": EventWords.Place(name: "Studio", via: .lan)]
        func say(_ kind: String, route: String? = nil, to: String? = nil, _ reason: String) -> String {
            EventWords.sentence(kind: kind, routeID: route, to: to, reason: reason, place: { known[$0] })
        }
        let cases: [(String, String)] = [
            (
                say("active", route: "lan-1", to: "lan-1", "the first server usable from here"),
                "Requests now go on the LAN to Studio: the first server usable from here."
            ),
            (say("active", route: "gone", to: "gone", "x"), "Requests now go to another server: x."),
            (say("active", "no server answers"), "No server is usable now: no server answers."),
            (say("candidate-added", route: "lan-1", "pairing: Studio"), "Found Studio on the LAN (from a pairing)."),
            (say("candidate-added", route: "gone", "pairing: Studio"), "Found Studio (from a pairing)."),
            (say("candidate-added", route: "lan-1", "mdns: Studio"), "Found Studio (announced on the LAN)."),
            (say("candidate-added", route: "lan-1", "manual: Lab"), "Found Lab on the LAN (from the configuration)."),
            (
                say("candidate-removed", route: "gone", "its pairing was removed"),
                "A server is no longer followed: its pairing was removed."
            ),
            (
                say(
                    "impostor", route: "x",
                    "it repeats the paired server's instance id from an address nobody vouches for"),
                "Refused a machine on the LAN: it repeats the paired server's instance id from an address nobody vouches for."
            ),
            (say("pairing-added", "v1-token: Studio"), "Paired with Studio."),
            (say("pairing-updated", "lmx-uri: Studio"), "The pairing with Studio was updated."),
            (say("pairing-removed", "Studio"), "The pairing with Studio was removed."),
            (say("pairing-expired", "expired"), "A pairing expired: pair again with a fresh code (lmx-pair)."),
            (say("wake", "resumed after 12 s"), "This machine woke from sleep: resumed after 12 s."),
            (
                say("network", "Studio on the LAN is now reached on-link on eth1 from 10.0.0.2"),
                "This machine’s network changed: Studio on the LAN is now reached on-link on eth1 from 10.0.0.2."
            ),
            (say("health", route: "gone", to: "ready", "ready"), "A server is ready."),
        ]
        for (said, expected) in cases {
            #expect(said == expected)
            Self.check(said)
        }
        #expect(
            EventWords.discovery("running", detail: nil)
                == "mDNS discovery is running: servers announced on the LAN are found.")
        #expect(
            EventWords.discovery("waiting", detail: "avahi-daemon is not running")
                == "mDNS discovery is waiting for avahi-daemon: avahi-daemon is not running.")
        for name in ["running", "waiting", "reconnecting", "disabled", "stopped", "failed", "odd"] {
            Self.check(EventWords.discovery(name, detail: nil))
        }
    }

    @Test("lmx-status --watch lines in the timeline's words")
    func watchLines() {
        let active = StatusAPI.Active(
            baseURL: "https://t.example.com", openAIBaseURL: "https://t.example.com/v1", via: .wan, instanceID: "home",
            name: "Studio", verdict: .ready, since: "", routeID: "wan-1", source: .pairing)
        let moved = StatusAPI.WatchLine(
            type: .active, seq: 1, at: "", active: active, reason: "Studio on the LAN is not answering (timed out)")
        #expect(
            moved.sentence
                == "Requests now go through the tunnel to Studio: Studio on the LAN is not answering (timed out).")
        let none = StatusAPI.WatchLine(type: .active, seq: 2, at: "", reason: "no server answers")
        #expect(none.sentence == "No server is usable now: no server answers.")
        let route = StatusAPI.RouteStatus(
            id: "lan-1", baseURL: "http://10.0.0.1:1234", via: .lan, source: .mdns, name: "Studio", addresses: [],
            announced: true, health: .up, verdict: .aliveNotReady, active: false, reason: "", latencyMS: nil,
            lastProbe: nil, version: nil, models: 0, ready: false, probes: 1, failures: 0, credentials: [],
            pinnedInstance: nil)
        let health = StatusAPI.WatchLine(
            type: .health, seq: 3, at: "", route: route, reason: "answers but is not ready: no models loaded")
        #expect(health.sentence == "Studio on the LAN answers but is not ready (no models loaded).")
        let added = StatusAPI.WatchLine(type: .candidateAdded, seq: 4, at: "", route: route)
        #expect(added.sentence == "Found Studio (announced on the LAN).")
        let avahi = StatusAPI.WatchLine(type: .avahi, seq: 5, at: "", avahi: "reconnecting")
        #expect(avahi.sentence == "mDNS discovery lost avahi-daemon and is connecting again.")
        #expect(StatusAPI.WatchLine(type: .heartbeat, seq: 6, at: "").sentence == nil)
    }

    @Test("why nothing is usable, in the same words: each route's situation, at most five")
    func noActiveReason() {
        var h = PlannerHarness { id, _ in id.hasPrefix("wan") ? .tunnelDown : .down }
        var tunnel = wan("https://t.example.com")
        tunnel.name = "Studio"
        h.add(tunnel)
        h.add(lan("10.0.0.1", name: "Studio"))
        h.run(until: 5)
        let reason = AgentSnapshot(planner: h.planner, discovery: .running, originWall: 0).noActiveReason
        #expect(reason.contains("Studio on the LAN is not answering (scripted)"), "\(reason)")
        #expect(
            reason.contains("Studio through its tunnel cannot be reached: its tunnel is down (scripted)"), "\(reason)")
        Self.check("No server is usable now: \(reason).")
    }

    @Test("a batch's switches are told as one: gone and back is no switch; the watch line names the switch's own route")
    func coalescedSwitches() {
        var h = PlannerHarness { _, _ in .ready }
        h.add(lan("10.0.0.1", name: "Studio"))
        h.add(lan("10.0.0.2", name: "Office"))
        h.run(until: 3)
        let states = h.planner.sortedRoutes
        let (a, b) = (states[0], states[1])
        let health = AgentEvent.healthChanged(a, from: .ready, reason: "not answering", cause: .refused)
        let back = AgentEvent.coalescingSwitches([
            .activeChanged(from: a, to: nil, reason: "no server answers", cause: .refused), health,
            .activeChanged(from: nil, to: a, reason: "the first server usable from here", cause: .firstUsable),
        ])
        #expect(back.count == 1, "\(back)")
        let moved = AgentEvent.coalescingSwitches([
            .activeChanged(from: a, to: nil, reason: "gone", cause: .refused), health,
            .activeChanged(from: nil, to: b, reason: "the first server usable from here", cause: .firstUsable),
        ])
        #expect(moved.count == 2)
        if case .activeChanged(let from, let to, let reason, let cause) = moved.last {
            #expect(from?.id == a.id && to?.id == b.id && reason == "the first server usable from here")
            #expect(cause == .firstUsable, "the last switch's cause, beside its sentence")
        } else {
            Issue.record("expected one switch last: \(moved)")
        }
        let one: [AgentEvent] = [.activeChanged(from: a, to: b, reason: "x", cause: .preferred)]
        #expect(AgentEvent.coalescingSwitches(one).count == 1)
        // The line of a switch names the route it went to, not whatever is active by then.
        let snapshot = AgentSnapshot(planner: h.planner, discovery: .running, originWall: 0)
        let line = AgentEvent.activeChanged(from: a, to: b, reason: "x", cause: .preferred).watchLine(
            in: snapshot, now: h.now)
        #expect(line?.active?.routeID == b.id && line?.cause == .preferred)
        let none = AgentEvent.activeChanged(from: a, to: nil, reason: "x", cause: .refused).watchLine(
            in: snapshot, now: h.now)
        #expect(none?.type == .active && none?.active == nil)
    }
}
