import LMXCore
import LMXSystem
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// Where a route's connections go, read once from its base URL: the data path connects to IP
/// literals (a link-local IPv6 one on its interface) and names, over HTTP or HTTPS. (A route's
/// URL never has a path: ``BaseURL/isWellFormed``.)
struct UpstreamAddress: Hashable, Sendable {
    /// What an address is, read once and held in one object: the data path copies a request's
    /// address several times per request, and a copy is one retain, not one per text.
    private final class Storage: Sendable {
        let tls: Bool
        let host: String
        let port: Int
        let authority: String
        let serverName: String?
        let socketAddress: SocketAddress?
        let identity: Int

        init(tls: Bool, host: String, port: Int, authority: String, serverName: String?, scope: UInt32) {
            self.tls = tls
            self.host = host
            self.port = port
            self.authority = authority
            self.serverName = serverName
            let literal = serverName == nil ? try? SocketAddress(ipAddress: host, port: port) : nil
            if scope != 0, case .v6(let v6)? = literal {
                // A link-local address is reached on its interface (the URL's zone).
                var raw = v6.address
                raw.sin6_scope_id = scope
                socketAddress = SocketAddress(raw, host: host)
            } else {
                socketAddress = literal
            }
            var hasher = Hasher()
            hasher.combine(host)
            hasher.combine(port)
            hasher.combine(tls)
            hasher.combine(scope)
            identity = hasher.finalize()
        }
    }
    private let storage: Storage

    var tls: Bool { storage.tls }
    /// What to connect to: an IP literal or a DNS name.
    var host: String { storage.host }
    var port: Int { storage.port }
    /// The `Host` header: the authority as the route's URL writes it.
    var authority: String { storage.authority }
    /// SNI and certificate name for a tunnel reached by name.
    var serverName: String? { storage.serverName }
    /// An IP literal's socket address: connected to as it is. (A name is looked up by SwiftNIO's
    /// resolver, which calls `getaddrinfo` on a dispatch queue: a thread hop there and back for
    /// every new connection.)
    var socketAddress: SocketAddress? { storage.socketAddress }

    init?(_ base: String) {
        let url = BaseURL(base)
        guard url.isWellFormed, url.suffix.isEmpty, url.scheme == "http" || url.scheme == "https" else { return nil }
        let tls = url.scheme == "https"
        let host: String
        let serverName: String?
        var scope: UInt32 = 0
        var authority = url.hostPort
        switch url.host {
        case .ipv4(let address):
            host = address
            serverName = nil
        case .ipv6(let address, let zone):
            host = address
            serverName = nil
            if let zone {
                // The interface's index, as the kernel knows it now (nil: no such interface).
                guard let index = NetworkInterface.index(named: zone) else { return nil }
                scope = index
                // The Host header names the address without its zone (RFC 9110 has no zones).
                authority = "[\(address)]" + (url.port.map { ":\($0)" } ?? "")
            }
        case .name(let name):
            host = name
            serverName = name
        }
        let port = url.port ?? (tls ? 443 : 80)
        guard (1...65535).contains(port) else { return nil }
        storage = Storage(
            tls: tls, host: host, port: port, authority: authority, serverName: serverName, scope: scope)
    }

    // The rest follows from these (the pools look addresses up on every request). The hash of
    // what identifies an address was taken once: hashing its host's text on each look-up cost
    // more than the rest of the look-up.
    static func == (a: Self, b: Self) -> Bool {
        a.storage === b.storage
            || (a.tls == b.tls && a.port == b.port && a.host == b.host && a.authority == b.authority
                && a.socketAddress == b.socketAddress)
    }

    func hash(into hasher: inout Hasher) {
        hasher.combine(storage.identity)
    }
}

