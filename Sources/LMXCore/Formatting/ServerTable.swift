/// The human table of `lmx-discover`.
public enum ServerTable {
    public static let headers = ["NAME", "ADDRESS:PORT", "HOST", "INTERFACES", "PATH"]

    public static func render(_ servers: [DiscoveredServer], probes: [ServiceInstanceID: ProbeReport]? = nil) -> String
    {
        let rows = servers.map { server in
            var row = [
                printable(server.name),
                server.endpoints.joined(separator: ", "),
                printable(server.hostName),
                server.interfaces.joined(separator: ","),
                printable(server.servicePath),
            ]
            if let probes {
                let report = probes[server.id]
                row += [
                    report.map { EventWords.label($0.verdict) } ?? "-",
                    report?.version.map(printable) ?? "-",
                    report?.instanceID.map(printable) ?? "-",
                    report?.modelCount.map(String.init) ?? "-",
                    report.map { "\(($0.latency * 10_000).rounded() / 10) ms" } ?? "-",
                ]
            }
            return row
        }
        let columns = probes == nil ? headers : headers + ["STATE", "VERSION", "INSTANCE", "MODELS", "LATENCY"]
        return TextTable.render(headers: columns, rows: rows)
    }

    private static let invisible: Set<UInt32> = [
        0x200E, 0x200F, 0x2028, 0x2029, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E,
        0x2066, 0x2067, 0x2068, 0x2069, 0xFEFF,
    ]

    /// Control characters in names from the network must not reach a terminal or a log as-is:
    /// C0 and C1 controls become `\xNN`, bidirectional controls and line separators `\u{NNNN}`.
    public static func printable(_ text: String) -> String {
        var out = ""
        for scalar in text.unicodeScalars {
            if scalar.value < 0x20 || (0x7F..<0xA0).contains(scalar.value) {
                out += "\\x" + String(scalar.value, radix: 16, uppercase: false).leftPadded(to: 2)
            } else if Self.invisible.contains(scalar.value) {
                // Bidirectional overrides and line separators rewrite what a terminal or log shows.
                out += "\\u{" + String(scalar.value, radix: 16, uppercase: false) + "}"
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        return out
    }
}

/// A left-aligned plain-text table with two spaces between columns.
public enum TextTable {
    public static func render(headers: [String], rows: [[String]]) -> String {
        let all = [headers] + rows
        var widths = headers.map(\.count)
        for row in all {
            for (i, cell) in row.enumerated() where i < widths.count {
                widths[i] = max(widths[i], cell.count)
            }
        }
        return all.map { row in
            row.enumerated().map { i, cell in
                i == row.count - 1 ? cell : cell + String(repeating: " ", count: widths[i] - cell.count)
            }.joined(separator: "  ")
        }.joined(separator: "\n")
    }
}

extension String {
    func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
