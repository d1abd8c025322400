import Foundation
import LMXCore
import LMXSystem
import Logging
import Testing

@testable import LMXAgent

@Suite("The manager's outputs and bookkeeping")
struct OutputsTests {
    func snapshot() -> AgentSnapshot {
        AgentSnapshot(planner: ConnectionPlanner(), discovery: .running, originWall: 1_800_000_000)
    }

    @Test(
        "gateway latency per model and path: Prometheus histograms under the traffic table's bounded keys, p95 reported"
    )
    func gatewayLatencyMetrics() {
        let metrics = AgentMetrics()
        let traffic = GatewayTraffic(metrics: metrics)
        // A stream, counted as the gateway counts one: its answer's head (no first byte), then its events.
        let stream = traffic.answered(model: "m1", via: .lan, status: 200, firstByte: nil, answered: true)
        traffic.streamed(series: stream, firstEvent: 0.2, events: 21, seconds: 1.0)
        traffic.answered(model: "m1", via: .wan, status: 200, firstByte: 0.05, answered: true)
        traffic.answered(model: "m1", via: .wan, status: 503, firstByte: 0.01, answered: true)  // not a latency
        var bytes: [UInt8] = []
        metrics.registry.emit(into: &bytes)
        let text = String(decoding: bytes, as: UTF8.self)
        #expect(text.contains(#"lmx_gateway_first_token_seconds_count{model="m1",via="lan"} 1"#), "\(text)")
        #expect(text.contains(#"lmx_gateway_first_token_seconds_bucket{model="m1",via="lan",le="0.25"} 1"#))
        #expect(text.contains(#"lmx_gateway_first_token_seconds_count{model="m1",via="wan"} 1"#))
        #expect(text.contains(#"lmx_gateway_stream_tokens_per_second_bucket{model="m1",via="lan",le="20.0"} 1"#))
        let lan = traffic.report().models.first { $0.via == .lan }
        #expect(lan?.eventsPerSecondP95 == 20 && lan?.firstByteP95MS == 200)
        // Past the bound, the labels are the table's most recently used names, not every name a
        // client ever sent.
        for n in 0..<200 {
            traffic.answered(model: "flood-\(n)", via: .lan, status: 200, firstByte: 0.01, answered: true)
        }
        bytes = []
        metrics.registry.emit(into: &bytes)
        let series = String(decoding: bytes, as: UTF8.self).split(separator: "\n")
            .filter { $0.hasPrefix("lmx_gateway_first_token_seconds_count{") }
        #expect(series.count <= 64, "\(series.count) series")
        #expect(series.contains { $0.contains(#"model="flood-199""#) })
        #expect(!series.contains { $0.contains(#"model="flood-0""#) })
    }

