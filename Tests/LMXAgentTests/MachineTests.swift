import AsyncHTTPClient
import Foundation
import LMXCore
import LMXProbe
import LMXSystem
import Synchronization
import Testing

@testable import LMXAgent

#if canImport(Glibc)
import Glibc
#endif

/// What the agent reads of this machine: route lookups, netlink, the clocks, and the renewal of
/// pooled connections after a change.
@Suite("This machine: route lookups, network changes, sleep, renewed connections")
struct MachineTests {
    @Test("route lookups: loopback is on-link on lo, an address with no route has none, carrier is read")
    func routeLookup() throws {
        let interfaces = RouteLookup.interfaces()
        let loopback = try RouteLookup.path(to: "127.0.0.1", in: interfaces).get()
        #expect(loopback.interface == "lo" && loopback.onLink && loopback.running && loopback.source == "127.0.0.1")
        let v6 = try RouteLookup.path(to: "::1", in: interfaces).get()
        #expect(v6.interface == "lo" && v6.onLink)
        #expect(throws: SystemError.self) { try RouteLookup.path(to: "not-an-address", in: interfaces).get() }
        // 240.0.0.0/4 is reserved: no route to it unless a default route exists; either way the
        // answer is a path or the kernel's reason, never a crash.
        switch RouteLookup.path(to: "240.0.0.1", in: interfaces) {
        case .success(let path): #expect(!path.onLink)
        case .failure(let error): #expect(error.description.contains("240.0.0.1"))
        }
    }

    @Test("a LAN route's host as the lookup takes it: IPv4 and IPv6 literals (zone kept), never a name")
    func literalHosts() {
        #expect(BaseURL("http://10.0.0.5:1234").ipLiteral == "10.0.0.5")
        #expect(BaseURL("http://[fe80::1%25lan0]:1234").ipLiteral == "fe80::1%lan0")
        #expect(BaseURL("https://[2001:db8::1]/x").ipLiteral == "2001:db8::1")
        #expect(BaseURL("http://studio.local:1234").ipLiteral == nil)
        #expect(BaseURL("http://010.0.0.1:1234").ipLiteral == nil)
    }

    @Test("netlink: a link and an address added are reported (in a network namespace of the test's own)")
    func netlinkReportsChanges() async throws {
        let namespace = "lmxnl\(Int.random(in: 1000...9999))"
        let ip = "/usr/sbin/ip"
        #expect(try run(ip, ["netns", "add", namespace]) == 0, "needs root")
        defer { _ = try? run(ip, ["netns", "delete", namespace]) }
        // The socket belongs to the namespace of the thread that opens it: enter the test's
        // namespace for that one call, then come back (nothing else runs on this thread meanwhile).
        let original = open("/proc/self/ns/net", O_RDONLY)
        let target = open("/run/netns/\(namespace)", O_RDONLY)
        defer {
            close(original)
            close(target)
        }
        let cloneNewNet: Int32 = 0x4000_0000
        // setns(2) is not in the Glibc module (it needs _GNU_SOURCE): found by name in libc.
        typealias SetNS = @convention(c) (Int32, Int32) -> Int32
        let setns = unsafeBitCast(try #require(dlsym(nil, "setns")), to: SetNS.self)
        #expect(setns(target, cloneNewNet) == 0)
        let opened = Result { try NetworkMonitor() }
        #expect(setns(original, cloneNewNet) == 0)
        let monitor = try opened.get()
        #expect(!monitor.drain().any)

        #expect(try run(ip, ["-n", namespace, "link", "add", "lmxt0", "type", "veth", "peer", "name", "lmxt1"]) == 0)
        let link = monitor.drain()
        #expect(link.any && link.linkOrAddressUp)
        #expect(!monitor.drain().any, "read once")
        #expect(try run(ip, ["-n", namespace, "addr", "add", "10.9.9.1/24", "dev", "lmxt0"]) == 0)
        #expect(monitor.drain().linkOrAddressUp)
        #expect(try run(ip, ["-n", namespace, "addr", "del", "10.9.9.1/24", "dev", "lmxt0"]) == 0)
        let removed = monitor.drain()
        #expect(removed.any && !removed.linkOrAddressUp)
    }

    @Test("the clocks: a jump between BOOTTIME and MONOTONIC is a sleep; small drift is not")
    func suspendDetector() {
        var detector = SuspendDetector(threshold: 2)
        #expect(detector.check(gap: 0) == nil)
        #expect(detector.check(gap: 0.3) == nil)
        #expect(detector.check(gap: 42.3) == 42)
        #expect(detector.check(gap: 42.4) == nil)
        var real = SuspendDetector()
        #expect(real.check() == nil, "no sleep during a test")
    }

    @Test("renewed clients: new requests get a new pool; the old one closes only after its last lease")
    func renewableClient() async throws {
        let (clients, made) = countingClients()
        var lease: RenewableHTTPClient.Lease? = clients.lease()
        let old = lease!.client
        clients.renew()
        #expect(made.value == 2)
        #expect(clients.lease().client !== old, "new requests use the new pool")
        // Still open for the request that leased it: refused by the port, not by a shut client.
        let refused = await failure(old)
        #expect(refused != "alreadyShutdown", "\(refused)")
        lease = nil
        // Released: the old pool closes.
        var closed = false
        for _ in 0..<50 where !closed {
            try await Task.sleep(for: .milliseconds(20))
            closed = await failure(old) == "alreadyShutdown"
        }
        #expect(closed)
        await clients.shutdown()
    }

    @Test("a client that has pools for 256 servers is renewed for the next new one (announcer churn stays bounded)")
    func renewedPastServers() async throws {
        let (clients, made) = countingClients()
        let first = clients.lease(server: "http://10.0.0.1:1").client
        for i in 1..<RenewableHTTPClient.maxServersPerClient {
            #expect(clients.lease(server: "http://10.0.\(i / 250).\(i % 250 + 1):1").client === first)
        }
        #expect(clients.lease(server: "http://10.0.0.1:1").client === first, "a server already known: the same client")
        #expect(made.value == 1)
        let next = clients.lease(server: "http://10.9.9.9:1").client
        #expect(next !== first, "past the bound: a fresh client")
        #expect(made.value == 2)
        await clients.shutdown()
    }

    /// A renewable client that counts the HTTP clients it makes.
    private func countingClients() -> (RenewableHTTPClient, Counter) {
        let made = Counter()
        let clients = RenewableHTTPClient {
            made.add()
            return HTTPClients.make(tls: .makeClientConfiguration(), idleTimeout: 10)
        }
        return (clients, made)
    }

    private func failure(_ client: HTTPClient) async -> String {
        do {
            _ = try await client.execute(HTTPClientRequest(url: "http://127.0.0.1:1/"), timeout: .seconds(2))
            return "answered"
        } catch let error as HTTPClientError where error == .alreadyShutdown {
            return "alreadyShutdown"
        } catch {
            return "\(error)"
        }
    }

    private func run(_ executable: String, _ arguments: [String]) throws -> Int32 {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        try process.run()
        process.waitUntilExit()
        return process.terminationStatus
    }
}

final class Counter: Sendable {
    private let count = Mutex(0)
    func add() { count.withLock { $0 += 1 } }
    var value: Int { count.withLock { $0 } }
}
