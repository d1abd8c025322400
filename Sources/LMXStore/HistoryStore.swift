import LMXCore

/// The history's tables (migration `v6-history`): each route's changes of state, probe latency
/// and gateway traffic in steps, bounded by ``HistoryRetention`` (``trimHistory(now:retention:)``).
extension AgentStore {
    static let historyMigration: (identifier: String, sql: [String]) = (
        "v6-history",
        [
            """
            CREATE TABLE "history_transition" ("id" INTEGER PRIMARY KEY AUTOINCREMENT, "route_id" TEXT NOT NULL,
                "at" DOUBLE NOT NULL, "state" TEXT, "active" INTEGER NOT NULL, "cause" TEXT NOT NULL,
                "name" TEXT NOT NULL, "via" TEXT NOT NULL, "server" TEXT)
            """,
            #"CREATE INDEX "history_transition_at" ON "history_transition" ("at")"#,
            """
            CREATE TABLE "history_probe" ("route_id" TEXT NOT NULL, "at" DOUBLE NOT NULL, "step" INTEGER NOT NULL,
                "probes" INTEGER NOT NULL, "p50" DOUBLE, "p95" DOUBLE, PRIMARY KEY ("route_id", "step", "at"))
            """,
            #"CREATE INDEX "history_probe_at" ON "history_probe" ("at")"#,
            // The trim's roll-up finds the minutes to roll by step first.
            #"CREATE INDEX "history_probe_step" ON "history_probe" ("step", "at")"#,
            """
            CREATE TABLE "history_traffic" ("model" TEXT NOT NULL, "via" TEXT NOT NULL, "at" DOUBLE NOT NULL,
                "step" INTEGER NOT NULL, "requests" INTEGER NOT NULL, "errors" INTEGER NOT NULL,
                "first_tokens" INTEGER NOT NULL, "first_token_p50" DOUBLE, "first_token_p95" DOUBLE,
                "streams" INTEGER NOT NULL, "tokens_per_second" DOUBLE, PRIMARY KEY ("model", "via", "step", "at"))
            """,
            #"CREATE INDEX "history_traffic_at" ON "history_traffic" ("at")"#,
            #"CREATE INDEX "history_traffic_step" ON "history_traffic" ("step", "at")"#,
        ]
    )

    /// Text columns are cut to this many bytes (causes, names): every row has a bounded size.
    static let historyTextLimit = 300

    /// Appends what the history learned, in one transaction; `heartbeat`: the agent was alive
    /// then (the start of a ribbon's "agent not running" after a SIGKILL).
    public func appendHistory(
        transitions: [HistoryTransition], probes: [ProbeFigures], traffic: [TrafficFigures], heartbeat: Double?
    ) throws {
        guard !transitions.isEmpty || !probes.isEmpty || !traffic.isEmpty || heartbeat != nil else { return }
        let cut = { (text: String) in String(decoding: text.utf8.prefix(Self.historyTextLimit), as: UTF8.self) }
        try pool.write { db in
            for t in transitions {
                try db.execute(
                    sql: """
                        INSERT INTO history_transition (route_id, at, state, active, cause, name, via, server,
                            cause_code)
                        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                        """,
                    arguments: [
                        cut(t.routeID), t.at, t.state?.rawValue, t.active ? 1 : 0, cut(t.cause), cut(t.name),
                        t.via.rawValue, t.server.map(cut), t.causeCode?.rawValue,
                    ])
            }
            // Many rows per statement: a minute of twenty routes is one statement, not twenty.
            for chunk in probes.chunked(100) {
                try db.execute(
                    sql: """
                        INSERT INTO history_probe (route_id, at, step, probes, p50, p95) VALUES
                        \(Self.placeholders(6, rows: chunk.count))
                        ON CONFLICT DO UPDATE SET probes = probes + excluded.probes,
                            p50 = COALESCE(excluded.p50, p50), p95 = MAX(COALESCE(p95, 0), COALESCE(excluded.p95, 0))
                        """,
                    arguments: StatementArguments(
                        chunk.flatMap { p -> [(any SQLiteConvertible)?] in
                            [cut(p.routeID), p.at, p.step, p.probes, p.p50, p.p95]
                        }))
            }
            for chunk in traffic.chunked(100) {
                try db.execute(
                    sql: """
                        INSERT INTO history_traffic (model, via, at, step, requests, errors, first_tokens,
                            first_token_p50, first_token_p95, streams, tokens_per_second)
                        VALUES \(Self.placeholders(11, rows: chunk.count))
                        ON CONFLICT DO UPDATE SET requests = requests + excluded.requests,
                            errors = errors + excluded.errors, first_tokens = first_tokens + excluded.first_tokens,
                            first_token_p50 = COALESCE(excluded.first_token_p50, first_token_p50),
                            first_token_p95 = COALESCE(excluded.first_token_p95, first_token_p95),
                            streams = streams + excluded.streams,
                            tokens_per_second = COALESCE(excluded.tokens_per_second, tokens_per_second)
                        """,
                    arguments: StatementArguments(
                        chunk.flatMap { f -> [(any SQLiteConvertible)?] in
                            [
                                cut(f.model), f.via.rawValue, f.at, f.step, f.requests, f.errors, f.firstTokens,
                                f.firstTokenP50, f.firstTokenP95, f.streams, f.tokensPerSecond,
                            ]
                        }))
            }
            if let heartbeat {
                try db.execute(
                    sql: "INSERT OR REPLACE INTO meta (key, value) VALUES ('history_heartbeat', ?)",
                    arguments: [String(heartbeat)])
            }
        }
    }

