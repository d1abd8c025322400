import CSQLite
import Synchronization

/// The store's whole use of SQLite, on the system library through a module map: one connection
/// (serialized: the agent's writes go through one queue and reads are a few rows), statements
/// with bound arguments, rows read by column name, transactions, and migrations recorded as
/// GRDB records them (`grdb_migrations`), so a database made by earlier versions opens as it is.
final class SQLiteConnection: @unchecked Sendable {
    // @unchecked: `handle` is only used with `lock` held.
    private let handle: OpaquePointer
    private let lock = Mutex(())

    /// Opens or creates the database at `path` (WAL, `synchronous = NORMAL`, a 5 s busy timeout:
    /// a database locked by another process, a backup or sqlite3 by hand, is waited for). The
    /// page cache is held to 512 KiB (SQLite's default is 2 MiB): the agent writes rows and reads
    /// a few back, and the cache is heap the daemon keeps for as long as it runs.
    init(path: String) throws(SQLiteError) {
        var db: OpaquePointer?
        let code = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nil)
        guard code == SQLITE_OK, let db else {
            let error = SQLiteError(
                code: code, message: db.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory")
            sqlite3_close_v2(db)
            throw error
        }
        handle = db
        sqlite3_busy_timeout(db, 5000)
        sqlite3_extended_result_codes(db, 1)
        do {
            try execute(sql: "PRAGMA journal_mode = WAL")
            try execute(sql: "PRAGMA synchronous = NORMAL")
            try execute(sql: "PRAGMA cache_size = -512")
        } catch {
            sqlite3_close_v2(db)
            throw error
        }
    }

    deinit { sqlite3_close_v2(handle) }

    /// Reads, one at a time with every other use of the connection.
    func read<T>(_ body: (SQLiteConnection) throws -> T) throws -> T {
        try lock.withLock { _ in try body(self) }
    }

    /// Writes in one transaction: all of `body` or nothing.
    /// - Parameter durable: the commit survives a power loss (`synchronous = FULL` for this
    ///   transaction: the WAL is synced at the commit); for what a person did (a pairing
    ///   imported or removed), not for probe statistics.
    func write<T>(durable: Bool = false, _ body: (SQLiteConnection) throws -> T) throws -> T {
        try lock.withLock { _ in
            if durable { try execute(sql: "PRAGMA synchronous = FULL") }
            defer { if durable { try? execute(sql: "PRAGMA synchronous = NORMAL") } }
            try execute(sql: "BEGIN IMMEDIATE")
            do {
                let result = try body(self)
                try execute(sql: "COMMIT")
                return result
            } catch {
                try? execute(sql: "ROLLBACK")
                throw error
            }
        }
    }

    /// Runs `sql` (one statement) with `arguments` bound in order.
    func execute(sql: String, arguments: StatementArguments = []) throws(SQLiteError) {
        let statement = try prepare(sql, arguments)
        defer { sqlite3_finalize(statement) }
        while true {
            let code = sqlite3_step(statement)
            if code == SQLITE_DONE { return }
            guard code == SQLITE_ROW else { throw failure(code) }
        }
    }

    /// Every row `sql` answers.
    func rows(sql: String, arguments: StatementArguments = []) throws(SQLiteError) -> [Row] {
        let statement = try prepare(sql, arguments)
        defer { sqlite3_finalize(statement) }
        var rows: [Row] = []
        while true {
            let code = sqlite3_step(statement)
            if code == SQLITE_DONE { return rows }
            guard code == SQLITE_ROW else { throw failure(code) }
            var row = Row()
            for column in 0..<sqlite3_column_count(statement) {
                let name = String(cString: sqlite3_column_name(statement, column))
                switch sqlite3_column_type(statement, column) {
                case SQLITE_INTEGER: row.values[name] = .integer(sqlite3_column_int64(statement, column))
                case SQLITE_FLOAT: row.values[name] = .real(sqlite3_column_double(statement, column))
                case SQLITE_TEXT, SQLITE_BLOB:
                    guard let text = sqlite3_column_text(statement, column) else { throw failure(SQLITE_NOMEM) }
                    row.values[name] = .text(String(cString: text))
                default: break  // NULL: absent
                }
            }
            rows.append(row)
        }
    }

    var lastInsertedRowID: Int64 { sqlite3_last_insert_rowid(handle) }

    /// Applies the migrations not yet applied, in order, each in its own transaction.
    func migrate(_ migrations: [(identifier: String, sql: [String])]) throws {
        try lock.withLock { _ in
            try execute(sql: "CREATE TABLE IF NOT EXISTS grdb_migrations (identifier TEXT NOT NULL PRIMARY KEY)")
            let applied = Set(
                try rows(sql: "SELECT identifier FROM grdb_migrations").compactMap { $0["identifier"] as String? })
            for migration in migrations where !applied.contains(migration.identifier) {
                try execute(sql: "BEGIN IMMEDIATE")
                do {
                    for statement in migration.sql { try execute(sql: statement) }
                    try execute(
                        sql: "INSERT INTO grdb_migrations (identifier) VALUES (?)", arguments: [migration.identifier])
                    try execute(sql: "COMMIT")
                } catch {
                    try? execute(sql: "ROLLBACK")
                    throw error
                }
            }
        }
    }