    @Test(
        "a connection's last traffic series is used again only for the same model and path, and counts as a new look-up would"
    )
    func trafficSeriesReused() {
        let metrics = AgentMetrics()
        let traffic = GatewayTraffic(metrics: metrics)
        let first = traffic.answered(model: "m1", via: .lan, status: 200, firstByte: 0.05, answered: true)
        let again = traffic.answered(
            model: "m1", via: .lan, status: 200, firstByte: 0.05, answered: true, recent: first)
        #expect(again === first)
        // Another model, another path, no model: each its own series, not the recent one.
        let other = traffic.answered(
            model: "m2", via: .lan, status: 200, firstByte: 0.05, answered: true, recent: first)
        let tunnel = traffic.answered(
            model: "m1", via: .wan, status: 500, firstByte: nil, answered: true, recent: first)
        let unnamed = traffic.answered(
            model: nil, via: .lan, status: 200, firstByte: nil, answered: false, recent: first)
        #expect(other !== first && other.key.model == "m2")
        #expect(tunnel !== first && tunnel.key.via == .wan)
        #expect(unnamed !== first && unnamed.key.model == TrafficStats.unnamed)
        traffic.streamed(series: again, firstEvent: 0.2, events: 11, seconds: 0.5)
        let report = traffic.report().models
        let lan = report.first { $0.model == "m1" && $0.via == .lan }
        #expect(lan?.requests == 2 && lan?.streams == 1 && lan?.errors == 0, "\(report)")
        #expect(report.first { $0.model == "m1" && $0.via == .wan }?.errors == 1)
        #expect(report.first { $0.model == TrafficStats.unnamed }?.errors == 1)
        var bytes: [UInt8] = []
        metrics.registry.emit(into: &bytes)
        let text = String(decoding: bytes, as: UTF8.self)
        // Two answers' first bytes and the stream's first event, in the recent series' histogram.
        #expect(text.contains(#"lmx_gateway_first_token_seconds_count{model="m1",via="lan"} 3"#), "\(text)")
        #expect(text.contains(#"lmx_gateway_stream_tokens_per_second_count{model="m1",via="lan"} 1"#))
        #expect(!text.contains(#"lmx_gateway_first_token_seconds_count{model="m1",via="wan"} 1"#))
        // A flood of names: the table and the Prometheus series keep the most recently used, and
        // a model that comes after it is counted under its own name.
        for n in 0..<70 {
            traffic.answered(model: "flood-\(n)", via: .lan, status: 200, firstByte: 0.01, answered: true)
        }
        let late = traffic.answered(model: "late", via: .lan, status: 200, firstByte: 0.01, answered: true)
        let lateAgain = traffic.answered(
            model: "late", via: .lan, status: 200, firstByte: 0.01, answered: true, recent: late)
        #expect(late.key.model == "late" && lateAgain === late)
        #expect(traffic.report().models.contains { $0.model == "late" })
        #expect(traffic.report().models.count == 64)
        // The first series gave its place: a series kept by an event loop is made afresh.
        let firstAgain = traffic.answered(
            model: "m1", via: .lan, status: 200, firstByte: 0.01, answered: true, recent: first)
        #expect(firstAgain !== first && firstAgain.key.model == "m1")
        bytes = []
        metrics.registry.emit(into: &bytes)
        let after = String(decoding: bytes, as: UTF8.self)
        #expect(!after.contains(#"model="flood-0""#), "an evicted model's series is still exported")
        #expect(after.contains(#"lmx_gateway_first_token_seconds_count{model="late",via="lan"} 2"#))
        #expect(after.contains(#"lmx_gateway_first_token_seconds_count{model="m1",via="lan"} 1"#))
        let series = after.split(separator: "\n").filter { $0.hasPrefix("lmx_gateway_first_token_seconds_count{") }
        #expect(series.count <= 64, "\(series.count) first-token series")
    }

    @Test(
        "pairing expiry: one series per pairing name with an expiry, gone with the pairing; names bounded and printable"
    )
    func pairingExpiryMetric() {
        let metrics = AgentMetrics()
        func text() -> String { metrics.text() }
        metrics.setPairingExpiries([("Studio", 1_900_000_000), ("Home", 1_950_000_000)])
        #expect(text().contains(#"lmx_pairing_expiry_timestamp_seconds{pairing="Studio"} 1900000000"#), "\(text())")
        #expect(text().contains(#"lmx_pairing_expiry_timestamp_seconds{pairing="Home"} 1950000000"#))
        // Home removed, Studio renewed: Home's series goes.
        metrics.setPairingExpiries([("Studio", 1_990_000_000)])
        #expect(text().contains(#"lmx_pairing_expiry_timestamp_seconds{pairing="Studio"} 1990000000"#))
        #expect(!text().contains(#"pairing="Home""#))
        metrics.setPairingExpiries([("bad\nname", 1), (String(repeating: "x", count: 500), 2)])
        #expect(!text().contains("bad\nname") && !text().contains(String(repeating: "x", count: 200)))
        metrics.setPairingExpiries([])
        #expect(!text().contains("lmx_pairing_expiry_timestamp_seconds{"))
    }

    @Test("the active server: one series naming it and its path, replaced when it changes, none when nothing is active")
    func activeServerMetric() async throws {
        let fixture = try AgentFixture()
        fixture.publish([AgentFixture.lan("10.0.0.5")])
        let on = await fixture.agent.metricsText()
        #expect(on.contains(#"lmx_active_server{server="instance-0",via="lan"} 1"#), "\(on)")
        fixture.agent.board.publish(snapshot())
        let off = await fixture.agent.metricsText()
        #expect(!off.contains("lmx_active_server{"))
        #expect(off.contains(#"lmx_active_via{via="none"} 1"#))
        await fixture.close()
    }