    /// `(?, ?), (?, ?)` for `rows` rows of `columns` values.
    static func placeholders(_ columns: Int, rows: Int) -> String {
        let row = "(" + Array(repeating: "?", count: columns).joined(separator: ", ") + ")"
        return Array(repeating: row, count: rows).joined(separator: ", ")
    }

    /// Ends the ribbons of the agent's last run: each route that was in a state then is "agent
    /// not running" from the agent's last sign of life (its last heartbeat or change; after a
    /// SIGKILL, up to a minute before it died). Called once at start, before anything is recorded.
    public func closeHistory(now: Double) throws {
        let last = try lastTransitions()
        let open = last.filter { $0.state != nil && $0.state != .stopped }
        guard !open.isEmpty else { return }
        let latest = last.map(\.at).max() ?? now
        let stoppedAt = min(max(try historyHeartbeat() ?? latest, latest), now)
        try appendHistory(
            transitions: open.map {
                HistoryTransition(
                    routeID: $0.routeID, at: stoppedAt, state: .stopped, active: false,
                    cause: "The agent was not running.", name: $0.name, via: $0.via, server: $0.server)
            }, probes: [], traffic: [], heartbeat: nil)
    }

    /// When the agent last said it was alive (``appendHistory(transitions:probes:traffic:heartbeat:)``).
    public func historyHeartbeat() throws -> Double? {
        try meta("history_heartbeat").flatMap { Double($0) }
    }

    /// Rows kept now, per table (for the metrics and the tests of the bound).
    public struct HistoryCounts: Sendable, Hashable {
        public var transitions: Int
        public var probes: Int
        public var traffic: Int
    }

    public func historyCounts() throws -> HistoryCounts {
        try reader.read { db in
            func count(_ table: String) throws -> Int {
                try db.rows(sql: "SELECT COUNT(*) AS n FROM \(table)").first?["n"] ?? 0
            }
            return HistoryCounts(
                transitions: try count("history_transition"), probes: try count("history_probe"),
                traffic: try count("history_traffic"))
        }
    }

    /// Holds the history to `retention`: figures per minute older than `fineKeep` rolled up into
    /// `coarseStep` steps, everything older than `keep` dropped (but each route's last change
    /// before then, which says its state at the start of the window), then each table cut to its
    /// row bound, oldest first. One transaction.
    public func trimHistory(now: Double, retention: HistoryRetention = HistoryRetention()) throws {
        // Whole coarse steps only: a step still partly fine waits for its last minutes.
        let fineCut = History.align(now - retention.fineKeep, retention.coarseStep)
        let dropCut = now - retention.keep
        try pool.write { db in
            let fine = try db.rows(
                sql: "SELECT * FROM history_probe WHERE step < ? AND at < ?",
                arguments: [retention.coarseStep, fineCut]
            ).compactMap(Self.probeFigures)
            if !fine.isEmpty {
                try db.execute(
                    sql: "DELETE FROM history_probe WHERE step < ? AND at < ?",
                    arguments: [retention.coarseStep, fineCut])
                for chunk in ProbeFigures.rolledUp(fine, step: retention.coarseStep).chunked(100) {
                    try db.execute(
                        sql: """
                            INSERT OR REPLACE INTO history_probe (route_id, at, step, probes, p50, p95)
                            VALUES \(Self.placeholders(6, rows: chunk.count))
                            """,
                        arguments: StatementArguments(
                            chunk.flatMap { p -> [(any SQLiteConvertible)?] in
                                [p.routeID, p.at, p.step, p.probes, p.p50, p.p95]
                            }))
                }
            }
            let fineTraffic = try db.rows(
                sql: "SELECT * FROM history_traffic WHERE step < ? AND at < ?",
                arguments: [retention.coarseStep, fineCut]
            ).compactMap(Self.trafficFigures)
            if !fineTraffic.isEmpty {
                try db.execute(
                    sql: "DELETE FROM history_traffic WHERE step < ? AND at < ?",
                    arguments: [retention.coarseStep, fineCut])
                for chunk in TrafficFigures.rolledUp(fineTraffic, step: retention.coarseStep).chunked(100) {
                    try db.execute(
                        sql: """
                            INSERT OR REPLACE INTO history_traffic (model, via, at, step, requests, errors, first_tokens,
                                first_token_p50, first_token_p95, streams, tokens_per_second)
                            VALUES \(Self.placeholders(11, rows: chunk.count))
                            """,
                        arguments: StatementArguments(
                            chunk.flatMap { f -> [(any SQLiteConvertible)?] in
                                [
                                    f.model, f.via.rawValue, f.at, f.step, f.requests, f.errors, f.firstTokens,
                                    f.firstTokenP50, f.firstTokenP95, f.streams, f.tokensPerSecond,
                                ]
                            }))
                }
            }
            try db.execute(sql: "DELETE FROM history_probe WHERE at < ?", arguments: [dropCut])
            try db.execute(sql: "DELETE FROM history_traffic WHERE at < ?", arguments: [dropCut])
            try db.execute(
                sql: """
                    DELETE FROM history_transition WHERE at < ? AND id NOT IN
                        (SELECT MAX(id) FROM history_transition WHERE at < ? GROUP BY route_id)
                    """,
                arguments: [dropCut, dropCut])
            // The last change of a route removed before the window says nothing any more.
            try db.execute(
                sql: "DELETE FROM history_transition WHERE at < ? AND state IS NULL", arguments: [dropCut])
            for (table, bound) in [
                ("history_probe", retention.maxProbeRows), ("history_traffic", retention.maxTrafficRows),
                ("history_transition", retention.maxTransitions),
            ] {
                let count: Int = try db.rows(sql: "SELECT COUNT(*) AS n FROM \(table)").first?["n"] ?? 0
                if count > bound {
                    try db.execute(
                        sql: "DELETE FROM \(table) WHERE rowid IN (SELECT rowid FROM \(table) ORDER BY at LIMIT ?)",
                        arguments: [count - bound])
                }
            }
        }
    }

