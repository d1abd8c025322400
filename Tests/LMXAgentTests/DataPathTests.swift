import LMXCore
import NIOCore
import NIOEmbedded
import NIOPosix
import NIOSSL
import Synchronization
import Testing

@testable import LMXAgent
@testable import LMXCore

#if canImport(Glibc)
import Glibc
#endif

/// The gateway data path's pure pieces: how a route's URL becomes an address to connect to, and
/// how an event stream is passed on whole events at a time.
@Suite("The gateway's data path: addresses and the event relay")
struct DataPathTests {
    @Test(
        "a route's URL: IP literals (connected to as they are), names (with SNI), default ports; link-local addresses on their interface"
    )
    func addresses() throws {
        let lan = try #require(UpstreamAddress("http://10.0.0.5:1234"))
        #expect(!lan.tls && lan.host == "10.0.0.5" && lan.port == 1234 && lan.authority == "10.0.0.5:1234")
        #expect(lan.serverName == nil)
        let tunnel = try #require(UpstreamAddress("https://lmx.example.com"))
        #expect(tunnel.tls && tunnel.port == 443 && tunnel.serverName == "lmx.example.com")
        #expect(tunnel.authority == "lmx.example.com")
        let v6 = try #require(UpstreamAddress("http://[fd00::5]:8080"))
        #expect(v6.host == "fd00::5" && v6.authority == "[fd00::5]:8080" && v6.serverName == nil)
        // IP literals are connected to as they are, names through the resolver.
        #expect(lan.socketAddress == (try SocketAddress(ipAddress: "10.0.0.5", port: 1234)))
        #expect(v6.socketAddress == (try SocketAddress(ipAddress: "fd00::5", port: 8080)))
        #expect(tunnel.socketAddress == nil)
        // A link-local address is reached on its interface (`lo` is on every machine); the Host
        // header names it without the zone; an interface the machine does not have: not usable.
        let linkLocal = try #require(UpstreamAddress("http://[fe80::1%25lo]:1234"))
        #expect(linkLocal.authority == "[fe80::1]:1234" && linkLocal.host == "fe80::1")
        guard case .v6(let scoped)? = linkLocal.socketAddress else {
            Issue.record("no IPv6 socket address")
            return
        }
        #expect(scoped.address.sin6_scope_id == if_nametoindex("lo") && scoped.address.sin6_scope_id != 0)
        #expect(UpstreamAddress("http://[fe80::1%25nosuch0]:1234") == nil)
        #expect(linkLocal != UpstreamAddress("http://[fe80::1]:1234"))
        // A route's URL never has a path (BaseURL.isWellFormed): one that did is not connected to.
        #expect(UpstreamAddress("http://10.0.0.5:1234/prefix") == nil)
        #expect(UpstreamAddress("ftp://10.0.0.5") == nil)
        #expect(UpstreamAddress("http://10.0.0.5:0") == nil)
        #expect(UpstreamAddress("") == nil)
    }

    @Test(
        "the pool: connections counted per address (equal addresses alike), idle ones lent newest first, closed or stale ones never, counts given back as they close"
    )
    func pool() throws {
        let loop = EmbeddedEventLoop()
        let pool = UpstreamPool(eventLoop: loop, tls: try NIOSSLContext(configuration: .makeClientConfiguration()))
        let a = try #require(UpstreamAddress("http://10.0.0.5:1234"))
        let sameAsA = try #require(UpstreamAddress("http://10.0.0.5:1234"))  // another object, equal
        let b = try #require(UpstreamAddress("http://10.0.0.6:1234"))
        func open(_ address: UpstreamAddress) throws -> UpstreamConnection {
            let channel = EmbeddedChannel(handler: HTTP1Upstream(), loop: loop)
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
            return try pool.adopt(channel, address: address)
        }
        #expect(pool.openCount(a) == 0 && pool.takeIdle(a) == nil)
        let a1 = try open(a)
        let a2 = try open(sameAsA)
        let b1 = try open(b)
        #expect(pool.openCount(a) == 2 && pool.openCount(sameAsA) == 2 && pool.openCount(b) == 1)
        pool.release(a1)
        pool.release(a2)
        #expect(pool.takeIdle(b) == nil)  // b's one is lent
        #expect(pool.takeIdle(sameAsA) === a2)  // the newest
        pool.release(a2)
        // A connection closed while idle is not lent again, and is no longer counted.
        try a2.channel.close().wait()
        loop.run()
        #expect(pool.openCount(a) == 1)
        #expect(pool.takeIdle(a) === a1)
        #expect(pool.takeIdle(a) == nil)
        try a1.channel.close().wait()
        loop.run()
        #expect(pool.openCount(a) == 0)
        // The network changed: idle connections close; one given back after is not kept.
        let b2 = try open(b)
        pool.release(b2)
        pool.dropAll()
        pool.release(b1)
        loop.run()
        #expect(!b1.channel.isActive && !b2.channel.isActive)
        #expect(pool.takeIdle(b) == nil && pool.openCount(b) == 0)
        // Addresses come and go: the pool keeps none that has no connection.
        for round in 0..<100 {
            let address = try #require(UpstreamAddress("http://10.0.1.\(round):80"))
            let connection = try open(address)
            pool.release(connection)
            try connection.channel.close().wait()
        }
        loop.run()
        #expect(pool.openCount(try #require(UpstreamAddress("http://10.0.1.99:80"))) == 0)
        #expect(pool.addressCount == 0)
    }