    /// Checkpoints the WAL into the database file and empties it.
    func checkpoint() {
        lock.withLock { _ in _ = sqlite3_wal_checkpoint_v2(handle, nil, SQLITE_CHECKPOINT_TRUNCATE, nil, nil) }
    }

    private func prepare(_ sql: String, _ arguments: StatementArguments) throws(SQLiteError) -> OpaquePointer {
        var statement: OpaquePointer?
        let code = sqlite3_prepare_v2(handle, sql, -1, &statement, nil)
        guard code == SQLITE_OK, let statement else { throw failure(code) }
        for (index, value) in arguments.values.enumerated() {
            let position = Int32(index + 1)
            let bound: Int32
            switch value?.sqliteValue {
            case nil: bound = sqlite3_bind_null(statement, position)
            case .integer(let v): bound = sqlite3_bind_int64(statement, position, v)
            case .real(let v):
                // NaN would be stored as NULL, infinities as numbers no reader expects.
                guard v.isFinite else {
                    sqlite3_finalize(statement)
                    throw SQLiteError(
                        code: SQLITE_MISMATCH, message: "refused a non-finite number for parameter \(index + 1)")
                }
                bound = sqlite3_bind_double(statement, position, v)
            case .text(let v):
                // Bound as a C string, text would silently end at a NUL: refused instead.
                guard !v.utf8.contains(0) else {
                    sqlite3_finalize(statement)
                    throw SQLiteError(
                        code: SQLITE_MISMATCH, message: "refused text with a NUL character for parameter \(index + 1)")
                }
                bound = sqlite3_bind_text(statement, position, v, -1, Self.transient)
            }
            guard bound == SQLITE_OK else {
                sqlite3_finalize(statement)
                throw failure(bound)
            }
        }
        return statement
    }

    private func failure(_ code: Int32) -> SQLiteError {
        SQLiteError(code: code, message: String(cString: sqlite3_errmsg(handle)))
    }

    /// `SQLITE_TRANSIENT`: SQLite copies the bound text (a macro Swift does not import).
    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
}

/// An SQLite error: its result code and message.
struct SQLiteError: Error, CustomStringConvertible {
    var code: Int32
    var message: String
    /// The primary result code (without the extended part).
    var primary: Int32 { code & 0xff }
    var isCorrupt: Bool { primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB }
    /// Another connection (another process) holds the database locked past the busy timeout.
    var isLocked: Bool { primary == SQLITE_BUSY || primary == SQLITE_LOCKED }
    var description: String { "SQLite error \(code): \(message)" }
}

/// A column value as SQLite stores it.
enum SQLiteValue: Sendable, Hashable {
    case integer(Int64)
    case real(Double)
    case text(String)
}

/// What can be bound to a statement and read from a row.
protocol SQLiteConvertible {
    var sqliteValue: SQLiteValue { get }
    init?(_ value: SQLiteValue)
}

extension String: SQLiteConvertible {
    var sqliteValue: SQLiteValue { .text(self) }
    init?(_ value: SQLiteValue) {
        guard case .text(let v) = value else { return nil }
        self = v
    }
}

extension Int64: SQLiteConvertible {
    var sqliteValue: SQLiteValue { .integer(self) }
    init?(_ value: SQLiteValue) {
        switch value {
        case .integer(let v): self = v
        case .real(let v):
            // A hand-edited or damaged file may hold any real: out of range is no value, not a trap.
            guard let exact = Int64(exactly: v.rounded(.towardZero)) else { return nil }
            self = exact
        case .text: return nil
        }
    }
}

extension Int: SQLiteConvertible {
    var sqliteValue: SQLiteValue { .integer(Int64(self)) }
    init?(_ value: SQLiteValue) {
        guard let v = Int64(value) else { return nil }
        self = Int(v)
    }
}

extension Double: SQLiteConvertible {
    var sqliteValue: SQLiteValue { .real(self) }
    init?(_ value: SQLiteValue) {
        switch value {
        case .integer(let v): self = Double(v)
        case .real(let v): self = v
        case .text: return nil
        }
    }
}

/// Arguments bound in order (`nil`: NULL).
struct StatementArguments: ExpressibleByArrayLiteral {
    var values: [(any SQLiteConvertible)?]
    init(arrayLiteral elements: (any SQLiteConvertible)?...) { values = elements }
    init(_ values: [(any SQLiteConvertible)?]) { self.values = values }
}

/// One row, by column name.
struct Row {
    var values: [String: SQLiteValue] = [:]

    /// A column that may be NULL.
    subscript<T: SQLiteConvertible>(_ column: String) -> T? {
        values[column].flatMap(T.init)
    }

    /// A column that must have a value of its type (`NOT NULL` in the schema): throws when a
    /// hand-edited or damaged file has none there, so the row is left out rather than read as
    /// zeros or empty text.
    func required<T: SQLiteConvertible>(_ column: String) throws(SQLiteError) -> T {
        guard let value = values[column].flatMap(T.init) else {
            throw SQLiteError(
                code: SQLITE_MISMATCH,
                message: "column \(column) has no \(T.self) value (the file was edited or damaged)")
        }
        return value
    }
}
