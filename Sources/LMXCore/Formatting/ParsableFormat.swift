/// The resolved-line format of `avahi-browse -rtp`, byte for byte:
/// `=;iface;proto;escaped-name;type;domain;host;address;port;"txt" "txt"`.
public enum ParsableFormat {
    /// One line per interface and protocol the server was resolved on.
    public static func lines(for server: DiscoveredServer) -> [String] {
        server.records.map(line)
    }

    public static func line(_ record: ResolvedRecord) -> String {
        // avahi-browse prints the address without an IPv6 scope; keep scripts' parsing intact.
        let address = record.address.split(separator: "%", maxSplits: 1).first.map(String.init) ?? record.address
        return [
            "=",
            record.key.interface.name,
            record.key.ipProtocol.rawValue,
            DNSSDText.escapeLabel(record.key.instance.name),
            record.key.instance.type,
            record.key.instance.domain,
            record.hostName,
            address,
            String(record.port),
            DNSSDText.quoteTXT(record.txt),
        ].joined(separator: ";")
    }
}
