import Hummingbird
import HummingbirdCore
import LMXCore
import LMXSystem
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTPTypes
import NIOHTTPTypesHTTP1
import NIOPosix
import NIOSSL

/// The gateway's data path: what each event loop needs to forward a request without leaving
/// it. Each loop has its own copy of the agent's state (published to it when the state changes)
/// and its own keep-alive connections to the routes; a request is decided and forwarded by the
/// client connection's channel handler (``GatewayConnectionHandler``) on that loop, with no task,
/// actor hop or wait in between.
final class GatewayDataPath: Sendable {
    let gateway: Gateway
    /// Per event loop of the group the listeners run on; built once, never changed.
    private let loops: [ObjectIdentifier: LoopState]
    let group: MultiThreadedEventLoopGroup
    /// Connections to one route, open or being opened, on all loops together (``RouteSlots``):
    /// past `gateway.max_connections_per_route`, a request waits for one to come free.
    let slots = RouteSlots()

    /// What one event loop knows. Used only on that loop (`@unchecked`: confined, not locked).
    final class LoopState: @unchecked Sendable {
        let loop: any EventLoop
        var snapshot: AgentSnapshot {
            didSet {
                plans = [:]
                lastPlan = nil
            }
        }
        /// Plans made from this snapshot, by model and whether the client brings a key: the
        /// plan is a function of the snapshot alone, so it holds until the next one (bounded).
        private var plans: [PlanKey: GatewayPlan] = [:]
        struct PlanKey: Hashable {
            var model: String?
            var clientHasKey: Bool
            var server: String?
        }

        /// The last plan made or found: request after request the same model's, its key compared
        /// (a model's name is short) rather than hashed.
        private var lastPlan: (key: PlanKey, plan: GatewayPlan)?

        func plan(model: String?, clientHasKey: Bool, server: String? = nil, limit: Int) -> GatewayPlan {
            let key = PlanKey(model: model, clientHasKey: clientHasKey, server: server)
            if let last = lastPlan, last.key == key { return last.plan }
            // (The table moved out and back, as the addresses': hashing a `String` is a call the
            // compiler cannot see into, and an access to a class's property that spans one is
            // checked at run time.)
            var plans: [PlanKey: GatewayPlan] = [:]
            swap(&plans, &self.plans)
            defer { swap(&plans, &self.plans) }
            let plan: GatewayPlan
            if let known = plans[key] {
                plan = known
            } else {
                plan = snapshot.gatewayPlan(limit: limit, model: model, clientHasKey: clientHasKey, server: server)
                if plans.count >= 256 { plans = [:] }
                plans[key] = plan
            }
            lastPlan = (key, plan)
            return plan
        }
        let pool: UpstreamPool
        /// Asks whether a user is in `gateway.group` (nil: the group is gone), off the loop:
        /// on a thread of SwiftNIO's pool (the account database may wait on a directory
        /// service); the in-process tests answer on the loop.
        var groupLookup: (GroupMembership, UInt32) -> EventLoopFuture<Bool?>
        /// Exchanges held for a route or with a stream in progress, told of every change of the
        /// agent's state (``UpstreamExchange/routesChanged()``): a request held is planned again,
        /// a stream on a route the agent knows is gone is not left to a TCP timeout.
        private var streams: [ObjectIdentifier: StreamWatch] = [:]
        final class StreamWatch {
            weak var exchange: UpstreamExchange?
            init(_ exchange: UpstreamExchange) { self.exchange = exchange }
        }

        func watchStreams(_ exchange: UpstreamExchange) {
            streams[ObjectIdentifier(exchange)] = StreamWatch(exchange)
        }

        func unwatchStreams(_ exchange: UpstreamExchange) {
            streams[ObjectIdentifier(exchange)] = nil
        }

        /// When this loop last took a request (``noteRequest()``).
        private var lastRequest = NIODeadline.distantPast
        /// Whether requests tell the agent's manager it is in use (off in the in-process
        /// harness, whose snapshots the test publishes, not a manager).
        var reportsUse = true

