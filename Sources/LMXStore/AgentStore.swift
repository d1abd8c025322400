import LMXCore
import LMXSystem

/// A route remembered across restarts, with what the agent last knew of it.
public struct StoredRoute: Sendable, Hashable {
    public var route: Route
    public var instanceID: String?
    public var createdAt: Double
    public var lastSeen: Double?
    /// Pairing expiry (unix seconds), if the pairing had one.
    public var expiresAt: Double?

    public init(route: Route, instanceID: String?, createdAt: Double, lastSeen: Double?, expiresAt: Double? = nil) {
        self.route = route
        self.instanceID = instanceID
        self.createdAt = createdAt
        self.lastSeen = lastSeen
        self.expiresAt = expiresAt
    }
}

/// Rolling probe statistics of one route (not every probe forever).
public struct ProbeStats: Sendable, Hashable {
    public var routeID: String
    public var probes: Int
    public var failures: Int
    public var smoothedLatency: Double?
    public var lastVerdict: HealthVerdict?
    public var lastDetail: String?
    public var lastProbeAt: Double?
    public var lastGoodAt: Double?
    public var instanceID: String?

    public init(
        routeID: String, probes: Int, failures: Int, smoothedLatency: Double?, lastVerdict: HealthVerdict?,
        lastDetail: String?, lastProbeAt: Double?, lastGoodAt: Double?, instanceID: String?
    ) {
        self.routeID = routeID
        self.probes = probes
        self.failures = failures
        self.smoothedLatency = smoothedLatency
        self.lastVerdict = lastVerdict
        self.lastDetail = lastDetail
        self.lastProbeAt = lastProbeAt
        self.lastGoodAt = lastGoodAt
        self.instanceID = instanceID
    }
}

/// Errors of the store, with the file and what to do.
public struct StoreError: Error, CustomStringConvertible, Sendable {
    public var description: String
}

/// The agent's memory in one SQLite file (WAL mode, owner-only permissions): pairings and
/// remembered routes with their secrets, rolling probe statistics, connection events with bounded
/// retention. Every write is one transaction, so a crash never leaves a partial row. Writes go
/// through one connection, reads through another (in WAL mode a read never waits for a write,
/// not even one waiting for another process's lock).
public final class AgentStore: Sendable {
    public let path: String
    /// The connection every write goes through (one transaction each).
    let pool: SQLiteConnection
    /// A second connection for reads: in WAL mode they go on while a write waits for another
    /// process's lock (up to the busy timeout), instead of queueing behind it on one connection.
    let reader: SQLiteConnection
    /// Events kept at most.
    public let eventRetention: Int

    /// Opens (creating if needed) the database at `path`. A file that is not a database, or a
    /// corrupt one, is moved aside to `<path>.corrupt-<time>` and a fresh one is created.
    /// - Parameter log: receives one line per notable thing (moved-aside files).
    public static func open(path: String, eventRetention: Int = 5000, log: (String) -> Void = { _ in }) throws
        -> AgentStore
    {
        let directory = path.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
        if !directory.isEmpty {
            do { try FileSystem.makeDirectories(directory, mode: 0o700) } catch {
                throw StoreError(description: error.description)
            }
        }
        do {
            return try AgentStore(path: path, eventRetention: eventRetention)
        } catch let error as SQLiteError where error.isCorrupt {
            let aside = "\(path).corrupt-\(SystemClock.unixTime())"
            for suffix in ["", "-wal", "-shm"] where FileSystem.exists(path + suffix) {
                do {
                    try FileSystem.rename(path + suffix, to: aside + suffix)
                } catch {
                    throw StoreError(
                        description:
                            "database \(path) is corrupt and could not be moved aside (\(error.reason)); remove it by hand"
                    )
                }
            }
            log("database \(path) is corrupt (\(error.message)); moved it to \(aside) and started a fresh one")
            return try AgentStore(path: path, eventRetention: eventRetention)
        }
    }

