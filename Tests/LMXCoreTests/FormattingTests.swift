import Foundation
import LMXCore
import Testing

private func server(name: String = "Local One") -> DiscoveredServer {
    let id = ServiceInstanceID(name: name, type: "_opta-lmx._tcp", domain: "local")
    let txt = TXTRecord(strings: ["path=/.well-known/opta-lmx", "service=opta-lmx", "flag"])
    return DiscoveredServer(
        id: id,
        records: [
            ResolvedRecord(
                key: RecordKey(instance: id, interface: NetworkInterface(index: 1, name: "lo"), ipProtocol: .ipv4),
                hostName: "lmx-testbed-root.local", address: "127.0.0.1", port: 4321, txt: txt),
            ResolvedRecord(
                key: RecordKey(instance: id, interface: NetworkInterface(index: 5, name: "lmxbr0"), ipProtocol: .ipv4),
                hostName: "lmx-testbed-root.local", address: "10.254.0.1", port: 4321, txt: txt),
        ])
}

@Suite("Output formats")
struct FormattingTests {
    @Test("--parsable lines match avahi-browse -rtp byte for byte, one per interface and protocol")
    func parsable() {
        #expect(
            ParsableFormat.lines(for: server()) == [
                #"=;lmxbr0;IPv4;Local\032One;_opta-lmx._tcp;local;lmx-testbed-root.local;10.254.0.1;4321;"flag" "service=opta-lmx" "path=/.well-known/opta-lmx""#,
                #"=;lo;IPv4;Local\032One;_opta-lmx._tcp;local;lmx-testbed-root.local;127.0.0.1;4321;"flag" "service=opta-lmx" "path=/.well-known/opta-lmx""#,
            ])
    }

    @Test("JSON has the documented fields; boolean TXT attributes are null; raw TXT is base64 in wire order")
    func json() throws {
        let data = try DiscoveryJSON.encoder().encode(ServerJSON(server()))
        let object = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        #expect(
            Set(object.keys) == [
                "name", "type", "domain", "host", "port", "addresses", "interfaces", "path", "txt", "txt_raw",
                "records", "found_by",
            ])
        #expect(object["name"] as? String == "Local One")
        #expect(object["found_by"] as? String == "mDNS on lmxbr0, lo")
        #expect(object["addresses"] as? [String] == ["10.254.0.1", "127.0.0.1"])
        let txt = try #require(object["txt"] as? [String: Any])
        #expect(txt["flag"] is NSNull)
        #expect(txt["service"] as? String == "opta-lmx")
        #expect(
            (object["txt_raw"] as? [String])?.first == Data("path=/.well-known/opta-lmx".utf8).base64EncodedString())
        let decoded = try JSONDecoder().decode(ServerJSON.self, from: data)
        #expect(decoded == ServerJSON(server()))
    }

    @Test("watch events are one line each with event, and server or state")
    func watchEvent() throws {
        let line = try DiscoveryEventJSON(.removed(server(), reason: .daemonLost), time: "t")
        let text = String(decoding: try DiscoveryJSON.encoder().encode(line), as: UTF8.self)
        #expect(!text.contains("\n"))
        #expect(text.hasPrefix(#"{"event":"removed","reason":"daemon-lost","server":{"#))
        let daemon = String(
            decoding: try DiscoveryJSON.encoder().encode(DiscoveryEventJSON(.daemon(.waiting(reason: "x")))),
            as: UTF8.self)
        #expect(daemon == #"{"event":"daemon","reason":"x","state":"waiting"}"#)
    }

    @Test("the table lists every endpoint and keeps control characters off the terminal")
    func table() {
        let text = ServerTable.render([server(name: "Evil\u{1B}[2Jname")])
        let lines = text.split(separator: "\n")
        #expect(lines.first?.hasPrefix("NAME") == true)
        #expect(lines[1].contains("10.254.0.1:4321, 127.0.0.1:4321"))
        #expect(!text.contains("\u{1B}"))
        #expect(text.contains("Evil\\x1b[2Jname"))
    }
}

@Suite("Exit codes: one list, the documented one")
struct ExitStatusTests {
    @Test("docs/exit-codes.md has a row for every named exit code and none other")
    func documented() throws {
        let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let table = try String(contentsOf: repository.appendingPathComponent("docs/exit-codes.md"), encoding: .utf8)
        let rows = table.split(separator: "\n").compactMap { line -> Int32? in
            let cells = line.split(separator: "|", omittingEmptySubsequences: true)
            guard line.hasPrefix("| "), let first = cells.first else { return nil }
            return Int32(first.trimmingCharacters(in: .whitespaces))
        }
        #expect(Set(rows) == Set(ExitStatus.allCases.map(\.rawValue)), "\(rows)")
        #expect(rows.count == ExitStatus.allCases.count)
    }
}

@Suite("The Date header's text (RFC 9110 IMF-fixdate) without a calendar")
struct HTTPDateTests {
    @Test("known instants, leap days and the edges of the four-digit years")
    func knownInstants() {
        #expect(HTTPDate.format(unixSeconds: 0) == "Thu, 01 Jan 1970 00:00:00 GMT")
        #expect(HTTPDate.format(unixSeconds: 784_111_777) == "Sun, 06 Nov 1994 08:49:37 GMT")  // RFC 9110's example
        #expect(HTTPDate.format(unixSeconds: 951_782_400) == "Tue, 29 Feb 2000 00:00:00 GMT")
        #expect(HTTPDate.format(unixSeconds: 4_107_542_399) == "Sun, 28 Feb 2100 23:59:59 GMT")
        #expect(HTTPDate.format(unixSeconds: 4_107_542_400) == "Mon, 01 Mar 2100 00:00:00 GMT")
        #expect(HTTPDate.format(unixSeconds: -1) == "Wed, 31 Dec 1969 23:59:59 GMT")
        #expect(HTTPDate.format(unixSeconds: .min) == "Mon, 01 Jan 0001 00:00:00 GMT")
        #expect(HTTPDate.format(unixSeconds: .max) == "Fri, 31 Dec 9999 23:59:59 GMT")
    }

    @Test("agrees with Foundation's formatter over a spread of instants")
    func agreesWithFoundation() {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        var t: Int64 = -2_208_988_800  // 1900
        while t < 4_102_444_800 {  // 2100
            #expect(HTTPDate.format(unixSeconds: t) == formatter.string(from: Date(timeIntervalSince1970: Double(t))))
            t += 7_919_993  // about three months, a prime number of seconds: every weekday and hour comes
        }
    }
}
