import LMXCore
import LMXSystem

#if canImport(Glibc)
import Glibc
#endif
#if canImport(Dispatch)
import Dispatch
#endif

/// What one host said to a direct mDNS question.
public struct DirectAnswer: Sendable, Hashable {
    /// The host that answered.
    public var responder: String
    /// The instance names it listed.
    public var instances: [String]
    /// The ports its SRV records name, by instance name in lower case.
    public var ports: [String: UInt16]
}

/// Asks the link itself, without avahi-daemon: one mDNS question for a service type sent to
/// 224.0.0.251:5353 from an ordinary port (a "legacy unicast" query, RFC 6762 §6.7), which every
/// responder answers by unicast to that port. Answers arrive even when this machine's firewall
/// drops UDP port 5353 coming in, which is what tells that case apart from a network that does
/// not carry mDNS between hosts.
public enum DirectQuery {
    /// Sends the question from `source` (an IPv4 address of the interface to ask on) and collects
    /// answers for `wait` seconds.
    public static func ask(
        from source: String, type: String = BrowseConfiguration.defaultServiceType, wait: Double = 1
    ) async -> Result<[DirectAnswer], SystemCallFailure> {
        await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                continuation.resume(returning: askSynchronously(from: source, type: type, wait: wait))
            }
        }
    }

    /// A socket call that failed, in words.
    public struct SystemCallFailure: Error, Sendable, Hashable, CustomStringConvertible {
        public var description: String
    }

    static func question(_ type: String) -> [UInt8] {
        var bytes: [UInt8] = [0x4c, 0x4d, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
        for label in "\(type).local".split(separator: ".") {
            let raw = Array(label.utf8.prefix(63))
            bytes.append(UInt8(raw.count))
            bytes += raw
        }
        bytes += [0, 0, 12, 0, 1]  // root, type PTR, class IN
        return bytes
    }

    static func askSynchronously(from source: String, type: String, wait: Double) -> Result<
        [DirectAnswer], SystemCallFailure
    > {
        func failure(_ what: String) -> Result<[DirectAnswer], SystemCallFailure> {
            .failure(SystemCallFailure(description: "\(what): \(String(cString: strerror(errno)))"))
        }
        var local = in_addr()
        guard inet_pton(AF_INET, source, &local) == 1 else {
            return .failure(SystemCallFailure(description: "not an IPv4 address: \(source)"))
        }
        let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return failure("socket") }
        defer { close(fd) }
        var bindAddress = sockaddr_in()
        bindAddress.sin_family = sa_family_t(AF_INET)
        bindAddress.sin_addr = local
        let bound = withUnsafePointer(to: &bindAddress) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0 else { return failure("bind to \(source)") }
        guard setsockopt(fd, Int32(IPPROTO_IP), IP_MULTICAST_IF, &local, socklen_t(MemoryLayout<in_addr>.size)) == 0
        else { return failure("IP_MULTICAST_IF") }
        var group = sockaddr_in()
        group.sin_family = sa_family_t(AF_INET)
        group.sin_port = in_port_t(5353).bigEndian
        inet_pton(AF_INET, "224.0.0.251", &group.sin_addr)
        let packet = question(type)
        let sent = packet.withUnsafeBytes { bytes in
            withUnsafePointer(to: &group) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    sendto(fd, bytes.baseAddress, bytes.count, 0, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
        }
        guard sent == packet.count else { return failure("send to 224.0.0.251:5353 from \(source)") }

        var answers: [String: DirectAnswer] = [:]
        let deadline = SystemClock.monotonic() + wait
        let listName = "\(type).local".lowercased()
        var buffer = [UInt8](repeating: 0, count: 9000)
        while answers.count < 256 {
            let left = deadline - SystemClock.monotonic()
            if left <= 0 { break }
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&poller, 1, Int32(max(1, left * 1000)))
            if ready < 0 && errno == EINTR { continue }
            guard ready > 0 else { break }
            var from = sockaddr_in()
            var fromLength = socklen_t(MemoryLayout<sockaddr_in>.size)
            let count = buffer.withUnsafeMutableBytes { bytes in
                withUnsafeMutablePointer(to: &from) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        recvfrom(fd, bytes.baseAddress, bytes.count, 0, $0, &fromLength)
                    }
                }
            }
            guard count > 12 else { continue }
            // Answers only (QR set): our own question looped back is not an answer.
            guard buffer[2] & 0x80 != 0 else { continue }
            var text = [CChar](repeating: 0, count: Int(INET_ADDRSTRLEN))
            inet_ntop(AF_INET, &from.sin_addr, &text, socklen_t(text.count))
            let responder = String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            let records = UnicastDNS.parse(Array(buffer.prefix(count)))
            var answer = answers[responder] ?? DirectAnswer(responder: responder, instances: [], ports: [:])
            for record in records {
                switch record.data {
                case .pointer(let target) where record.owner == listName:
                    if !answer.instances.contains(target.firstLabel) { answer.instances.append(target.firstLabel) }
                case .service(_, _, let port, _):
                    let name = DNSName.firstLabel(ofText: record.owner)
                    answer.ports[name] = port
                default:
                    break
                }
            }
            answers[responder] = answer
        }
        return .success(answers.values.filter { !$0.instances.isEmpty }.sorted { $0.responder < $1.responder })
    }
}

extension DNSName {
    /// The first label of a name in glibc's text form (escapes undone), lower case as owners are.
    static func firstLabel(ofText text: String) -> String {
        var label = ""
        var escaped = false
        for character in text {
            if escaped {
                label.append(character)
                escaped = false
            } else if character == "\\" {
                escaped = true
                label.append(character)
            } else if character == "." {
                break
            } else {
                label.append(character)
            }
        }
        return DNSSDText.unescapeLabel(label)
    }
}
