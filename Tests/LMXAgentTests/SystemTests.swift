import Foundation
import LMXAgent
import LMXCore
import LMXProbe
import LMXSystem
import NIOCore
import NIOPosix
import Testing

@Suite("The system layer and the probe adapter")
struct SystemTests {
    func temporaryDirectory() throws -> String {
        let directory = NSTemporaryDirectory() + "lmx-system-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        return directory
    }

    @Test("atomic files: whole content, the mode asked whatever the umask, a planted link replaced, never followed")
    func atomicFile() throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let target = directory + "/victim"
        try "keep".write(toFile: target, atomically: false, encoding: .utf8)
        try FileManager.default.createSymbolicLink(atPath: directory + "/file", withDestinationPath: target)
        try FileSystem.writeAtomically(Array("new".utf8), to: directory + "/file", mode: 0o600)
        #expect(try String(contentsOfFile: target, encoding: .utf8) == "keep")
        #expect(FileSystem.info(directory + "/file")?.kind == .file)
        #expect(FileSystem.info(directory + "/file")?.mode == 0o600)
        #expect(try FileSystem.read(directory + "/file", limit: 10) == Array("new".utf8))
        #expect(throws: FileSystem.ReadError.self) { try FileSystem.read(directory + "/file", limit: 2) }
        #expect(throws: FileSystem.ReadError.self) { try FileSystem.read(directory + "/missing", limit: 2) }
    }

    @Test("socket files: free, live, stale (nobody listens) and unusable (not a socket)")
    func socketFile() throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/agent.sock"
        #expect(SocketFile.probe(path) == .free)
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        listen(fd, 4)
        #expect(SocketFile.probe(path) == .live)
        close(fd)
        #expect(SocketFile.probe(path) == .stale)
        try FileManager.default.removeItem(atPath: path)
        try "x".write(toFile: path, atomically: false, encoding: .utf8)
        #expect(SocketFile.probe(path) == .unusable("it exists and is not a socket"))
        #expect(UnixSocketAddress(String(repeating: "a", count: 200)) == nil)
    }

    @Test(
        "socket paths: the bind limit is SwiftNIO's 103 bytes, under the kernel's 107; a path over it is a problem naming it and the limit"
    )
    func socketPathLimit() async throws {
        #expect(SocketPathLimit.kernel == 107)
        #expect(SocketPathLimit.bindable == 103)
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        func path(_ bytes: Int) -> String {
            directory + "/" + String(repeating: "s", count: bytes - directory.utf8.count - 1)
        }
        #expect(SocketPathLimit.problem(path(103)) == nil)
        let long = path(104)
        #expect(SocketPathLimit.problem(long)?.contains(long) == true)
        #expect(SocketPathLimit.problem(long)?.contains("is 104 bytes, over the 103 bytes") == true)
        #expect(SocketPathLimit.problem("") != nil)
        #expect(SocketPathLimit.problem("/tmp/a\u{0}b") != nil)
        // What binding really accepts: SwiftNIO binds 103 bytes and refuses 104, whatever the kernel takes.
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let bound = try await ServerBootstrap(group: group).bind(unixDomainSocketPath: path(103)).get()
        try await bound.close()
        await #expect(throws: SocketAddressError.self) {
            try await ServerBootstrap(group: group).bind(unixDomainSocketPath: long).get()
        }
        try await group.shutdownGracefully()
    }

    @Test("the directory watch reports a file renamed into place, through a polling thread that stops when told")
    func directoryWatch() async throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let watch = try DirectoryWatch()
        try watch.add(directory)
        struct Handed: @unchecked Sendable { let value: DirectoryWatch }  // used by the thread only
        let box = Handed(value: watch)
        let (changes, thread) = try PollingThread.start(label: "test.watch") { (poller, send: ([String]) -> Void) in
            // No time limit: only a change or the stop ends a wait.
            while case .readable = poller.wait(for: [box.value.descriptor], milliseconds: -1) {
                send(box.value.drain())
            }
        }
        try "{}".write(toFile: directory + "/.book.tmp", atomically: false, encoding: .utf8)
        try FileManager.default.moveItem(atPath: directory + "/.book.tmp", toPath: directory + "/book.json")
        var seen: Set<String> = []
        for await paths in changes {
            seen.formUnion(paths)
            if seen.contains(directory + "/book.json") { break }
        }
        #expect(seen.contains(directory + "/book.json"))
        // Stopped: the thread leaves its endless wait and the stream finishes.
        thread.stop()
        for await _ in changes {}
        #expect(thread.isStopped)
        #expect(thread.wait(for: [box.value.descriptor], milliseconds: -1) == .stopped)
    }

    @Test("heap memory: a /proc status field read as a number or nothing; free pages given back; this process's figure")
    func heapMemory() {
        let status = Array("Name:\tlmx-agentd\nVmRSS:\t   23912 kB\nRssAnon:\t    5724 kB\nRssFile: x\n".utf8)
        #expect(HeapMemory.statusField("RssAnon", in: status) == 5724)
        #expect(HeapMemory.statusField("VmRSS", in: status) == 23912)
        #expect(HeapMemory.statusField("Rss", in: status) == nil)  // a name is matched whole
        #expect(HeapMemory.statusField("RssFile", in: status) == nil)
        #expect(HeapMemory.statusField("RssShmem", in: status) == nil)
        #expect(HeapMemory.statusField("RssAnon", in: Array("RssAnon:\t99999999999999999999 kB".utf8)) == nil)
        #expect(HeapMemory.statusField("RssAnon", in: []) == nil)
        // Freed memory given back: the pages of freed blocks (whole pages inside them, which the
        // allocator keeps resident as free chunks) are no longer resident afterwards. Asked of
        // those pages (mincore), not of the process's total, which tests running beside this one
        // change.
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        // Each block followed by one kept in use, so that a freed block is a free chunk between
        // used ones (as a burst's buffers end up), which `free` alone does not give back.
        var blocks: [UnsafeMutableRawPointer] = []
        var kept: [UnsafeMutableRawPointer] = []
        kept.reserveCapacity(64)
        for _ in 0..<64 {
            let block = UnsafeMutableRawPointer.allocate(byteCount: 64 * 1024, alignment: 16)
            block.initializeMemory(as: UInt8.self, repeating: 1, count: 64 * 1024)
            blocks.append(block)
            kept.append(UnsafeMutableRawPointer.allocate(byteCount: 40 * 1024, alignment: 16))
        }
        defer { for block in kept { block.deallocate() } }
        func residentPages() -> (resident: Int, total: Int) {
            var resident = 0
            var total = 0
            for block in blocks {
                // The whole pages inside the block, past the allocator's own header.
                let first = (Int(bitPattern: block) + page - 1) / page * page + page
                let end = (Int(bitPattern: block) + 64 * 1024) / page * page - page
                guard end > first, let start = UnsafeMutableRawPointer(bitPattern: first) else { continue }
                var vector = [UInt8](repeating: 0, count: (end - first) / page)
                guard mincore(start, end - first, &vector) == 0 else { continue }
                resident += vector.filter { $0 & 1 == 1 }.count
                total += vector.count
            }
            return (resident, total)
        }
        let used = residentPages()
        #expect(used.resident == used.total)
        for block in blocks { block.deallocate() }
        let freed = residentPages()
        HeapMemory.returnFreePages()
        let given = residentPages()
        #expect(freed.total > 0 && freed.resident > freed.total / 2, "freed blocks still resident before")
        #expect(given.resident < given.total / 4, "\(given.resident) of \(given.total) pages still resident")
        #expect(HeapMemory.anonymousResidentKiB().map { $0 > 0 } == true)
    }

    @Test(
        "the port claim: refused while anyone listens there, even sockets sharing it (SO_REUSEPORT); free once they close; a name claims nothing"
    )
    func portClaim() async throws {
        for host in ["127.0.0.1", "::1"] {
            // A listener that shares its port, as the gateway's do.
            let listener = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .serverChannelOption(.socketOption(.init(rawValue: SO_REUSEPORT)), value: 1)
                .bind(host: host, port: 0).get()
            let port = try #require(listener.localAddress?.port)
            #expect(PortClaim.refusal(host: host, port: port) == EADDRINUSE, "\(host)")
            try await listener.close()
            #expect(PortClaim.refusal(host: host, port: port) == nil, "\(host)")
        }
        #expect(PortClaim.refusal(host: "localhost", port: 1) == nil)
    }

    @Test("paths: one idea of a path's directory")
    func directories() {
        #expect(FileSystem.directory(of: "/run/lmx/agent.sock") == "/run/lmx")
        #expect(FileSystem.directory(of: "/agent.sock") == "/")
        #expect(FileSystem.directory(of: "agent.sock") == ".")
    }

    @Test("IP literals: one parser for announcements, links and vouched addresses")
    func addresses() {
        #expect(IPAddress.v4("10.0.0.1") != nil)
        #expect(IPAddress.v4("010.0.0.1") == nil)
        #expect(IPAddress.v4("256.0.0.1") == nil)
        #expect(IPAddress.v6("fe80::1")?.count == 16)
        #expect(IPAddress.v6("::ffff:10.0.0.1")?.suffix(4) == [10, 0, 0, 1])
        #expect(IPAddress.v6("1::2::3") == nil)
        #expect(AddressPolicy.refusal("010.0.0.1", onLoopbackInterface: false) != nil)
    }

    @Test("the prober: a port nobody listens on is down (refused) quickly; a missing CA file fails at start")
    func prober() async throws {
        let prober = try Prober()
        let route = Route(baseURL: "http://127.0.0.1:9", via: .lan, source: .manual, name: "nobody")
        let report = await prober.probe(route, timeout: 2)
        #expect(report.verdict == .down)
        #expect(report.detail?.contains("refused") == true)
        await prober.shutdown()
        #expect(throws: (any Error).self) { try Prober(extraCAFile: "/nonexistent/ca.pem") }
    }
}

