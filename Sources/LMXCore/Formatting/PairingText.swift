/// Human output for pairings: secrets as "set", never their values.
extension PairingSummary {
    public func describe(verb: String?) -> String {
        var lines: [String] = []
        lines.append([verb, id, name.map { "\"\($0)\"" }, "(\(format.rawValue))"].compactMap { $0 }.joined(separator: " "))
        if let url {
            let route = routes?.first { $0.via == .wan }
            lines.append("  tunnel    \(url)\(route.map { "  \($0.verdictText)" } ?? "")")
            let names = [("admin_key", "admin key"), ("api_key", "api key"), ("cf_access", "access token")]
            lines.append("  secrets   " + names.map { "\($0.1): \(secrets.contains($0.0) ? "set" : "not set")" }.joined(separator: ", "))
        }
        if let lan {
            let route = routes?.first { $0.via == .lan }
            lines.append("  lan       http://\(lan)\(route.map { "  \($0.verdictText)" } ?? "")")
        }
        if let instance { lines.append("  instance  \(instance)") }
        if let expiresAt { lines.append("  expires   \(expiresAt)") }
        return lines.joined(separator: "\n")
    }
}

extension PairingRouteState {
    /// `[ready, active]`, or the verdict with its detail.
    public var verdictText: String {
        guard let verdict else { return "[not probed yet]" }
        var text = "[\(verdict.rawValue)\(active ? ", active" : "")]"
        if let detail, verdict != .ready { text += " \(detail)" }
        return text
    }
}
