import LMXCore

/// A pairing as stored, with when it was imported and last updated (Unix seconds).
public struct StoredPairing: Sendable, Hashable {
    public var pairing: Pairing
    public var createdAt: Double
    public var updatedAt: Double

    public init(pairing: Pairing, createdAt: Double, updatedAt: Double) {
        self.pairing = pairing
        self.createdAt = createdAt
        self.updatedAt = updatedAt
    }

    public var summary: PairingSummary {
        var summary = pairing.summary
        summary.createdAt = Timestamp.iso8601(createdAt)
        summary.updatedAt = Timestamp.iso8601(updatedAt)
        return summary
    }
}

/// The outcome of importing one pairing.
public struct PairingImport: Sendable, Hashable {
    public var stored: StoredPairing
    /// The pairing it updated, if it was already known (same instance, tunnel or LAN address).
    public var previous: Pairing?

    public var isUpdate: Bool { previous != nil }
}

extension AgentStore {
    /// Imports pairings in one transaction: all of them or none. A pairing of a server already
    /// paired (same pinned instance, same tunnel URL, or the same LAN address without a tunnel)
    /// updates that pairing and keeps its id.
    public func importPairings(_ pairings: [Pairing], at now: Double) throws -> [PairingImport] {
        try pool.write(durable: true) { db in
            var existing = try Self.fetchPairings(db)
            var results: [PairingImport] = []
            for pairing in pairings {
                if let index = existing.firstIndex(where: { $0.pairing.isSameServer(as: pairing) }) {
                    let old = existing[index]
                    var updated = StoredPairing(
                        pairing: old.pairing.updated(by: pairing), createdAt: old.createdAt, updatedAt: now)
                    updated.pairing.id = old.pairing.id
                    try Self.write(updated, db)
                    existing[index] = updated
                    results.append(PairingImport(stored: updated, previous: old.pairing))
                } else {
                    var fresh = StoredPairing(pairing: pairing, createdAt: now, updatedAt: now)
                    // Two different servers whose identities hash alike: keep ids unique.
                    while existing.contains(where: { $0.pairing.id == fresh.pairing.id }) {
                        fresh.pairing.id = Pairing.identifier(instance: fresh.pairing.id, wanURL: nil, lan: nil)
                    }
                    try Self.write(fresh, db)
                    existing.append(fresh)
                    results.append(PairingImport(stored: fresh, previous: nil))
                }
            }
            return results
        }
    }

    public func pairings() throws -> [StoredPairing] {
        try reader.read { db in try Self.fetchPairings(db) }
    }

    /// The pairing with this id, else the only one with this name.
    public static func match(_ idOrName: String, in all: [StoredPairing]) -> StoredPairing? {
        if let byID = all.first(where: { $0.pairing.id == idOrName }) { return byID }
        let byName = all.filter { $0.pairing.name == idOrName }
        return byName.count == 1 ? byName[0] : nil
    }

    /// Removes a pairing by id (or by name, when exactly one has it); returns what was removed.
    public func removePairing(_ idOrName: String) throws -> StoredPairing? {
        try pool.write(durable: true) { db in
            guard let match = Self.match(idOrName, in: try Self.fetchPairings(db)) else { return nil }
            try db.execute(sql: "DELETE FROM pairing WHERE id = ?", arguments: [match.pairing.id])
            for route in match.pairing.routes() {
                try db.execute(sql: "DELETE FROM route WHERE id = ? AND source = 'pairing'", arguments: [route.id])
                try db.execute(sql: "DELETE FROM tunnel_vouch WHERE tunnel_route = ?", arguments: [route.id])
            }
            return match
        }
    }

    static func write(_ stored: StoredPairing, _ db: SQLiteConnection) throws {
        let p = stored.pairing
        let c = p.wan?.credentials
        try db.execute(
            sql: """
                INSERT INTO pairing (id, name, format, wan_url, admin_key, api_key, cf_id, cf_secret, lan, instance,
                    expires_at, created_at, updated_at)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT(id) DO UPDATE SET name = excluded.name, format = excluded.format, wan_url = excluded.wan_url,
                    admin_key = excluded.admin_key, api_key = excluded.api_key, cf_id = excluded.cf_id,
                    cf_secret = excluded.cf_secret, lan = excluded.lan, instance = excluded.instance,
                    expires_at = excluded.expires_at, updated_at = excluded.updated_at
                """,
            arguments: [
                p.id, p.name, p.format.rawValue, p.wan?.url, c?.adminKey, c?.inferenceKey, c?.accessClientID,
                c?.accessClientSecret, p.lan?.description, p.instance, p.expiresAt, stored.createdAt, stored.updatedAt,
            ])
    }

    static func fetchPairings(_ db: SQLiteConnection) throws -> [StoredPairing] {
        // A row a hand edit or damage left without a required value is left out.
        try db.rows(sql: "SELECT * FROM pairing ORDER BY created_at, id").compactMap { row in try? storedPairing(row) }
    }

    static func storedPairing(_ row: Row) throws(SQLiteError) -> StoredPairing? {
        guard let format = PairingFormat(rawValue: try row.required("format")) else { return nil }
        let url: String? = row["wan_url"]
        let wan = url.map {
            WANEndpoint(
                url: $0,
                credentials: Credentials(
                    adminKey: row["admin_key"], inferenceKey: row["api_key"], accessClientID: row["cf_id"],
                    accessClientSecret: row["cf_secret"]))
        }
        let lanText: String? = row["lan"]
        let lan = lanText.flatMap { try? HostPort.parse($0, field: "lan") }
        let pairing = Pairing(
            name: row["name"], format: format, wan: wan, lan: lan, instance: row["instance"],
            expiresAt: row["expires_at"],
            id: try row.required("id"))
        return StoredPairing(
            pairing: pairing, createdAt: try row.required("created_at"), updatedAt: try row.required("updated_at"))
    }
}