        /// A request came: whether the loop had none for a second (the agent is told it is in
        /// use then, at most once a second per loop).
        func noteRequest() -> Bool {
            guard reportsUse else { return false }
            let now = NIODeadline.now()
            defer { lastRequest = now }
            return now - lastRequest >= .seconds(1)
        }

        /// The agent's state changed: each stream in progress is looked at.
        func snapshotChanged() {
            guard !streams.isEmpty else { return }
            for (id, watch) in streams {
                if let exchange = watch.exchange { exchange.routesChanged() } else { streams[id] = nil }
            }
        }

        /// Routes' addresses, read once per base URL (bounded: cleared past 1,024).
        private var addresses: [String: UpstreamAddress?] = [:]
        /// The last one asked for: the same route's, request after request, its URL the same
        /// `String` (compared without reading it), not hashed again.
        private var lastAddress: (baseURL: String, address: UpstreamAddress?)?

        func address(_ baseURL: String) -> UpstreamAddress? {
            if let last = lastAddress, last.baseURL == baseURL { return last.address }
            let address: UpstreamAddress?
            var addresses: [String: UpstreamAddress?] = [:]
            swap(&addresses, &self.addresses)
            if let known = addresses[baseURL] {
                address = known
            } else {
                if addresses.count >= 1024 { addresses = [:] }
                address = UpstreamAddress(baseURL)
                addresses[baseURL] = address
            }
            swap(&addresses, &self.addresses)
            lastAddress = (baseURL, address)
            return address
        }

        /// The route whose count of requests in flight was last asked for (request after
        /// request the same route's: its key's `String` the same, compared without reading it),
        /// and the load's generation it was looked up in.
        private var lastCount: (route: RouteKey, count: RouteLoad.Count, generation: Int)?

        func routeCount(_ route: RouteKey, in load: RouteLoad) -> RouteLoad.Count {
            let generation = load.generation
            if let last = lastCount, last.generation == generation, last.route == route { return last.count }
            let count = load.count(route)
            lastCount = (route, count, generation)
            return count
        }

        /// The client timeouts of the loop's connections (one timer for all).
        let sweep: ConnectionSweep
        /// The traffic series the loop's last answer was counted under: the next answer's when it
        /// names the same model over the same path (``GatewayTraffic/Series``), on a connection
        /// of its own or not.
        var recentTraffic: GatewayTraffic.Series?

        init(loop: any EventLoop, snapshot: AgentSnapshot, pool: UpstreamPool, clientTimeout: TimeAmount) {
            self.loop = loop
            self.snapshot = snapshot
            self.pool = pool
            sweep = ConnectionSweep(loop: loop, timeout: clientTimeout)
            groupLookup = { gate, uid in NIOThreadPool.singleton.runIfActive(eventLoop: loop) { gate.allows(uid) } }
        }
    }

    init(gateway: Gateway, tls: TLSConfiguration, group: MultiThreadedEventLoopGroup = .singleton) throws {
        self.gateway = gateway
        self.group = group
        let context = try NIOSSLContext(configuration: tls)
        let snapshot = gateway.agent.board.snapshot
        var loops: [ObjectIdentifier: LoopState] = [:]
        let clientTimeout = TimeAmount.milliseconds(Int64(gateway.configuration.clientTimeout * 1000))
        for loop in group.makeIterator() {
            loops[ObjectIdentifier(loop)] = LoopState(
                loop: loop, snapshot: snapshot, pool: UpstreamPool(eventLoop: loop, tls: context, slots: slots),
                clientTimeout: clientTimeout)
        }
        self.loops = loops
        // A slot freed on one loop may be the one a request on another waits for.
        let states = Array(loops.values)
        slots.onFree { address in
            for state in states { state.loop.execute { state.pool.wakeOne(address) } }
        }
    }