    @Test(
        "the listener's gate: no accept past its connections' limit until one closes, slots reused; on shutdown the listener closes, open connections are asked to finish, and the promise is kept when the last has closed"
    )
    func listenerGate() throws {
        /// Counts the accepts (reads) the gate lets through, and the events a connection is sent.
        final class Probe: ChannelDuplexHandler {
            typealias InboundIn = Never
            typealias OutboundIn = Never
            var reads = 0
            var quiesced = 0
            /// Closes its connection when told to finish (as an idle one does).
            var closesWhenTold = false
            func read(context: ChannelHandlerContext) {
                reads += 1
                context.read()
            }
            func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
                if event is ChannelShouldQuiesceEvent {
                    quiesced += 1
                    if closesWhenTold { context.close(promise: nil) }
                }
                context.fireUserInboundEventTriggered(event)
            }
        }
        let loop = EmbeddedEventLoop()
        let accepts = Probe()
        let server = EmbeddedChannel(loop: loop)
        let gate = ListenerGate(loop: loop, maxConnections: 2)
        try server.pipeline.syncOperations.addHandler(accepts)
        try server.pipeline.syncOperations.addHandler(gate)
        func accept() throws -> (channel: EmbeddedChannel, probe: Probe) {
            let probe = Probe()
            let child = EmbeddedChannel(handler: probe, loop: loop)
            try server.writeInbound(child as any Channel)
            let passed: (any Channel)? = try server.readInbound()
            #expect(passed === child)  // handed on to the bootstrap's accept handler
            return (child, probe)
        }
        server.read()
        #expect(accepts.reads == 1)
        let first = try accept()
        let second = try accept()
        #expect(gate.openCount == 2)
        server.read()
        #expect(accepts.reads == 1)  // held: two are open
        try first.channel.close().wait()
        loop.run()
        #expect(gate.openCount == 1 && accepts.reads == 2)  // the held accept goes ahead
        // Slots are reused: connections that come and go leave the table at its peak.
        for _ in 0..<100 {
            let passing = try accept()
            try passing.channel.close().wait()
            loop.run()
        }
        #expect(gate.openCount == 1 && gate.slotCount == 2)
        // Shutdown: the listener closes, the open connection is asked to finish; the promise
        // waits for it.
        let third = try accept()
        // One that closes at once when told to finish, as an idle connection does: it gives its
        // slot back while the gate is telling the others. (Handed in directly: the limit holds
        // back accepts, not a connection already accepted.)
        let idle = try accept()
        idle.probe.closesWhenTold = true
        #expect(gate.openCount == 3)
        let done = loop.makePromise(of: Void.self)
        let kept = Mutex(0)
        done.futureResult.whenSuccess { kept.withLock { $0 += 1 } }
        gate.quiesce(done)
        loop.run()
        #expect(!server.isActive)
        #expect(second.probe.quiesced == 1 && third.probe.quiesced == 1 && first.probe.quiesced == 0)
        #expect(idle.probe.quiesced == 1 && !idle.channel.isActive && gate.openCount == 2)
        #expect(kept.withLock { $0 } == 0)
        try second.channel.close().wait()
        loop.run()
        #expect(kept.withLock { $0 } == 0 && gate.openCount == 1)
        try third.channel.close().wait()
        loop.run()
        #expect(kept.withLock { $0 } == 1 && gate.openCount == 0)
        // Asked again, the promise is kept at once.
        let again = loop.makePromise(of: Void.self)
        again.futureResult.whenSuccess { kept.withLock { $0 += 1 } }
        gate.quiesce(again)
        loop.run()
        #expect(kept.withLock { $0 } == 2)

    }

    @Test(
        "the slot table: a value per slot, freed slots used again, removing twice does nothing, its length the peak held"
    )
    func slotTable() {
        var table = SlotTable<String>()
        let a = table.add("a")
        let b = table.add("b")
        #expect(a != b && table[a] == "a" && table[b] == "b" && table.count == 2)
        #expect(table.remove(a) == "a" && table.remove(a) == nil && table[a] == nil && table.count == 1)
        #expect(table.remove(-1) == nil && table.remove(99) == nil && table[99] == nil)
        let c = table.add("c")
        #expect(c == a && table.capacity == 2)  // the freed slot
        #expect(Set(table.elements) == ["b", "c"])
        for _ in 0..<1000 { table.remove(table.add("x")) }
        #expect(table.capacity == 3 && table.count == 2)
    }

    @Test(
        "the loop's sweep: every tick it asks the connections whose check is due and no other, one that leaves while asked does not stop the rest, slots are reused, the timer stops when none is open and starts again with the next"
    )
    func connectionSweep() {
        final class Connection: SweptConnection {
            var nextCheck: NIODeadline
            var asked = 0
            var onDue: (() -> Void)?
            init(due: Bool) { nextCheck = due ? .now() - .seconds(1) : .now() + .hours(1) }
            func sweepDue() {
                asked += 1
                onDue?()
            }
        }
        let loop = EmbeddedEventLoop()
        let sweep = ConnectionSweep(loop: loop, timeout: .seconds(60))
        #expect(sweep.tick == .seconds(1))
        #expect(ConnectionSweep(loop: loop, timeout: .seconds(1)).tick == .milliseconds(125))
        let due = Connection(due: true)
        let later = Connection(due: false)
        let leaving = Connection(due: true)
        let dueSlot = sweep.add(due)
        let laterSlot = sweep.add(later)
        let leavingSlot = sweep.add(leaving)
        leaving.onDue = { sweep.remove(leavingSlot) }  // closes while asked
        let after = Connection(due: true)  // in the slot after the one that leaves
        let afterSlot = sweep.add(after)
        loop.advanceTime(by: .milliseconds(999))
        #expect(due.asked == 0)  // not before the tick
        loop.advanceTime(by: .milliseconds(1))
        #expect(due.asked == 1 && later.asked == 0 && leaving.asked == 1 && after.asked == 1)
        #expect(sweep.openCount == 3)
        loop.advanceTime(by: .seconds(1))
        #expect(due.asked == 2 && leaving.asked == 1 && after.asked == 2)  // every tick while due
        due.nextCheck = .now() + .hours(1)
        loop.advanceTime(by: .seconds(1))
        #expect(due.asked == 2 && after.asked == 3)
        for slot in [dueSlot, laterSlot, afterSlot] { sweep.remove(slot) }
        sweep.remove(afterSlot)  // twice: nothing more
        #expect(sweep.openCount == 0)
        loop.advanceTime(by: .seconds(5))
        #expect(due.asked == 2 && after.asked == 3)  // none open: the timer ran out, none asked
        for _ in 0..<100 { sweep.remove(sweep.add(Connection(due: false))) }
        #expect(sweep.slotCount == 4 && sweep.openCount == 0)
        // A connection added after the timer stopped is asked again.
        let revived = Connection(due: true)
        _ = sweep.add(revived)
        loop.advanceTime(by: .seconds(1))
        #expect(revived.asked == 1)
    }

    @Test(
        "a client connection's receive buffers (real sockets): SwiftNIO's defaults while reads are small, two reads a wake-up of at most 32 KiB once a read fills the first buffer"
    )
    func receiveBuffersLimited() async throws {
        let group = MultiThreadedEventLoopGroup.singleton
        let accepted = Mutex<(any Channel)?>(nil)
        let server = try await ServerBootstrap(group: group)
            .childChannelInitializer { channel in
                accepted.withLock { $0 = channel }
                return channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ClientFront())
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        let client = try await ClientBootstrap(group: group)
            .connect(host: "127.0.0.1", port: try #require(server.localAddress?.port)).get()
        func options() async throws -> (reads: UInt, maximum: Int?) {
            guard let child = accepted.withLock({ $0 }) else { return (0, nil) }
            let reads = try await child.getOption(.maxMessagesPerRead).get()
            let allocator = try await child.getOption(.recvAllocator).get()
            return (reads, (allocator as? AdaptiveRecvByteBufferAllocator)?.maximum)
        }
        for _ in 0..<20 {
            try await client.writeAndFlush(ByteBuffer(repeating: UInt8(ascii: "a"), count: 100)).get()
        }
        // Until the front has read all 2,000 bytes (in reads that never fill a 2 KiB buffer).
        func bytesRead() async throws -> Int {
            guard let child = accepted.withLock({ $0 }) else { return 0 }
            return try await child.eventLoop.submit {
                try child.pipeline.syncOperations.handler(type: ClientFront.self).bytesRead
            }.get()
        }
        for _ in 0..<100 where try await bytesRead() < 2000 {
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(try await bytesRead() == 2000)
        let small = try await options()
        #expect(small.reads == 4 && small.maximum == 64 << 10)  // SwiftNIO's defaults
        try await client.writeAndFlush(ByteBuffer(repeating: UInt8(ascii: "a"), count: 256 << 10)).get()
        var limited = try await options()
        for _ in 0..<100 where limited.reads != 2 {
            try await Task.sleep(for: .milliseconds(20))
            limited = try await options()
        }
        #expect(limited.reads == GatewayChildChannel.readsPerWakeUp && limited.maximum == 32 << 10)
        try await client.close()
        try await server.close()
    }

    @Test(
        "request targets: the data path takes every one but the dashboard's (the policy then judges their paths); a fragment is marked for refusal"
    )
    func forwardedTargets() {
        func path(_ target: String) -> String? {
            guard case .path(let path) = GatewayConnectionHandler.forwardedTarget(target) else { return nil }
            return path
        }
        #expect(path("/v1/chat/completions?stream=true") == "/v1/chat/completions")
        #expect(path("/v1/models/qwen3.5-32b") == "/v1/models/qwen3.5-32b")
        #expect(path("/v1/x?a=b?c") == "/v1/x")
        #expect(path("/v1/?") == "/v1/")
        #expect(path("/v1/rag/collections/my%20docs") == "/v1/rag/collections/my%20docs")
        #expect(path("/v1/a..b") == "/v1/a..b")
        #expect(path("/admin/models") == "/admin/models")
        // Outside /v1/: the data path's too, for the policy to refuse (or forward: /V1/ is /v1/ to it).
        #expect(path("/V1/models") == "/V1/models")
        #expect(path("/v2/models?x") == "/v2/models")
        #expect(path("/v1") == "/v1")
        // The dashboard's: the general path's.
        for target in ["/", "/index.html", "/dashboard/app.js", "/dashboard/api/status?x=1", "/dashboard/nope"] {
            #expect(GatewayConnectionHandler.forwardedTarget(target) == nil, "\(target)")
        }
        for target in ["/v1/models#x", "/#top", "/v2#"] {
            #expect(GatewayConnectionHandler.forwardedTarget(target) == .fragment, "\(target)")
        }
        // Taken, then refused by the policy.
        let refusals = [
            "/v1/%2e%2e/admin": "bad_path", "/v1/../admin": "bad_path", "/v1//models": "bad_path",
            "/v1/%2F": "bad_path", "/admin/models": "admin_disabled", "/v2/models": "not_found",
        ]
        for (target, code) in refusals {
            let taken = path(target) ?? ""
            let refusal = GatewayPolicy.refusal(
                method: "GET", path: taken, authority: "127.0.0.1", header: { _ in nil }, adminEnabled: false,
                overTCP: true)
            #expect(refusal?.code == code, "\(target)")
        }
    }

    @Test("the policy's byte-level helpers agree with the plain string operations on ASCII, and match inside graphemes")
    func byteHelpers() {
        for (haystack, needle) in [
            ("/v1//models", "//"), ("/v1/models", "//"), ("", "a"), ("%2F", "%2f"), ("/v1/x%2fy", "%2f"),
            ("ab", "abc"), ("aab", "ab"),
        ] {
            #expect(haystack.containsBytes(needle) == haystack.contains(needle), "\(haystack) \(needle)")
        }
        // A slash followed by a combining mark is not the character "/", but a server reads bytes.
        #expect("/v1/\u{301}/".containsBytes("/\u{301}/") && "/v1//\u{301}x".containsBytes("//"))
        #expect("Content-Type".equalsASCIILowercased("content-type"))
        #expect(!"Content-Typo".equalsASCIILowercased("content-type"))
        #expect(!"Host".equalsASCIILowercased("hos"))
        #expect("ORIGIN".equalsASCIILowercased("origin"))
    }

    @Test("the ASCII case-folding prefix agrees with folding the bytes first, small and large strings alike")
    func foldedPrefix() {
        func folded(_ text: String) -> [UInt8] { text.utf8.map { $0 >= 0x41 && $0 <= 0x5A ? $0 | 0x20 : $0 } }
        func reference(_ text: String, _ prefix: String) -> Bool { folded(text).starts(with: prefix.utf8) }
        // Every text of up to 3 characters over letters of both cases, their neighbours in ASCII
        // ("@" and "[" fold to nothing) and a non-ASCII letter, against every lower-case prefix.
        let alphabet = ["a", "A", "b", "@", "[", "é"]
        var texts = [""]
        for _ in 0..<3 { texts += texts.flatMap { text in alphabet.map { text + $0 } } }
        let prefixes = Set(texts.map { String(decoding: folded($0), as: UTF8.self) })
        var compared = 0
        for text in Set(texts) {
            for prefix in prefixes {
                #expect(text.hasASCIILowercasedPrefix(prefix) == reference(text, prefix), "\(text) \(prefix)")
                compared += 1
            }
        }
        #expect(compared > 10_000)
        // Past the 15 bytes a string keeps inline, and a substring made into a string.
        let long = String(repeating: "Content-Type-", count: 10)
        #expect(long.hasASCIILowercasedPrefix("content-type-content-type-content"))
        #expect(!long.hasASCIILowercasedPrefix("content-type-content-typo"))
        #expect(String(long.dropFirst(13)).hasASCIILowercasedPrefix("content-type"))
    }

    /// Runs `chunks` through a relay: what was passed on, chunk by chunk, and the finish.
    func relay(_ chunks: [String], framed: Bool = true) -> (out: [String], rest: String?, cut: Bool, events: Int) {
        let relay = EventRelay()
        var out: [String] = []
        for chunk in chunks {
            relay.pass(ByteBuffer(string: chunk)) { out.append(String(buffer: $0)) }
        }
        let (rest, cut) = relay.finish(framed: framed)
        return (out, rest.map { String(buffer: $0) }, cut, relay.tally.events)
    }

    @Test(
        "whole events pass at once; a partial one waits for its end; a body that ended cleanly completes its last event, never reported cut"
    )
    func wholeEvents() {
        let whole = relay(["data: 1\n\n", "data: 2\n\ndata: 3\n\n"])
        #expect(whole.out == ["data: 1\n\n", "data: 2\n\ndata: 3\n\n"] && whole.rest == nil && !whole.cut)
        #expect(whole.events == 3)
        let split = relay(["data: 1\n\ndata: ", "2\n", "\n"])
        #expect(split.out == ["data: 1\n\n", "data: 2\n\n"] && split.events == 2)
        // The body ended as its framing says: a whole line, or half of one, completes the event.
        #expect(relay(["data: 1\n"]).rest == "data: 1\n\n")
        let unfinished = relay(["data: 1\n\ndata: [DONE]"])
        #expect(unfinished.out == ["data: 1\n\n"] && unfinished.rest == "data: [DONE]\n\n" && !unfinished.cut)
        // Unless the half line is data whose JSON its length cut: that event is not whole (a
        // server's wrong length), reported as cut rather than completed into broken JSON.
        for (text, whole) in [
            ("data: {\"a\":1}", true), ("data: {\"a\":1", false), ("data: [DON", false), ("data: hello", true),
            ("data: {\"a\":\"}", false), ("data: {\"a\":\"\\\"}\"}", true), ("event: x\ndata: {\"a\":", false),
            ("data: {\"a\":\ndata: 1}", true), ("data: {\"a\":1}\n", true), ("id: 4", true),
            // (A cut at a line's end, or behind another field, is told by its data too.)
            ("data: {\"a\":\n", false), ("data: {\"a\":1\n", false), ("data: {\"a\":\nid: 7", false),
            ("data: [DONE]\r\n", true),
        ] {
            let finished = relay(["data: 1\n\n" + text])
            #expect(finished.out == ["data: 1\n\n"], "\(text)")
            #expect(finished.cut == !whole && (finished.rest != nil) == whole, "\(text): \(finished)")
        }
        // An event larger than the relay holds goes on as it comes: at the body's end it is ended
        // when it stopped at a line's end, and cut when it stopped mid-line (it cannot be read back).
        let large = String(repeating: "x", count: Gateway.maxHeldEvent + 10)
        for (framed, tail, cut) in [(true, "\n", false), (true, "", true), (false, "", true), (false, "\n", false)] {
            let big = relay(["data: 1\n\ndata: {\"a\":\"" + large + tail], framed: framed)
            #expect(big.cut == cut && (big.rest == nil) == cut, "framed \(framed), tail \(tail.utf8.count)")
            if !cut { #expect(big.rest == "\n") }
            #expect(big.out.joined().hasSuffix(large + tail))
        }
        // A body that runs until the server closes cannot tell its end from a cut: half a line is cut.
        let closed = relay(["data: 1\n\ndata: 2"], framed: false)
        #expect(closed.out == ["data: 1\n\n"] && closed.cut)
        #expect(relay(["data: 1\n"], framed: false).rest == "data: 1\n\n")
        // CRLF boundaries count too, wherever a read splits them (sse-starlette ends its lines
        // with CRLF; a tunnel cuts the stream where it likes).
        #expect(relay(["data: 1\r\n\r\n"]).out == ["data: 1\r\n\r\n"])
        for cut in 1..<13 {
            let text = "data: one\r\n\r\ndata: two"
            let parts = [String(text.utf8.prefix(cut))!, String(text.utf8.dropFirst(cut))!]
            let split = relay(parts, framed: false)
            #expect(split.out.joined() == "data: one\r\n\r\n", "cut at \(cut): \(split.out)")
            #expect(split.events == 1 && split.cut)
        }
        let threeReads = relay(["data: one\r\n\r", "\n", "data: two\r\n"], framed: false)
        #expect(threeReads.out == ["data: one\r\n\r\n"] && threeReads.rest == "data: two\r\n\n")
        // Lines ended by CR alone (the grammar allows it): events pass as they end, not held.
        let crOnly = relay(["data: one\r\rdata: t", "wo\r", "\rdata: [DONE]\r"])
        #expect(crOnly.out == ["data: one\r\r", "data: two\r\r"] && crOnly.events == 2, "\(crOnly.out)")
        #expect(crOnly.rest == "data: [DONE]\r\r" && !crOnly.cut)
    }

    @Test("an event larger than the held limit goes as it is; a loss after it starts on a boundary")
    func hugeEventAndLoss() {
        let relay = EventRelay()
        var passed = 0
        relay.pass(ByteBuffer(repeating: UInt8(ascii: "x"), count: Gateway.maxHeldEvent + 1)) {
            passed += $0.readableBytes
        }
        #expect(passed == Gateway.maxHeldEvent + 1 && relay.midEvent)
        // The rest of it goes as it comes, nothing of it held, until its end.
        var rest: [String] = []
        relay.pass(ByteBuffer(string: "more of it")) { rest.append(String(buffer: $0)) }
        #expect(rest == ["more of it"] && relay.bytesHeld == 0)
        relay.pass(ByteBuffer(string: " and its end\n\ndata: next")) { rest.append(String(buffer: $0)) }
        #expect(rest.last == " and its end\n\n" && relay.bytesHeld == "data: next".utf8.count && !relay.midEvent)
        // Held bytes never pass the limit, however the reads come.
        let drip = EventRelay()
        for _ in 0..<40 {
            drip.pass(ByteBuffer(repeating: UInt8(ascii: "y"), count: 64 << 10)) { _ in }
            #expect(drip.bytesHeld <= Gateway.maxHeldEvent)
        }
        relay.pass(ByteBuffer(repeating: UInt8(ascii: "x"), count: Gateway.maxHeldEvent + 1)) { _ in }
        let target = GatewayTarget(
            routeID: "lan/10.0.0.5:1234", baseURL: "http://10.0.0.5:1234", via: .lan, credentials: Credentials(),
            rank: 0, serverInFlight: 0, instanceID: nil)
        let lost = String(buffer: relay.lost(target: target, error: Gateway.StreamEndedMidEvent()))
        #expect(lost.hasPrefix("\n\nevent: error\ndata: "))
        #expect(lost.contains("\"upstream_lost\"") && lost.contains("lan/10.0.0.5:1234") && lost.hasSuffix("\n\n"))
    }
}

@Suite("Heap return: when the daemon gives freed memory back")
struct HeapReturnScheduleTests {
    @Test("once after answers stop coming, not while they come, not again until more come")
    func schedule() {
        var schedule = HeapReturnSchedule()
        let looks = [0, 0, 3, 5, 5, 5, 7, 7, 9, 12, 12, 12]
        let due = looks.map { schedule.due(answers: $0) }
        #expect(due == [false, false, false, false, true, false, false, true, false, false, true, false])
    }
}
