#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The stable JSON shape of a discovered server (`lmx-discover --json`, `--watch`).
/// Field names are part of the public interface: add fields, never rename them.
public struct ServerJSON: Codable, Sendable, Hashable {
    /// The instance name, unescaped.
    public var name: String
    public var type: String
    public var domain: String
    /// The SRV target host name.
    public var host: String
    public var port: UInt16
    /// Every address, IPv4 first; IPv6 link-local carries `%ifname`.
    public var addresses: [String]
    public var interfaces: [String]
    /// The discovery document path (TXT `path`, default `/.well-known/opta-lmx`).
    public var path: String
    /// TXT attributes, first occurrence wins; `null` for a key without `=`; values that are not
    /// UTF-8 are repaired (exact bytes are in `txt_raw`).
    public var txt: [String: String?]
    /// Every TXT entry in wire order, base64.
    public var txtRaw: [String]
    /// One entry per interface and protocol the server was resolved on.
    public var records: [Record]
    /// What a probe by the LMX contract found (`lmx-discover --probe` only).
    public var probe: ProbeJSON?
    /// Where it was found: "mDNS on eth0" or "DNS domain example.lan".
    public var foundBy: String?

    /// The result of probing a discovered server.
    public struct ProbeJSON: Codable, Sendable, Hashable {
        public var url: String
        public var verdict: HealthVerdict
        public var detail: String?
        public var instanceID: String?
        public var version: String?
        public var models: Int?
        public var latencyMS: Double

        enum CodingKeys: String, CodingKey {
            case url, verdict, detail
            case instanceID = "instance_id"
            case version, models
            case latencyMS = "latency_ms"
        }

        public init(url: String, report: ProbeReport) {
            self.url = url
            verdict = report.verdict
            detail = report.detail
            instanceID = report.instanceID
            version = report.version
            models = report.modelCount
            latencyMS = (report.latency * 10_000).rounded() / 10
        }
    }

    public struct Record: Codable, Sendable, Hashable {
        public var interface: String
        public var `protocol`: IPProtocol
        public var address: String
        public var host: String
        public var port: UInt16
    }

    enum CodingKeys: String, CodingKey {
        case name, type, domain, host, port, addresses, interfaces, path, txt
        case txtRaw = "txt_raw"
        case records, probe
        case foundBy = "found_by"
    }

    public init(_ server: DiscoveredServer) {
        name = server.id.name
        type = server.id.type
        domain = server.id.domain
        host = server.hostName
        port = server.port
        addresses = server.addresses
        interfaces = server.interfaces
        path = server.servicePath
        var txt: [String: String?] = [:]
        for attribute in server.txt.attributes { txt[attribute.key] = .some(attribute.text) }
        self.txt = txt
        txtRaw = server.txt.entries.map { Data($0).base64EncodedString() }
        records = server.records.map {
            Record(
                interface: $0.key.interface.name, protocol: $0.key.ipProtocol,
                address: $0.address, host: $0.hostName, port: $0.port)
        }
        foundBy = server.foundBy
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(name, forKey: .name)
        try container.encode(type, forKey: .type)
        try container.encode(domain, forKey: .domain)
        try container.encode(host, forKey: .host)
        try container.encode(port, forKey: .port)
        try container.encode(addresses, forKey: .addresses)
        try container.encode(interfaces, forKey: .interfaces)
        try container.encode(path, forKey: .path)
        // Encode optionals explicitly so boolean attributes appear as null, not vanish.
        var txtContainer = container.nestedContainer(keyedBy: AnyKey.self, forKey: .txt)
        for (key, value) in txt.sorted(by: { $0.key < $1.key }) {
            if let value {
                try txtContainer.encode(value, forKey: AnyKey(key))
            } else {
                try txtContainer.encodeNil(forKey: AnyKey(key))
            }
        }
        try container.encode(txtRaw, forKey: .txtRaw)
        try container.encode(records, forKey: .records)
        try container.encodeIfPresent(probe, forKey: .probe)
        try container.encodeIfPresent(foundBy, forKey: .foundBy)
    }

    struct AnyKey: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(_ string: String) { stringValue = string }
        init?(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }
}

/// One line of `lmx-discover --watch`.
public struct DiscoveryEventJSON: Encodable, Sendable {
    public var event: String
    public var time: String?
    public var server: ServerJSON?
    public var changes: [ServerChange]?
    public var reason: String?
    public var state: String?

    public init(_ event: DiscoveryEvent, time: String? = nil) {
        self.time = time
        switch event {
        case .added(let server):
            self.event = "added"
            self.server = ServerJSON(server)
        case .updated(let server, let changes):
            self.event = "updated"
            self.server = ServerJSON(server)
            self.changes = changes.sorted()
        case .removed(let server, let reason):
            self.event = "removed"
            self.server = ServerJSON(server)
            self.reason = reason.rawValue
        case .daemon(let state):
            self.event = "daemon"
            self.state = state.name
            if case .waiting(let why) = state { self.reason = why }
        }
    }

    enum CodingKeys: String, CodingKey { case event, time, state, reason, changes, server }
}

public enum DiscoveryJSON {
    /// Compact, one object per line, stable key order.
    public static func encoder(pretty: Bool = false) -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting =
            pretty ? [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes] : [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }
}