    func state(for loop: any EventLoop) -> LoopState? { loops[ObjectIdentifier(loop)] }

    /// Hands the agent's new state to every loop.
    func publish(_ snapshot: AgentSnapshot) {
        for state in loops.values {
            state.loop.execute {
                state.snapshot = snapshot
                state.snapshotChanged()
            }
        }
    }

    /// The machine's network changed: no connection made before is used again.
    func dropConnections() {
        for state in loops.values {
            state.loop.execute { state.pool.dropAll() }
        }
    }

    /// Follows the agent's state until the gateway stops.
    func follow() async {
        publish(gateway.agent.board.snapshot)
        for await update in gateway.agent.board.updates(buffering: 1) {
            publish(update.snapshot)
        }
    }
}

/// A gateway connection: the per-user limit, then the data path's front and handler. Requests
/// the data path forwards never leave its handler; the others (dashboard, requests that wait for
/// a route or name a server's object, refusals, malformed requests) go to Hummingbird, answered
/// by ``Gateway/forward(_:context:)``. SwiftNIO's HTTP/1 handlers, Hummingbird's and the task that serves them are
/// set up only when a connection first needs them: a connection whose requests all take the data
/// path costs no task and no asynchronous streams (a new connection cost about 300 µs of CPU with
/// them, most of the cost of a one-request connection).
struct GatewayChildChannel: ServerChildChannel, HTTPChannelHandler {
    /// The connection alone: it is served by its pipeline, not by a task of Hummingbird's.
    struct Value: ServerChildChannelValue {
        let channel: any Channel
    }
    let responder: HTTPChannelHandler.Responder
    let limiter: ConnectionLimiter
    let dataPath: GatewayDataPath
    /// Reads of a connection per wake-up of its event loop, and the most each read takes. SwiftNIO
    /// keeps, for each connection's life, one receive buffer per read of a wake-up: with its
    /// defaults (four reads of up to 64 KiB) every connection that moved a large body held up to
    /// 256 KiB (the daemon at 45 MiB after 64 clients sent 4 MB bodies). Two reads of up to 32 KiB
    /// hold 64 KiB (30 MiB where two of 64 KiB left 35, side by side), for about a tenth less
    /// throughput on bodies of 512 KB and more (one read per wake-up was up to a third slower).
    /// The loop comes back to a busy connection at once (level-triggered).
    static let readsPerWakeUp: UInt = 2
    static let maxReceiveBuffer = 32 << 10
    /// The first receive buffer's size (SwiftNIO's default, as ours): a buffer grows only after a
    /// read has filled it.
    static let initialReceiveBuffer = 2048
    /// Receive buffers that grow with what a connection reads, up to `maxReceiveBuffer`.
    static var receiveBuffers: AdaptiveRecvByteBufferAllocator {
        AdaptiveRecvByteBufferAllocator(minimum: 64, initial: initialReceiveBuffer, maximum: maxReceiveBuffer)
    }