/// One connection to a route, owned by one event loop: lent to one request at a time.
final class UpstreamConnection {
    let channel: any Channel
    /// How the exchange holding it speaks to the server (HTTP/1.1: ``HTTP1Upstream``).
    let handler: any UpstreamProtocol
    let address: UpstreamAddress
    /// The pool's generation when it was opened (reused only within it).
    let generation: Int
    /// When it was last given back (for the idle limit).
    var idleSince = NIODeadline.now()
    /// How long it may wait idle, from the server's last answer on it (``UpstreamKeepAlive``).
    var keepFor = UpstreamPool.idleLimit

    init(channel: any Channel, handler: any UpstreamProtocol, address: UpstreamAddress, generation: Int) {
        self.channel = channel
        self.handler = handler
        self.address = address
        self.generation = generation
    }
}

/// The keep-alive connections of one event loop to every route, used only from that loop: a
/// request takes one (or opens one on the same loop) and gives it back when its answer ended
/// cleanly. No lock: each loop has its own.
final class UpstreamPool {
    let eventLoop: any EventLoop
    let tls: NIOSSLContext
    /// The connections to one address.
    private struct Entry {
        let address: UpstreamAddress
        /// Idle, newest last.
        var idle: [UpstreamConnection] = []
        /// Open (lent and idle).
        var open = 0
    }
    /// The addresses with connections open: a few (one per route in use), looked up in order by
    /// ``UpstreamAddress``'s `==`, which its object's identity decides at once (hashing an
    /// address and finding it in a dictionary cost three times as much). Moved out of the pool
    /// and back around each change: an access to a class's property that spans a call the
    /// compiler cannot see into (an array's growth) is checked at run time, about 70 instructions.
    private var entries: [Entry] = []

    /// `change` made to the entries, moved out of the pool into a local and back.
    private func withEntries<Result>(_ change: (inout [Entry]) -> Result) -> Result {
        var entries: [Entry] = []
        swap(&entries, &self.entries)
        defer { swap(&entries, &self.entries) }
        return change(&entries)
    }
    /// Bumped when the machine's network changes: connections made before are not reused.
    private var generation = 0
    /// Idle connections older than their `keepFor` are closed, not reused: a request sent as the
    /// server closes one may be lost. Without a word from the server about how long it keeps
    /// them, this (uvicorn closes idle connections after 5 s); see ``UpstreamKeepAlive``.
    static let idleLimit = TimeAmount.seconds(Int64(UpstreamKeepAlive.unknownSeconds))
    static let maxIdlePerAddress = 64
    /// Closes idle connections once they are past their `keepFor`, while any are idle (one timer
    /// per loop): after a burst, the connections it opened do not stay open against a server that
    /// would keep them longer than the gateway uses them.
    private var sweep: Scheduled<Void>?

    /// The gateway's count of connections per route, shared by every loop's pool.
    let slots: RouteSlots

    init(eventLoop: any EventLoop, tls: NIOSSLContext, slots: RouteSlots = RouteSlots()) {
        self.eventLoop = eventLoop
        self.tls = tls
        self.slots = slots
    }

    /// How many addresses have connections open (the tests').
    var addressCount: Int { entries.count }

    /// A request may have a connection to `address` now: this loop keeps an idle one, or fewer
    /// than `cap` are open or being opened by all loops together (``RouteSlots``).
    func hasRoom(_ address: UpstreamAddress, cap: Int) -> Bool {
        let idle = withEntries { entries in
            entries.first(where: { $0.address == address }).map { !$0.idle.isEmpty } ?? false
        }
        return idle || slots.count(address) < cap
    }

    /// Requests waiting for room at an address (``hasRoom(_:cap:)``), oldest first: one is woken
    /// (on the loop, after the change) each time a connection to its address is given back or
    /// closes; `wake` returns false when its request no longer waits, and the next is woken.
    private var waiters: [(address: UpstreamAddress, wake: () -> Bool)] = []

    func waitForRoom(_ address: UpstreamAddress, _ wake: @escaping () -> Bool) {
        waiters.append((address, wake))
    }

