import CResolv
import LMXCore

#if canImport(Glibc)
import Glibc
#endif
#if canImport(Dispatch)
import Dispatch
#endif

/// A domain name read from a DNS message: its labels exactly as sent, and its text form (with
/// glibc's escapes) that can be asked for again.
public struct DNSName: Sendable, Hashable {
    public var labels: [[UInt8]]
    public var text: String

    /// The first label as text (a DNS-SD instance name: any UTF-8, dots and spaces included).
    public var firstLabel: String { labels.first.map { String(decoding: $0, as: UTF8.self) } ?? "" }
    /// Every label after the first, dotted (no escapes: the domain part of a service name).
    public var parentText: String {
        labels.dropFirst().map { String(decoding: $0, as: UTF8.self) }.joined(separator: ".")
    }
    /// Every label, dotted, without escapes.
    public var plainText: String { labels.map { String(decoding: $0, as: UTF8.self) }.joined(separator: ".") }
}

/// One resource record of an answer, the types DNS-SD uses.
public enum DNSRecordData: Sendable, Hashable {
    case pointer(DNSName)
    case service(priority: UInt16, weight: UInt16, port: UInt16, target: DNSName)
    case text([[UInt8]])
    case address(String)
    case other
}

public struct DNSRecord: Sendable, Hashable {
    /// The owner name in text form (lower case: DNS names compare without case).
    public var owner: String
    public var ttl: UInt32
    public var data: DNSRecordData
}

/// Why a unicast DNS question got no records.
public enum DNSFailure: Error, Sendable, Hashable, CustomStringConvertible {
    /// The name does not exist (NXDOMAIN).
    case noSuchName
    /// The name exists but has no record of that type.
    case noData
    /// No name server answered (or all refused): the network, or the server.
    case noAnswer
    /// This machine has no resolver configuration.
    case noConfiguration

    public var description: String {
        switch self {
        case .noSuchName: "no such name"
        case .noData: "no record of that type"
        case .noAnswer: "no DNS server answered"
        case .noConfiguration: "no DNS configuration (/etc/resolv.conf)"
        }
    }
}

/// Unicast DNS through the system's stub resolver (glibc's libresolv: the name servers, search
/// domains, timeout and attempts of /etc/resolv.conf) and its message parser.
public enum UnicastDNS {
    public static let typeA: Int32 = 1
    public static let typePTR: Int32 = 12
    public static let typeTXT: Int32 = 16
    public static let typeAAAA: Int32 = 28
    public static let typeSRV: Int32 = 33

    /// The search domains and the first name server of the system's configuration.
    public static func configuration() -> (searchDomains: [String], server: String?) {
        var domains = [CChar](repeating: 0, count: 2048)
        var server = [CChar](repeating: 0, count: 64)
        guard lmx_res_configuration(&domains, domains.count, &server, server.count) == 0 else { return ([], nil) }
        let text = String(decoding: domains.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let address = String(decoding: server.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return (text.split(separator: "\n").map(String.init), address.isEmpty ? nil : address)
    }

    /// Asks the configured name servers one question, on a thread of its own (the stub resolver
    /// blocks), giving up after `timeout` seconds per try.
    public static func query(_ name: String, type: Int32, timeout: Int = 2, attempts: Int = 1) async -> Result<
        [DNSRecord], DNSFailure
    > {
        await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                continuation.resume(
                    returning: querySynchronously(name, type: type, timeout: timeout, attempts: attempts))
            }
        }
    }

    static func querySynchronously(_ name: String, type: Int32, timeout: Int, attempts: Int) -> Result<
        [DNSRecord], DNSFailure
    > {
        var answer = [UInt8](repeating: 0, count: 9000)
        var error: Int32 = 0
        let length = lmx_res_query(name, type, Int32(timeout), Int32(attempts), &answer, Int32(answer.count), &error)
        guard length >= 0 else {
            switch error {
            case HOST_NOT_FOUND: return .failure(.noSuchName)
            case NO_DATA: return .failure(.noData)
            case NETDB_INTERNAL: return .failure(.noConfiguration)
            default: return .failure(.noAnswer)
            }
        }
        let records = parse(Array(answer.prefix(Int(min(length, Int32(answer.count))))))
        return .success(records)
    }