    /// Sets `readsPerWakeUp` and `receiveBuffers` on a connection. A client connection of the
    /// data path has them set only once a read fills its first buffer (``ClientFront``): until
    /// then SwiftNIO's defaults hold no more, and most connections (small requests) never need
    /// them (setting the two cost each new connection about 3,800 instructions).
    static func limitReceiveBuffers(of channel: any Channel) {
        let options = channel.syncOptions
        try? options?.setOption(.maxMessagesPerRead, value: readsPerWakeUp)
        try? options?.setOption(.recvAllocator, value: receiveBuffers)
    }
    /// When the daemon stops, what a connection is answering may take this long to end (a stream
    /// runs on); then the connection is closed, answered or not. Under the systemd unit's 15 s
    /// `TimeoutStopSec`, so the daemon always stops by itself.
    static let shutdownGrace = TimeAmount.seconds(10)

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        start(channel: channel, logger: logger).map { Value(channel: channel) }
    }

    /// Admits the connection (the per-user limit) and sets up its pipeline. A TCP connection is
    /// admitted at once, its user asked of the kernel only when it matters
    /// (``ConnectionLimiter/admitUnnamed(_:logger:)``), and it all happens now, without a chain of
    /// futures (each future's `Result` type is looked up in the runtime's metadata cache: the chain
    /// the general way takes cost a new connection about a tenth of its instructions). A Unix
    /// socket's peer is read through a future (`SO_PEERCRED`).
    func start(channel: any Channel, logger: Logger) -> EventLoopFuture<Void> {
        switch channel.localAddress {
        case .v4?, .v6?:
            do {
                let admission = try limiter.admitUnnamed(channel, logger: logger)
                try configure(channel, peer: admission, overTCP: true, logger: logger)
                return channel.eventLoop.makeSucceededVoidFuture()
            } catch {
                return channel.eventLoop.makeFailedFuture(error)
            }
        default:
            return limiter.admit(channel, logger: logger).flatMapThrowing { admission in
                try configure(channel, peer: admission, overTCP: false, logger: logger)
            }
        }
    }

    /// The connection's pipeline: the front and the data path's handler (SwiftNIO's HTTP/1 handlers
    /// and Hummingbird's come between them with the general path).
    private func configure(
        _ channel: any Channel, peer: ConnectionLimiter.Admission, overTCP: Bool, logger: Logger
    ) throws {
        // Set here, on the channel's loop, rather than as the bootstrap's child options: those are
        // applied through a chain of futures (about 7,000 instructions a connection for one). The
        // receive limits come later, when needed (``limitReceiveBuffers(of:)``).
        try channel.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
        let sync = channel.pipeline.syncOperations
        guard let state = dataPath.state(for: channel.eventLoop) else {
            Self.limitReceiveBuffers(of: channel)
            try sync.configureHTTPServerPipeline(
                withPipeliningAssistance: false, withErrorHandling: false, withOutboundHeaderValidation: false)
            try startGeneralPath(on: channel, logger: logger)
            return
        }
        // Requests are read by the front (``ClientFront``). SwiftNIO's HTTP/1 handlers, and
        // Hummingbird's, are set up between the front and the data path's handler only when the
        // connection first needs the general path: a connection whose requests all take the data
        // path never has them (about a twentieth of a one-request connection's instructions, and
        // every flush and read of the connection passed through them).
        let front = ClientFront()
        let handler = GatewayConnectionHandler(
            dataPath: dataPath, state: state, peer: .init(limiter: limiter, admission: peer), overTCP: overTCP,
            startGeneralPath: { channel in
                try channel.pipeline.syncOperations.configureHTTPServerPipeline(
                    position: .after(front), withPipeliningAssistance: false, withErrorHandling: false,
                    withOutboundHeaderValidation: false)
                try startGeneralPath(on: channel, logger: logger)
            })
        front.handler = handler
        handler.front = front
        try sync.addHandler(front)
        try sync.addHandler(handler)
    }

    /// Hummingbird's handlers behind the data path's, and the task that answers what reaches
    /// them; on the connection's event loop, once per connection.
    func startGeneralPath(on channel: any Channel, logger: Logger) throws {
        let sync = channel.pipeline.syncOperations
        try sync.addHandler(HTTP1ToHTTPServerCodec(secure: false))
        try sync.addHandler(HTTPConnectionStateHandler(idleTimeout: nil, logger: logger))
        let asyncChannel = try NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>(
            wrappingChannelSynchronously: channel, configuration: .init(isOutboundHalfClosureEnabled: true))
        let task = Task { await handleHTTP(asyncChannel: asyncChannel, logger: logger) }
        // Hummingbird's task goes on when its connection closes: a client that left would still
        // have its request waited for (held while no route is usable) and its server working on
        // it. Cancelled, the request to the server is cut (async-http-client cancels it).
        channel.closeFuture.whenComplete { _ in task.cancel() }
    }

    func handle(value: Value, logger: Logger) async {}
}