    /// Wakes the oldest request still waiting for room at `address` (a connection came back to
    /// this loop, or a slot of the route's came free on any loop).
    func wakeOne(_ address: UpstreamAddress) {
        guard waiters.contains(where: { $0.address == address }) else { return }
        eventLoop.assumeIsolated().execute { [self] in
            while let index = self.waiters.firstIndex(where: { $0.address == address }) {
                let waiter = self.waiters.remove(at: index)
                if waiter.wake() { return }
            }
        }
    }

    func openCount(_ address: UpstreamAddress) -> Int {
        withEntries { entries in entries.first { $0.address == address }?.open ?? 0 }
    }

    /// An idle connection that is still fresh, or nil.
    func takeIdle(_ address: UpstreamAddress) -> UpstreamConnection? {
        // The address is looked up once; its list popped in place (a copy of the list taken out
        // would copy it on every request).
        let now = NIODeadline.now()
        let generation = generation
        // An emptied entry stays (the connection usually comes back to it at the answer's end);
        // it goes when the address's last connection closes (``forget(_:)``).
        return withEntries { entries in
            guard let slot = entries.firstIndex(where: { $0.address == address }) else { return nil }
            while let last = entries[slot].idle.popLast() {
                if last.channel.isActive, now - last.idleSince < last.keepFor,
                    last.generation == generation, last.handler.reusable
                {
                    return last
                }
                last.channel.close(promise: nil)
            }
            return nil
        }
    }

    /// Opens a connection to an address instead of a socket: the in-process tests' servers
    /// (`EmbeddedChannel`s with an ``HTTP1Upstream``, on the same loop).
    var connector: ((UpstreamAddress, TimeAmount) -> EventLoopFuture<any Channel>)?

    /// Opens a connection on this loop, within `cap` connections to the route on all loops
    /// together (``RouteSlots``); nil when the cap is reached (another loop may have taken the
    /// last slot since ``hasRoom(_:cap:)`` said there was one).
    func connect(_ address: UpstreamAddress, timeout: TimeAmount, cap: Int = .max) -> EventLoopFuture<any Channel>? {
        // The route's slot, taken now, given back when the connection fails to open or closes.
        let slots = slots
        guard slots.take(address, cap: cap) else { return nil }
        let connecting = opening(address, timeout: timeout)
        connecting.whenComplete { result in
            switch result {
            case .success(let channel): channel.closeFuture.whenComplete { _ in slots.give(address) }
            case .failure: slots.give(address)
            }
        }
        return connecting
    }

