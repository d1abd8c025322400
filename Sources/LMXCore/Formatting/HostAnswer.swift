/// What one address said about itself when asked by the LMX contract (`lmx-discover --host`,
/// `lmx-pair --host`): first contact where nothing is announced. Field names are part of the
/// JSON interface.
public struct HostAnswer: Codable, Sendable, Hashable {
    /// The address asked, `host:port`.
    public var address: String
    public var url: String
    public var verdict: HealthVerdict
    public var detail: String?
    public var instanceID: String?
    public var version: String?
    public var ready: Bool?
    public var models: Int?
    public var loadedModels: [String]?
    public var securityProfile: String?
    public var adminKeyRequired: Bool?
    public var inferenceKeyRequired: Bool?
    /// The server's own base URLs (its discovery document's `endpoints`), as it sent them.
    public var baseURLs: [String]?
    public var latencyMS: Double

    enum CodingKeys: String, CodingKey {
        case address, url, verdict, detail
        case instanceID = "instance_id"
        case version, ready, models
        case loadedModels = "loaded_models"
        case securityProfile = "security_profile"
        case adminKeyRequired = "admin_key_required"
        case inferenceKeyRequired = "inference_key_required"
        case baseURLs = "base_urls"
        case latencyMS = "latency_ms"
    }

    public init(address: HostPort, report: ProbeReport) {
        self.address = address.description
        url = "http://\(address.description)"
        verdict = report.verdict
        detail = report.detail
        instanceID = report.instanceID
        version = report.version
        ready = report.ready
        models = report.modelCount
        loadedModels = report.models
        securityProfile = report.securityProfile
        adminKeyRequired = report.adminKeyRequired
        inferenceKeyRequired = report.inferenceKeyRequired
        baseURLs = report.advertisedBaseURLs
        latencyMS = (report.latency * 10_000).rounded() / 10
    }

    /// An Opta LMX server answered (maybe not ready, busy or asking for keys).
    public var isServer: Bool { verdict.isAlive || verdict == .authRejected }

    /// For people: what answered, and what the server says about itself.
    public var text: String {
        let what: String =
            switch verdict {
            case .ready: "an Opta LMX server, ready"
            case .aliveNotReady: "an Opta LMX server, not ready (starting, or no model loaded)"
            case .overloaded: "an Opta LMX server, overloaded (it asked to come back later)"
            case .authRejected: "an Opta LMX server that refused the keys (pair it with its code to get them)"
            case .tunnelDown: "a tunnel whose server is down"
            case .wrongService: "something that is not an Opta LMX server"
            case .down: "no Opta LMX server"
            }
        var lines = ["\(url): \(what)\(detail.map { " — \($0)" } ?? "") (\(formatMS(latencyMS)) ms)"]
        func row(_ label: String, _ value: String?) {
            guard let value, !value.isEmpty else { return }
            lines.append("  \(label)\(String(repeating: " ", count: max(1, 13 - label.count)))\(value)")
        }
        row("instance_id", instanceID.map(ServerTable.printable))
        row("version", version.map(ServerTable.printable))
        row("ready", ready.map { $0 ? "yes" : "no" })
        row(
            "models",
            models.map { count in
                let names = (loadedModels ?? []).prefix(5).map(ServerTable.printable).joined(separator: ", ")
                return names.isEmpty ? "\(count)" : "\(count): \(names)"
            })
        row("profile", securityProfile.map(ServerTable.printable))
        var keys: [String] = []
        if adminKeyRequired == true { keys.append("admin key") }
        if inferenceKeyRequired == true { keys.append("inference key") }
        if adminKeyRequired != nil || inferenceKeyRequired != nil {
            row("keys needed", keys.isEmpty ? "none" : keys.joined(separator: ", "))
        }
        row("base URLs", baseURLs.map { $0.prefix(8).map(ServerTable.printable).joined(separator: ", ") })
        if isServer {
            lines.append("  pair it: sudo lmx-pair --host \(address)")
        }
        return lines.joined(separator: "\n")
    }

    private func formatMS(_ value: Double) -> String {
        value >= 10 ? String(Int(value.rounded())) : String((value * 10).rounded() / 10)
    }
}