    /// Every record of a DNS message's answer and additional sections; nothing for bytes that
    /// are not a DNS message (parsed by libresolv, which checks every length against the end).
    public static func parse(_ message: [UInt8]) -> [DNSRecord] {
        message.withUnsafeBufferPointer { buffer -> [DNSRecord] in
            guard let base = buffer.baseAddress, buffer.count >= 12 else { return [] }
            var handle = ns_msg()
            guard ns_initparse(base, Int32(buffer.count), &handle) == 0 else { return [] }
            var records: [DNSRecord] = []
            for section in [ns_s_an, ns_s_ar] {
                let count = lmx_ns_msg_count(&handle, section)
                for index in 0..<max(0, count) {
                    var rr = ns_rr()
                    guard ns_parserr(&handle, section, Int32(index), &rr) == 0 else { break }
                    let owner = withUnsafeBytes(of: rr.name) { raw in
                        String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
                    }.lowercased()
                    let data = decode(&handle, rr, eom: base + buffer.count)
                    records.append(DNSRecord(owner: owner, ttl: rr.ttl, data: data))
                }
            }
            return records
        }
    }

    private static func decode(_ handle: inout ns_msg, _ rr: ns_rr, eom: UnsafePointer<UInt8>) -> DNSRecordData {
        guard let rdata = rr.rdata else { return .other }
        let length = Int(rr.rdlength)
        let start = handle._msg!
        switch Int32(rr.type) {
        case typePTR:
            return name(at: rdata, message: start, eom: eom).map { .pointer($0) } ?? .other
        case typeSRV:
            guard length >= 7 else { return .other }
            func word(_ offset: Int) -> UInt16 { UInt16(rdata[offset]) << 8 | UInt16(rdata[offset + 1]) }
            guard let target = name(at: rdata + 6, message: start, eom: eom) else { return .other }
            return .service(priority: word(0), weight: word(2), port: word(4), target: target)
        case typeTXT:
            var entries: [[UInt8]] = []
            var offset = 0
            while offset < length {
                let size = Int(rdata[offset])
                guard offset + 1 + size <= length else { break }
                entries.append(Array(UnsafeBufferPointer(start: rdata + offset + 1, count: size)))
                offset += 1 + size
            }
            return .text(entries)
        case typeA where length == 4, typeAAAA where length == 16:
            var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
            let family = length == 4 ? AF_INET : AF_INET6
            guard inet_ntop(family, rdata, &text, socklen_t(text.count)) != nil else { return .other }
            return .address(String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        default:
            return .other
        }
    }

    /// A (possibly compressed) name inside a message, as labels and as text.
    private static func name(at pointer: UnsafePointer<UInt8>, message: UnsafePointer<UInt8>, eom: UnsafePointer<UInt8>)
        -> DNSName?
    {
        var wire = [UInt8](repeating: 0, count: Int(NS_MAXCDNAME))
        guard ns_name_unpack(message, eom, pointer, &wire, wire.count) >= 0 else { return nil }
        var text = [CChar](repeating: 0, count: Int(NS_MAXDNAME))
        guard ns_name_ntop(wire, &text, text.count) >= 0 else { return nil }
        var labels: [[UInt8]] = []
        var offset = 0
        while offset < wire.count, wire[offset] != 0 {
            let size = Int(wire[offset])
            guard size < 64, offset + 1 + size <= wire.count else { return nil }
            labels.append(Array(wire[(offset + 1)..<(offset + 1 + size)]))
            offset += 1 + size
        }
        return DNSName(
            labels: labels, text: String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        )
    }
}