    private func opening(_ address: UpstreamAddress, timeout: TimeAmount) -> EventLoopFuture<any Channel> {
        if let connector { return connector(address, timeout) }
        let tls = self.tls
        let bootstrap = ClientBootstrap(group: eventLoop)
            .connectTimeout(timeout)
            // (TCP_NODELAY is ClientBootstrap's default; `.socketOption(.tcp_nodelay)` would set
            // SO_DEBUG, a SOL_SOCKET option that needs CAP_NET_ADMIN.)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    // At most two reads of up to 32 KiB per wake-up: a channel keeps a buffer per
                    // read of a batch for as long as it lives (GatewayChildChannel.readsPerWakeUp).
                    // Set here, on the loop, not as the bootstrap's options, which are applied
                    // through a chain of futures (about 7,000 instructions each).
                    GatewayChildChannel.limitReceiveBuffers(of: channel)
                    Self.watchPeer(of: channel, address.tls ? .wan : .lan)
                    let sync = channel.pipeline.syncOperations
                    if address.tls {
                        try sync.addHandler(NIOSSLClientHandler(context: tls, serverHostname: address.serverName))
                    }
                    try sync.addHandler(HTTP1Upstream())
                }
            }
        if let socketAddress = address.socketAddress { return bootstrap.connect(to: socketAddress) }
        return bootstrap.connect(host: address.host, port: address.port)
    }

    /// The kernel watches the server's side of the connection (``TCPLiveness``): a stream is
    /// ended by what happens to its own connection — a server gone silent fails it within
    /// seconds — and never by a probe's verdict on another one.
    static func watchPeer(of channel: any Channel, _ liveness: TCPLiveness) {
        guard let options = channel.syncOptions else { return }
        try? options.setOption(.socketOption(.so_keepalive), value: 1)
        for (name, value) in liveness.tcpOptions {
            try? options.setOption(
                ChannelOptions.Types.SocketOption(level: .tcp, name: NIOBSDSocket.Option(rawValue: name)),
                value: Int(value))
        }
    }

    /// A newly connected channel as a pooled connection, counted until it closes.
    func adopt(_ channel: any Channel, address: UpstreamAddress) throws -> UpstreamConnection {
        let handler = try channel.pipeline.syncOperations.handler(type: HTTP1Upstream.self)
        let connection = UpstreamConnection(
            channel: channel, handler: handler, address: address, generation: generation)
        withEntries { entries in
            if let slot = entries.firstIndex(where: { $0.address == address }) {
                entries[slot].open += 1
            } else {
                entries.append(Entry(address: address, open: 1))
            }
        }
        channel.closeFuture.assumeIsolatedUnsafeUnchecked().whenComplete { [self] _ in
            self.forget(connection)
        }
        return connection
    }

    /// Gives a connection back after an answer that ended cleanly.
    func release(_ connection: UpstreamConnection) {
        connection.handler.owner = nil
        guard connection.channel.isActive, connection.generation == generation, connection.keepFor > .zero,
            connection.handler.reusable
        else {
            connection.channel.close(promise: nil)
            return
        }
        connection.idleSince = .now()
        if sweep == nil { scheduleSweep(at: connection.idleSince + connection.keepFor) }
        // (Counted open since `adopt`: its entry is there.)
        let kept = withEntries { entries in
            guard let slot = entries.firstIndex(where: { $0.address == connection.address }),
                entries[slot].idle.count < Self.maxIdlePerAddress
            else { return false }
            entries[slot].idle.append(connection)
            return true
        }
        if !kept { connection.channel.close(promise: nil) }
        wakeOne(connection.address)
    }

    private func scheduleSweep(at deadline: NIODeadline) {
        // A little after the deadline: connections given back just before it go in the same sweep.
        sweep = eventLoop.assumeIsolated().scheduleTask(deadline: deadline + .milliseconds(250)) { [self] in
            self.sweep = nil
            self.closeExpired()
        }
    }

    /// Closes the idle connections past their `keepFor`; the next sweep at the earliest expiry of
    /// those left.
    private func closeExpired() {
        let now = NIODeadline.now()
        var next: NIODeadline?
        var expired: [UpstreamConnection] = []
        withEntries { entries in
            for slot in entries.indices {
                entries[slot].idle.removeAll { connection in
                    let end = connection.idleSince + connection.keepFor
                    if end <= now {
                        expired.append(connection)
                        return true
                    }
                    next = min(next ?? end, end)
                    return false
                }
            }
        }
        for connection in expired { connection.channel.close(promise: nil) }
        if let next { scheduleSweep(at: next) }
    }

    /// The machine's network changed: idle connections close; those lent finish their answer
    /// and then close.
    func dropAll() {
        generation += 1
        sweep?.cancel()
        sweep = nil
        let idle = withEntries { entries in
            var idle: [UpstreamConnection] = []
            for slot in entries.indices {
                idle += entries[slot].idle
                entries[slot].idle = []
            }
            return idle
        }
        // (Each closes and is forgotten later, on the loop, as its close completes.)
        for connection in idle { connection.channel.close(promise: nil) }
    }

    private func forget(_ connection: UpstreamConnection) {
        withEntries { entries in
            guard let slot = entries.firstIndex(where: { $0.address == connection.address }) else { return }
            entries[slot].open -= 1
            if let index = entries[slot].idle.firstIndex(where: { $0 === connection }) {
                entries[slot].idle.remove(at: index)
            }
            if entries[slot].open <= 0 { entries.remove(at: slot) }
        }
        wakeOne(connection.address)
    }
}