    /// The rows of the window: every change in it, with each route's last change before it;
    /// every figure in it, of whichever step.
    public func historyRows(since: Double, until: Double) throws -> (
        transitions: [HistoryTransition], probes: [ProbeFigures], traffic: [TrafficFigures]
    ) {
        try reader.read { db in
            let transitions = try db.rows(
                sql: """
                    SELECT * FROM history_transition WHERE (at >= ? AND at <= ?) OR id IN
                        (SELECT MAX(id) FROM history_transition WHERE at < ? GROUP BY route_id)
                    ORDER BY at, id
                    """,
                arguments: [since, until, since]
            ).compactMap(Self.transition)
            let probes = try db.rows(
                sql: "SELECT * FROM history_probe WHERE at >= ? AND at < ? ORDER BY at",
                arguments: [since - 3600, until]
            ).compactMap(Self.probeFigures)
            let traffic = try db.rows(
                sql: "SELECT * FROM history_traffic WHERE at >= ? AND at < ? ORDER BY at",
                arguments: [since - 3600, until]
            ).compactMap(Self.trafficFigures)
            return (transitions, probes, traffic)
        }
    }

    /// Each route's latest change (what it was doing when the agent last ran).
    public func lastTransitions() throws -> [HistoryTransition] {
        try reader.read { db in
            try db.rows(
                sql: """
                    SELECT * FROM history_transition WHERE id IN
                        (SELECT MAX(id) FROM history_transition GROUP BY route_id) ORDER BY id
                    """
            ).compactMap(Self.transition)
        }
    }

    // A row a hand edit or damage left without a required value is left out.
    static func transition(_ row: Row) -> HistoryTransition? {
        guard let routeID: String = row["route_id"], let at: Double = row["at"], let active: Int = row["active"],
            let via = (row["via"] as String?).flatMap(Via.init(rawValue:))
        else { return nil }
        let state = (row["state"] as String?).map { RibbonState(rawValue: $0) ?? .unknown }
        return HistoryTransition(
            routeID: routeID, at: at, state: state, active: active != 0, cause: row["cause"] ?? "",
            name: row["name"] ?? routeID, via: via, server: row["server"],
            causeCode: (row["cause_code"] as String?).map(Cause.init(code:)))
    }

    static func probeFigures(_ row: Row) -> ProbeFigures? {
        guard let routeID: String = row["route_id"], let at: Double = row["at"], let step: Int = row["step"],
            let probes: Int = row["probes"]
        else { return nil }
        return ProbeFigures(routeID: routeID, at: at, step: step, probes: probes, p50: row["p50"], p95: row["p95"])
    }

    static func trafficFigures(_ row: Row) -> TrafficFigures? {
        guard let model: String = row["model"], let via = (row["via"] as String?).flatMap(Via.init(rawValue:)),
            let at: Double = row["at"], let step: Int = row["step"], let requests: Int = row["requests"]
        else { return nil }
        return TrafficFigures(
            model: model, via: via, at: at, step: step, requests: requests, errors: row["errors"] ?? 0,
            firstTokens: row["first_tokens"] ?? 0, firstTokenP50: row["first_token_p50"],
            firstTokenP95: row["first_token_p95"], streams: row["streams"] ?? 0,
            tokensPerSecond: row["tokens_per_second"])
    }
}

extension Array {
    /// The elements in runs of at most `size`.
    fileprivate func chunked(_ size: Int) -> [ArraySlice<Element>] {
        stride(from: 0, to: count, by: size).map { self[$0..<Swift.min($0 + size, count)] }
    }
}
