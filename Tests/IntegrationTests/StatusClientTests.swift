import Foundation
import LMXStatusClient
import Testing

/// A one-shot Unix-socket server that answers every connection with fixed bytes (a hostile or
/// broken "agent"), optionally dripping them slowly.
private final class CannedServer: @unchecked Sendable {
    let path: String
    private let fd: Int32

    init(answer: [UInt8], drip: Double? = nil) throws {
        path = "/tmp/lmx-canned-\(UUID().uuidString.prefix(8)).sock"
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard bound == 0, listen(fd, 8) == 0 else { throw POSIXError(.EADDRINUSE) }
        let listener = fd
        Thread.detachNewThread {
            while true {
                let client = accept(listener, nil, nil)
                guard client >= 0 else { return }
                var scratch = [UInt8](repeating: 0, count: 4096)
                _ = recv(client, &scratch, scratch.count, 0)
                if let drip {
                    for byte in answer {
                        var b = byte
                        if send(client, &b, 1, Int32(MSG_NOSIGNAL)) <= 0 { break }
                        Thread.sleep(forTimeInterval: drip)
                    }
                } else {
                    _ = answer.withUnsafeBytes { send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                }
                close(client)
            }
        }
    }

    func stop() {
        shutdown(fd, Int32(SHUT_RDWR))
        close(fd)
        unlink(path)
    }
}

@Suite("StatusClient against a hostile socket")
struct StatusClientTests {
    private func ask(_ answer: String, drip: Double? = nil, timeout: Double = 2) throws -> Result<
        StatusResponse, StatusClientError
    > {
        let server = try CannedServer(answer: Array(answer.utf8), drip: drip)
        defer { server.stop() }
        let client = StatusClient(socketPath: server.path, timeout: timeout)
        do { return .success(try client.request("GET", "/v1/active")) } catch { return .failure(error) }
    }

    @Test("a negative or absurd Content-Length or chunk size is a protocol error, never a crash")
    func badLengths() throws {
        let cases = [
            "HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n{}",
            "HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n{}",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nabc\r\n0\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7fffffffffffffff\r\nabc\r\n0\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\nabcde\r\n0\r\n\r\n",
        ]
        for answer in cases {
            let result = try ask(answer)
            guard case .failure(.protocolError) = result else {
                Issue.record("accepted \(answer.debugDescription): \(result)")
                continue
            }
        }
        guard case .success(let fine) = try ask("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}") else {
            Issue.record("a good answer failed")
            return
        }
        #expect(fine.body == Array("{}".utf8))
    }

    @Test("an answer dripped a byte at a time ends at the timeout, not when the peer pleases")
    func dripped() throws {
        let started = Date()
        let result = try ask(
            "HTTP/1.1 200 OK\r\nContent-Length: 400\r\n\r\n" + String(repeating: "x", count: 400), drip: 0.05,
            timeout: 1)
        let elapsed = Date().timeIntervalSince(started)
        guard case .failure(.timedOut) = result else {
            Issue.record("expected a timeout, got \(result)")
            return
        }
        #expect(elapsed < 2.5, "took \(elapsed) s with a 1 s timeout")
    }
}
