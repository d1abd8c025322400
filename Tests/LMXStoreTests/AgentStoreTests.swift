import Foundation
import LMXCore
import LMXStore
import Synchronization
import Testing

private func temporaryDirectory() -> String {
    let path = NSTemporaryDirectory() + "lmx-store-\(UUID().uuidString)"
    return path
}

@Suite("SQLite store (a real file)")
struct AgentStoreTests {
    @Test("routes with their secrets survive a reopen; the file is owner-only in an owner-only directory")
    func routesRoundTrip() throws {
        let dir = temporaryDirectory() + "/state"
        let path = dir + "/agent.db"
        let route = Route(
            baseURL: "https://quiet-river-1234.trycloudflare.com", via: .wan, source: .pairing, name: "Studio",
            pinnedInstance: "Mono512:1234",
            credentials: Credentials(
                adminKey: "ADMIN", inferenceKey: "INFER", accessClientID: "id", accessClientSecret: "sec"))
        do {
            let store = try AgentStore.open(path: path)
            try store.saveRoute(StoredRoute(route: route, instanceID: nil, createdAt: 1, lastSeen: nil, expiresAt: 99))
            try store.close()
        }
        let store = try AgentStore.open(path: path)
        let routes = try store.routes()
        #expect(routes.count == 1)
        #expect(routes[0].route == route)
        #expect(routes[0].expiresAt == 99)
        let fileMode = try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int
        let dirMode = try FileManager.default.attributesOfItem(atPath: dir)[.posixPermissions] as? Int
        #expect(fileMode == 0o600)
        #expect(dirMode == 0o700)
    }

    @Test("a database made by 0.4.0 (GRDB) opens as it is: its pairing, its applied migrations, and writes after")
    func databaseOfEarlierVersionOpens() throws {
        let dir = temporaryDirectory()
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let fixture = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent(
            "Fixtures/made-by-grdb-0.4.0.db"
        ).path
        let path = dir + "/agent.db"
        try FileManager.default.copyItem(atPath: fixture, toPath: path)
        let store = try AgentStore.open(path: path)
        let pairings = try store.pairings()
        #expect(pairings.map(\.pairing.name) == ["Studio"])
        #expect(pairings.first?.pairing.wan?.url == "https://studio.example.com")
        #expect(pairings.first?.pairing.wan?.credentials.adminKey == "ADMIN-S3CRET")
        #expect(pairings.first?.pairing.lan?.description == "192.168.1.20:1234")
        try store.setMeta("last_good_route", "lan/192.168.1.20:1234")
        try store.close()
        let again = try AgentStore.open(path: path)
        #expect(try again.meta("last_good_route") == "lan/192.168.1.20:1234")
        #expect(try again.pairings().count == 1)
        // Events keep their sentence (a column added to the old schema); one without reads nil.
        try again.appendEvent(
            kind: "health", routeID: "r", from: nil, to: "ready", reason: "ready", text: "Studio on the LAN is ready.",
            at: 1)
        try again.appendEvent(kind: "health", routeID: "r", from: nil, to: "down", reason: "x", at: 2)
        let events = try again.recentEvents(limit: 2)
        #expect(events.map(\.text) == ["Studio on the LAN is ready.", nil])
        #expect(events.map(\.cause) == [nil, nil], "rows without a code read nil")
    }

