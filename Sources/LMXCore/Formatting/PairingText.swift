/// Human output for pairings: secrets as "set", never their values.
extension PairingSummary {
    public func describe(verb: String?) -> String {
        var lines: [String] = []
        lines.append(
            [verb, id, name.map { "\"\($0)\"" }, "(\(format.rawValue))"].compactMap { $0 }.joined(separator: " "))
        if let url {
            let route = routes?.first { $0.via == .wan }
            lines.append("  tunnel    \(url)\(route.map { "  \($0.verdictText)" } ?? "")")
            let names = [("admin_key", "admin key"), ("api_key", "api key"), ("cf_access", "access token")]
            lines.append(
                "  secrets   "
                    + names.map { "\($0.1): \(secrets.contains($0.0) ? "set" : "not set")" }.joined(separator: ", "))
        }
        if let lan {
            let route = routes?.first { $0.via == .lan }
            lines.append("  lan       http://\(lan)\(route.map { "  \($0.verdictText)" } ?? "")")
            if lanIsName, url != nil, !secrets.filter({ $0 != "cf_access" }).isEmpty {
                lines.append(
                    "            a host name: whoever answers for it on the LAN could claim it, so it gets no keys over"
                )
                lines.append("            plain HTTP; the server's addresses its tunnel vouches for get them")
            }
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
        var text = "[\(EventWords.label(verdict))\(active ? ", active" : "")]"
        if let detail, verdict != .ready { text += " \(detail)" }
        return text
    }
}

extension PairingSummary {
    /// The LAN hint is a host name, not an IP address literal (`[v6]:port` or `v4:port`).
    public var lanIsName: Bool {
        guard let lan, let host = try? HostPort.parseAuthority(lan, field: "lan").host else { return false }
        return IPAddress.bytes(host) == nil
    }
}