    @Test("the watch hub numbers lines, replays what a watcher missed, and starts a late one with a snapshot")
    func watchHub() async throws {
        let board = StateBoard()
        let hub = WatchHub(board: board, heartbeat: 15, logger: Logger(label: "test"))
        let s = snapshot()
        hub.receive([.discoveryChanged(.waiting("no daemon")), .discoveryChanged(.running)], snapshot: s, now: 1)
        #expect(hub.seq == 2)
        let replay = hub.watch(since: 1)
        #expect(replay.first.count == 1)
        let line = try JSONDecoder().decode(StatusAPI.WatchLine.self, from: Data(replay.first[0]))
        #expect(line.type == .avahi && line.seq == 2 && line.avahi == "running")
        let late = hub.watch(since: nil)
        let first = try JSONDecoder().decode(StatusAPI.WatchLine.self, from: Data(late.first[0]))
        #expect(first.type == .snapshot && first.seq == 2 && first.status?.avahi == "running")
        // Later lines reach every watcher.
        hub.receive([.discoveryChanged(.reconnecting)], snapshot: s, now: 2)
        var iterator = late.stream.makeAsyncIterator()
        let next = try JSONDecoder().decode(StatusAPI.WatchLine.self, from: Data(try #require(await iterator.next())))
        #expect(next.seq == 3 && next.avahi == "reconnecting")
        hub.unwatch(replay.id)
        hub.unwatch(late.id)
        #expect(hub.watcherCount == 0)
    }

    @Test("a watcher that stops reading is dropped, and nobody else waits for it")
    func slowWatcher() {
        let hub = WatchHub(board: StateBoard(), heartbeat: 15, logger: Logger(label: "test"))
        let slow = hub.watch(since: nil)
        for i in 0..<(hub.watcherBuffer + 10) {
            hub.receive(
                [.discoveryChanged(i.isMultiple(of: 2) ? .running : .reconnecting)], snapshot: snapshot(),
                now: Double(i))
        }
        #expect(hub.watcherCount == 0)
        _ = slow
    }

    @Test("events name their history row once: kind, route, from, to")
    func records() {
        let route = Route(baseURL: "http://10.0.0.2:1234", via: .lan, source: .mdns, name: "a")
        var planner = ConnectionPlanner()
        let added = AgentEvent.from(planner.upsert(route, now: 0), of: planner)
        #expect(added.compactMap(\.record).map(\.kind) == ["candidate-added"])
        let removed = AgentEvent.pairing(.removed, id: "p1", detail: "Studio").record
        #expect(removed?.kind == "pairing-removed" && removed?.from == "p1" && removed?.to == nil)
        #expect(AgentEvent.configured.record == nil)
    }

    @Test("route sources: configured endpoints are diffed; a pairing's routes are remembered, then forgotten once")
    func routeSources() {
        var sources = RouteSources()
        #expect(sources.setManual(["a", "b"]).isEmpty)
        #expect(sources.setManual(["b"]) == ["a"])
        sources.setPairing("p", routes: ["r1", "r2"])
        #expect(sources.removePairing("p") == ["r1", "r2"])
        #expect(sources.removePairing("p") == nil)
    }

    @Test("pairing expiry is read on the clock passed in")
    func expiry() {
        var expiry = PairingExpiry()
        expiry.set("p", expiresAt: 1000)
        expiry.set("q", expiresAt: nil)
        #expect(expiry.nextDeadline(now: 5, wallNow: WallTime(990)) == 15)
        #expect(expiry.takeExpired(at: WallTime(999)).isEmpty)
        #expect(expiry.takeExpired(at: WallTime(1000)) == ["p"])
        #expect(expiry.nextDeadline(now: 5, wallNow: WallTime(1001)) == nil)
        #expect(PairingExpiry.hasExpired(10, at: WallTime(10)) && !PairingExpiry.hasExpired(nil, at: WallTime(10)))
    }

    @Test("endpoint.env follows the snapshot, 0644, and is removed at a clean stop")
    func endpointFile() throws {
        let directory = NSTemporaryDirectory() + "lmx-env-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let writer = EndpointFileWriter(
            file: EndpointFile(path: directory + "/endpoint.env"), logger: Logger(label: "test"))
        writer.receive([.configured], snapshot: snapshot(), now: 1)
        writer.flush()
        let text = try String(contentsOfFile: directory + "/endpoint.env", encoding: .utf8)
        #expect(text.contains("LMX_ACTIVE='0'"))
        #expect(FileSystem.info(directory + "/endpoint.env")?.mode == 0o644)
        writer.remove()
        #expect(!FileManager.default.fileExists(atPath: directory + "/endpoint.env"))
    }
}