extension SystemTests {
    @Test(
        "the owner of a loopback TCP peer comes from the kernel's socket tables, over netlink sockets kept between questions; a peer socket its process closed is told from one only half-closed"
    )
    func socketOwner() async throws {
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(listener) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        address.sin_port = 0
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(listener, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        listen(listener, 4)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) }
        }
        let serverPort = UInt16(bigEndian: address.sin_port)
        let client = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(client) }
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(client, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        var mine = sockaddr_in()
        length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &mine) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(client, $0, &length) }
        }
        let clientPort = UInt16(bigEndian: mine.sin_port)
        let loopback: [UInt8] = [127, 0, 0, 1]
        #expect(SocketOwner.uid(peer: (loopback, clientPort), local: (loopback, serverPort)) == Users.effective)
        #expect(SocketOwner.uid(peer: (loopback, 1), local: (loopback, serverPort)) == nil, "no such connection")
        // The netlink sockets are kept between questions: answers never mix up, whether a
        // question found its socket or not, one after another or from several threads at once.
        var wrong = 0
        for round in 0..<200 {
            let found = SocketOwner.uid(peer: (loopback, clientPort), local: (loopback, serverPort))
            let missing = SocketOwner.uid(peer: (loopback, UInt16(1 + round)), local: (loopback, serverPort))
            if found != Users.effective || missing != nil { wrong += 1 }
        }
        #expect(wrong == 0)
        let answers = await withTaskGroup(of: Bool.self) { group in
            for task in 0..<16 {
                group.addTask {
                    (0..<50).allSatisfy { round in
                        round % 2 == task % 2
                            ? SocketOwner.uid(peer: (loopback, clientPort), local: (loopback, serverPort))
                                == Users.effective
                            : SocketOwner.uid(peer: (loopback, 2), local: (loopback, serverPort)) == nil
                    }
                }
            }
            return await group.reduce(into: [Bool]()) { $0.append($1) }
        }
        #expect(answers == Array(repeating: true, count: 16))

        // A peer that ended only its side still holds its socket; one whose process closed it
        // left an orphan the kernel finishes alone (what the gateway tells apart when a client's
        // side ends while its answer is awaited).
        shutdown(client, Int32(SHUT_WR))
        #expect(
            SocketOwner.peerSocket(peer: (loopback, clientPort), local: (loopback, serverPort))
                == .held(uid: Users.effective))
        let leaving = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(leaving, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &mine) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(leaving, $0, &length) }
        }
        let leavingPort = UInt16(bigEndian: mine.sin_port)
        #expect(
            SocketOwner.peerSocket(peer: (loopback, leavingPort), local: (loopback, serverPort))
                == .held(uid: Users.effective))
        close(leaving)
        #expect(
            SocketOwner.peerSocket(peer: (loopback, leavingPort), local: (loopback, serverPort))
                == .closed(uid: Users.effective))
        #expect(SocketOwner.peerSocket(peer: (loopback, 3), local: (loopback, serverPort)) == .absent)
        #expect(SocketOwner.peerSocket(peer: ([1, 2, 3], 3), local: (loopback, serverPort)) == .unknown)
        #expect(SocketOwner.isLoopback([127, 0, 0, 1]) && SocketOwner.isLoopback([127, 9, 8, 7]))
        #expect(SocketOwner.isLoopback([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]))
        #expect(SocketOwner.isLoopback([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 127, 0, 0, 1]))
        #expect(!SocketOwner.isLoopback([10, 0, 0, 1]) && !SocketOwner.isLoopback([]))
        #expect(!SocketOwner.isLoopback([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]))
        #expect(!SocketOwner.isLoopback([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 1]))
    }
}