    @Test(
        "an event's cause code and a history change's are kept beside their sentences; a code this version does not know reads as unknown"
    )
    func causesKept() throws {
        let path = temporaryDirectory() + "/state/agent.db"
        let store = try AgentStore.open(path: path)
        try store.appendEvent(
            kind: "active", routeID: "wan/t", from: "lan/s", to: "wan/t", reason: "Studio on the LAN is not answering",
            cause: .refused, at: 1)
        try store.appendEvent(kind: "pairing-added", routeID: nil, from: nil, to: "p", reason: "token: Studio", at: 2)
        try store.appendHistory(
            transitions: [
                HistoryTransition(
                    routeID: "lan/s", at: 1, state: .down, active: false, cause: "Studio on the LAN is not answering.",
                    name: "Studio", via: .lan, server: nil, causeCode: .refused)
            ], probes: [], traffic: [], heartbeat: nil)
        try store.close()
        // A newer agent wrote a code this one does not know.
        #expect(try Command.sqlite(path, "UPDATE event SET cause = 'solar_flare' WHERE kind = 'pairing-added'") == 0)
        let reopened = try AgentStore.open(path: path)
        #expect(try reopened.recentEvents(limit: 10).map(\.cause) == [.refused, .unknown])
        #expect(try reopened.lastTransitions().map(\.causeCode) == [.refused])
    }

    @Test("a file that is not a database is moved aside, with a log line, and a fresh one is created")
    func corruptFileMovedAside() throws {
        let dir = temporaryDirectory()
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let path = dir + "/agent.db"
        try Data(repeating: 0x5A, count: 8192).write(to: URL(fileURLWithPath: path))
        var lines: [String] = []
        let store = try AgentStore.open(path: path) { lines.append($0) }
        try store.setMeta("k", "v")
        #expect(try store.meta("k") == "v")
        #expect(lines.count == 1)
        #expect(lines.first?.contains("moved it to") == true)
        let aside = try FileManager.default.contentsOfDirectory(atPath: dir).filter { $0.contains(".corrupt-") }
        #expect(aside.count == 1)
    }

    @Test("events are kept up to the retention bound, oldest dropped first")
    func eventRetention() throws {
        let store = try AgentStore.open(path: temporaryDirectory() + "/agent.db", eventRetention: 150)
        for i in 1...400 {
            try store.appendEvent(kind: "health", routeID: "r", from: nil, to: nil, reason: "e\(i)", at: Double(i))
        }
        #expect(try store.eventCount() <= 250)
        let recent = try store.recentEvents(limit: 3)
        #expect(recent.map(\.reason) == ["e398", "e399", "e400"])
    }

    @Test("probe statistics are one rolling row per route")
    func statsRolling() throws {
        let store = try AgentStore.open(path: temporaryDirectory() + "/agent.db")
        for i in 1...50 {
            try store.saveStats(
                ProbeStats(
                    routeID: "lan/a", probes: i, failures: 0, smoothedLatency: 0.01, lastVerdict: .ready,
                    lastDetail: nil, lastProbeAt: Double(i), lastGoodAt: Double(i), instanceID: "A:1"))
        }
        let stats = try store.stats()
        #expect(stats.count == 1)
        #expect(stats["lan/a"]?.probes == 50)
    }

    @Test(
        "text with NUL and non-finite numbers are refused, not truncated or trapped; a hand-edited huge real reads as no value"
    )
    func refusesWhatItCannotKeep() throws {
        let dir = temporaryDirectory() + "/state"
        let path = dir + "/agent.db"
        let store = try AgentStore.open(path: path)
        let route = Route(baseURL: "http://10.0.0.1:1234", via: .lan, source: .manual, name: "a\u{0}b")
        #expect(throws: (any Error).self) {
            try store.saveRoute(StoredRoute(route: route, instanceID: nil, createdAt: 1, lastSeen: nil, expiresAt: nil))
        }
        let nan = Route(baseURL: "http://10.0.0.2:1234", via: .lan, source: .manual, name: "fine")
        #expect(throws: (any Error).self) {
            try store.saveRoute(
                StoredRoute(route: nan, instanceID: nil, createdAt: .nan, lastSeen: nil, expiresAt: nil))
        }
        #expect(try store.routes().isEmpty, "nothing half-written")
        let pairing = try PairingParser(now: 1_760_000_000).parse(
            "opta-lmx://pair?v=1&url=https%3A%2F%2Fa.example&exp=1900000000")
        _ = try store.importPairings(pairing, at: 1)
        try store.close()
        // A hand edit puts a real far past Int64 where an integer (the expiry) is expected.
        let edit = try Command.sqlite(path, "UPDATE pairing SET expires_at = 1e300")
        #expect(edit == 0)
        let reopened = try AgentStore.open(path: path)
        let pairings = try reopened.pairings()
        #expect(pairings.count == 1 && pairings[0].pairing.expiresAt == nil)
    }
}

