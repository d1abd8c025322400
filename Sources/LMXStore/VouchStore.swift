import LMXCore

/// What a tunnel vouched for when it was last read: its server's LAN base URLs and instance.
public struct StoredVouch: Sendable, Hashable {
    public var tunnelRouteID: String
    public var baseURLs: [String]
    public var instanceID: String?
    public var updatedAt: Double

    public init(tunnelRouteID: String, baseURLs: [String], instanceID: String?, updatedAt: Double) {
        self.tunnelRouteID = tunnelRouteID
        self.baseURLs = baseURLs
        self.instanceID = instanceID
        self.updatedAt = updatedAt
    }
}

extension AgentStore {
    /// Keeps what a tunnel vouches for (replacing what it vouched for before).
    public func saveVouch(_ vouch: StoredVouch) throws {
        try pool.write { db in
            try db.execute(
                sql: """
                    INSERT INTO tunnel_vouch (tunnel_route, instance_id, base_urls, updated_at) VALUES (?, ?, ?, ?)
                    ON CONFLICT(tunnel_route) DO UPDATE SET instance_id = excluded.instance_id,
                        base_urls = excluded.base_urls, updated_at = excluded.updated_at
                    """,
                arguments: [
                    vouch.tunnelRouteID, vouch.instanceID, vouch.baseURLs.joined(separator: " "), vouch.updatedAt,
                ])
        }
    }

    public func deleteVouch(tunnelRouteID: String) throws {
        try pool.write { db in
            try db.execute(sql: "DELETE FROM tunnel_vouch WHERE tunnel_route = ?", arguments: [tunnelRouteID])
        }
    }

    public func vouches() throws -> [StoredVouch] {
        try reader.read { db in
            try db.rows(sql: "SELECT * FROM tunnel_vouch ORDER BY tunnel_route").compactMap { row -> StoredVouch? in
                guard let tunnel: String = row["tunnel_route"], let urls: String = row["base_urls"] else { return nil }
                return StoredVouch(
                    tunnelRouteID: tunnel, baseURLs: urls.split(separator: " ").map(String.init),
                    instanceID: row["instance_id"],
                    updatedAt: row["updated_at"] ?? 0)
            }
        }
    }
}