    private init(path: String, eventRetention: Int) throws {
        self.path = path
        self.eventRetention = eventRetention
        let oldMask = FileSystem.setUmask(0o077)
        defer { FileSystem.setUmask(oldMask) }
        pool = try SQLiteConnection(path: path)
        // Reading the schema fails at once on a file that is not SQLite or is corrupt.
        _ = try pool.read { db in try db.rows(sql: "PRAGMA quick_check(1)") }
        try pool.migrate(Self.migrations)
        for suffix in ["", "-wal", "-shm"] { FileSystem.setMode(path + suffix, 0o600) }
        reader = try SQLiteConnection(path: path)
    }

    /// The schema, one migration at a time (recorded in `grdb_migrations`, as by the versions
    /// that used GRDB: their databases open unchanged).
    static let migrations: [(identifier: String, sql: [String])] = [
        (
            "v1",
            [
                """
                CREATE TABLE "route" ("id" TEXT PRIMARY KEY NOT NULL, "base_url" TEXT NOT NULL, "via" TEXT NOT NULL,
                    "source" TEXT NOT NULL, "name" TEXT NOT NULL, "service_path" TEXT NOT NULL, "pinned_instance" TEXT,
                    "instance_id" TEXT, "admin_key" TEXT, "api_key" TEXT, "cf_id" TEXT, "cf_secret" TEXT,
                    "addresses" TEXT NOT NULL DEFAULT '', "created_at" DOUBLE NOT NULL, "last_seen" DOUBLE, "expires_at" DOUBLE)
                """,
                """
                CREATE TABLE "server" ("key" TEXT PRIMARY KEY NOT NULL, "instance_id" TEXT, "name" TEXT NOT NULL,
                    "addresses" TEXT NOT NULL, "source" TEXT NOT NULL, "first_seen" DOUBLE NOT NULL, "last_seen" DOUBLE NOT NULL)
                """,
                """
                CREATE TABLE "probe_stats" ("route_id" TEXT PRIMARY KEY NOT NULL, "probes" INTEGER NOT NULL,
                    "failures" INTEGER NOT NULL, "smoothed_latency" DOUBLE, "last_verdict" TEXT, "last_detail" TEXT,
                    "last_probe_at" DOUBLE, "last_good_at" DOUBLE, "instance_id" TEXT)
                """,
                """
                CREATE TABLE "event" ("id" INTEGER PRIMARY KEY AUTOINCREMENT, "at" DOUBLE NOT NULL, "kind" TEXT NOT NULL,
                    "route_id" TEXT, "from_value" TEXT, "to_value" TEXT, "reason" TEXT NOT NULL)
                """,
                #"CREATE TABLE "meta" ("key" TEXT PRIMARY KEY NOT NULL, "value" TEXT NOT NULL)"#,
            ]
        ),
        (
            "v2-pairings",
            [
                """
                CREATE TABLE "pairing" ("id" TEXT PRIMARY KEY NOT NULL, "name" TEXT, "format" TEXT NOT NULL, "wan_url" TEXT,
                    "admin_key" TEXT, "api_key" TEXT, "cf_id" TEXT, "cf_secret" TEXT, "lan" TEXT, "instance" TEXT,
                    "expires_at" INTEGER, "created_at" DOUBLE NOT NULL, "updated_at" DOUBLE NOT NULL)
                """
            ]
        ),
        // The LAN addresses each paired or configured tunnel vouches for, as its server listed
        // them: they hold across restarts and while the tunnel is down.
        (
            "v3-tunnel-vouches",
            [
                """
                CREATE TABLE "tunnel_vouch" ("tunnel_route" TEXT PRIMARY KEY NOT NULL, "instance_id" TEXT,
                    "base_urls" TEXT NOT NULL, "updated_at" DOUBLE NOT NULL)
                """
            ]
        ),
        // Servers seen were written on every sighting (with a COUNT(*) each time) and never read:
        // what a route needs is in `route`; the rest is in memory.
        ("v4-no-server-table", [#"DROP TABLE IF EXISTS "server""#]),
        // Each event's sentence as it was told, with the names of then (rows of earlier versions
        // have none: their sentence is made when they are read).
        ("v5-event-text", [#"ALTER TABLE "event" ADD COLUMN "text" TEXT"#]),
        // What each route and model did over time (HistoryStore.swift).
        historyMigration,
        // Each event's cause as a code beside its sentence (rows of earlier versions have none),
        // and each history change's.
        (
            "v7-causes",
            [
                #"ALTER TABLE "event" ADD COLUMN "cause" TEXT"#,
                #"ALTER TABLE "history_transition" ADD COLUMN "cause_code" TEXT"#,
            ]
        ),
    ]

    // MARK: - Routes

    public func saveRoute(_ stored: StoredRoute) throws {
        let r = stored.route
        try pool.write { db in
            try db.execute(
                sql: """
                    INSERT INTO route (id, base_url, via, source, name, service_path, pinned_instance, instance_id,
                        admin_key, api_key, cf_id, cf_secret, addresses, created_at, last_seen, expires_at)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    ON CONFLICT(id) DO UPDATE SET base_url = excluded.base_url, via = excluded.via,
                        source = excluded.source, name = excluded.name, service_path = excluded.service_path,
                        pinned_instance = excluded.pinned_instance,
                        instance_id = COALESCE(excluded.instance_id, route.instance_id),
                        admin_key = excluded.admin_key, api_key = excluded.api_key, cf_id = excluded.cf_id,
                        cf_secret = excluded.cf_secret, addresses = excluded.addresses,
                        last_seen = COALESCE(excluded.last_seen, route.last_seen), expires_at = excluded.expires_at
                    """,
                arguments: [
                    r.id, r.baseURL, r.via.rawValue, r.source.rawValue, r.name, r.servicePath, r.pinnedInstance,
                    stored.instanceID, r.credentials.adminKey, r.credentials.inferenceKey,
                    r.credentials.accessClientID, r.credentials.accessClientSecret,
                    r.addresses.joined(separator: " "), stored.createdAt, stored.lastSeen, stored.expiresAt,
                ])
        }
    }

    public func deleteRoute(_ id: String) throws {
        try pool.write { db in
            try db.execute(sql: "DELETE FROM route WHERE id = ?", arguments: [id])
            try db.execute(sql: "DELETE FROM probe_stats WHERE route_id = ?", arguments: [id])
        }
    }

    public func routes() throws -> [StoredRoute] {
        try reader.read { db in
            // A row a hand edit or damage left without a required value is left out.
            try db.rows(sql: "SELECT * FROM route ORDER BY id").compactMap { row in try? Self.storedRoute(row) }
        }
    }

    static func storedRoute(_ row: Row) throws(SQLiteError) -> StoredRoute? {
        guard let via = Via(rawValue: try row.required("via")),
            let source = RouteSource(rawValue: try row.required("source"))
        else {
            return nil
        }
        let addresses: String = row["addresses"] ?? ""
        let route = Route(
            id: try row.required("id"), baseURL: try row.required("base_url"), via: via, source: source,
            name: try row.required("name"),
            servicePath: try row.required("service_path"), pinnedInstance: row["pinned_instance"],
            credentials: Credentials(
                adminKey: row["admin_key"], inferenceKey: row["api_key"], accessClientID: row["cf_id"],
                accessClientSecret: row["cf_secret"]),
            addresses: addresses.split(separator: " ").map(String.init))
        return StoredRoute(
            route: route, instanceID: row["instance_id"], createdAt: try row.required("created_at"),
            lastSeen: row["last_seen"],
            expiresAt: row["expires_at"])
    }

    // MARK: - Probe statistics

    public func saveStats(_ stats: ProbeStats) throws {
        try pool.write { db in
            try db.execute(
                sql: """
                    INSERT OR REPLACE INTO probe_stats (route_id, probes, failures, smoothed_latency, last_verdict,
                        last_detail, last_probe_at, last_good_at, instance_id)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """,
                arguments: [
                    stats.routeID, stats.probes, stats.failures, stats.smoothedLatency, stats.lastVerdict?.rawValue,
                    stats.lastDetail, stats.lastProbeAt, stats.lastGoodAt, stats.instanceID,
                ])
        }
    }

    public func stats() throws -> [String: ProbeStats] {
        try reader.read { db in
            var result: [String: ProbeStats] = [:]
            for row in try db.rows(sql: "SELECT * FROM probe_stats") {
                let verdict: String? = row["last_verdict"]
                guard let routeID: String = row["route_id"] else { continue }
                let stats = ProbeStats(
                    routeID: routeID, probes: row["probes"] ?? 0, failures: row["failures"] ?? 0,
                    smoothedLatency: row["smoothed_latency"],
                    lastVerdict: verdict.flatMap(HealthVerdict.init(rawValue:)),
                    lastDetail: row["last_detail"], lastProbeAt: row["last_probe_at"], lastGoodAt: row["last_good_at"],
                    instanceID: row["instance_id"])
                result[stats.routeID] = stats
            }
            return result
        }
    }

    // MARK: - Events

    @discardableResult
    public func appendEvent(
        kind: String, routeID: String?, from: String?, to: String?, reason: String, text: String? = nil,
        cause: Cause? = nil, at now: Double
    ) throws -> Int64 {
        try pool.write { db in
            try db.execute(
                sql: """
                    INSERT INTO event (at, kind, route_id, from_value, to_value, reason, text, cause)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                    """,
                arguments: [now, kind, routeID, from, to, reason, text, cause?.rawValue])
            let id = db.lastInsertedRowID
            if id % 100 == 0 {
                try db.execute(sql: "DELETE FROM event WHERE id <= ?", arguments: [id - Int64(eventRetention)])
            }
            return id
        }
    }

    public func recentEvents(limit: Int) throws -> [StatusAPI.Event] {
        try reader.read { db in
            try db.rows(sql: "SELECT * FROM event ORDER BY id DESC LIMIT ?", arguments: [limit]).compactMap {
                row -> StatusAPI.Event? in
                guard let id: Int64 = row["id"], let at: Double = row["at"], let kind: String = row["kind"] else {
                    return nil
                }
                return StatusAPI.Event(
                    id: id, at: Timestamp.iso8601(at), kind: kind, routeID: row["route_id"], from: row["from_value"],
                    to: row["to_value"], reason: row["reason"] ?? "", text: row["text"],
                    cause: (row["cause"] as String?).map(Cause.init(code:)))
            }.reversed()
        }
    }

    public func eventCount() throws -> Int {
        try reader.read { db in try db.rows(sql: "SELECT COUNT(*) AS n FROM event").first?["n"] ?? 0 }
    }

    // MARK: - Meta

    public func setMeta(_ key: String, _ value: String?) throws {
        try pool.write { db in
            if let value {
                try db.execute(sql: "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", arguments: [key, value])
            } else {
                try db.execute(sql: "DELETE FROM meta WHERE key = ?", arguments: [key])
            }
        }
    }

    public func meta(_ key: String) throws -> String? {
        try reader.read { db in
            try db.rows(sql: "SELECT value FROM meta WHERE key = ?", arguments: [key]).first?["value"]
        }
    }

    /// Checkpoints the WAL and closes the file.
    public func close() throws {
        pool.checkpoint()
    }
}

extension AgentStore {
    /// The error says the database was locked by another connection (worth trying again later),
    /// not that the write itself is wrong.
    public static func isLocked(_ error: any Error) -> Bool {
        (error as? SQLiteError)?.isLocked == true
    }

    /// A failed read or write of the database at `path`, for people: what happened to which file
    /// and the next step (the history's readers show it; the log says it once per episode).
    public static func explain(_ error: any Error, path: String) -> String {
        guard let sqlite = error as? SQLiteError else {
            return
                "could not use the database \(path) (\(error)): check the disk (df) and the file's owner and permissions, then restart the agent"
        }
        if sqlite.isLocked {
            return
                "the database \(path) is locked by another process (a backup, sqlite3 left in a transaction): try again once it lets go"
        }
        if sqlite.isCorrupt {
            return
                "the database \(path) is damaged (\(sqlite.message)): stop the agent, move the file aside and start it again (a fresh one is made; pair again with lmx-pair)"
        }
        return
            "could not use the database \(path) (\(sqlite.message)): check the disk (df) and the file's owner and permissions, then restart the agent"
    }
}