/// Runs SQL on a database file with Python's sqlite3 (another program editing it).
@Suite("SQLite store: rows a hand edit damaged")
struct DamagedRowTests {
    @Test("a row without a required value of its type is left out; the others are read")
    func damagedRowLeftOut() throws {
        let path = temporaryDirectory() + "/state/agent.db"
        let store = try AgentStore.open(path: path)
        let parser = PairingParser(now: 1_760_000_000)
        for name in ["Good", "Edited"] {
            _ = try store.importPairings(
                try parser.parse("opta-lmx://pair?v=1&name=\(name)&url=https%3A%2F%2F\(name.lowercased()).example"),
                at: 1)
        }
        _ = try store.appendEvent(kind: "active", routeID: nil, from: nil, to: nil, reason: "x", at: 1)
        try store.close()
        #expect(try Command.sqlite(path, "UPDATE pairing SET created_at = 'yesterday' WHERE name = 'Edited'") == 0)
        #expect(try Command.sqlite(path, "UPDATE event SET at = 'noon'") == 0)
        let reopened = try AgentStore.open(path: path)
        #expect(try reopened.pairings().map(\.pairing.name) == ["Good"])
        #expect(try reopened.recentEvents(limit: 10).isEmpty)
    }
}

@Suite("SQLite store: reads beside a write that waits for another process's lock")
struct StoreLockTests {
    @Test("pairings and events are read while a write waits for the lock another process holds")
    func readsDoNotWaitBehindWrites() throws {
        let path = temporaryDirectory() + "/state/agent.db"
        let store = try AgentStore.open(path: path)
        let parser = PairingParser(now: 1_760_000_000)
        _ = try store.importPairings(
            try parser.parse("opta-lmx://pair?v=1&name=First&url=https%3A%2F%2Fa.example"), at: 1)
        // Another process takes the write lock and keeps it for 3 s (a backup, sqlite3 by hand).
        let holder = Process()
        holder.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        holder.arguments = [
            "-c",
            "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); c.execute('BEGIN IMMEDIATE'); print('locked', flush=True); time.sleep(3); c.execute('COMMIT')",
            path,
        ]
        let out = Pipe()
        holder.standardOutput = out
        try holder.run()
        _ = out.fileHandleForReading.availableData  // "locked"
        // A write of the agent's now waits for it (SQLite's busy timeout) on the write connection.
        let written = Mutex(false)
        let second = try parser.parse("opta-lmx://pair?v=1&name=Second&url=https%3A%2F%2Fb.example")
        let writer = Thread {
            _ = try? store.importPairings(second, at: 2)
            written.withLock { $0 = true }
        }
        writer.start()
        Thread.sleep(forTimeInterval: 0.3)
        #expect(!written.withLock { $0 }, "the write waits for the other process's lock")
        // Reads go on meanwhile, from their own connection, and see what was committed.
        let pairings = try store.pairings()
        _ = try store.recentEvents(limit: 10)
        let writeDoneFirst = written.withLock { $0 }
        #expect(!writeDoneFirst, "the read waited behind the write")
        #expect(pairings.map(\.pairing.name) == ["First"])
        holder.waitUntilExit()
        for _ in 0..<100 where !written.withLock({ $0 }) { Thread.sleep(forTimeInterval: 0.05) }
        #expect(
            Set(try store.pairings().compactMap(\.pairing.name)) == ["First", "Second"],
            "the write went in once the lock was free")
    }
}

enum Command {
    static func sqlite(_ path: String, _ sql: String) throws -> Int32 {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = [
            "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute(sys.argv[2]); c.commit()", path,
            sql,
        ]
        try process.run()
        process.waitUntilExit()
        return process.terminationStatus
    }
}
