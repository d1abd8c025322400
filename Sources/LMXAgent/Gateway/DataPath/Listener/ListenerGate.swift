import NIOCore

/// A listening socket's own handler: at most `maxConnections` of the connections it accepted
/// are open at once (past that it accepts no more until one closes), and on the daemon's graceful
/// shutdown (``quiesce(_:)``) it stops accepting, tells each open connection to finish what it is
/// answering (`ChannelShouldQuiesceEvent`) and keeps the promise once the last one has closed.
///
/// In place of Hummingbird's `AvailableConnectionsChannelHandler` and swift-nio-extras'
/// `ServerQuiescingHelper`, which did the same in two handlers, each passing every new connection
/// on through the listening socket's pipeline and following its close through futures and a
/// callback of its own: here a connection takes a slot in an array (no hashing), one callback
/// gives it back.
///
/// Used on the listening socket's event loop only (`@unchecked Sendable`: a connection that
/// closes on another loop hands its slot back on this one).
final class ListenerGate: ChannelDuplexHandler, @unchecked Sendable {
    typealias InboundIn = any Channel
    typealias InboundOut = any Channel
    typealias OutboundIn = Never
    typealias OutboundOut = Never

    /// The listening socket's event loop.
    let loop: any EventLoop
    let maxConnections: Int
    /// The open connections.
    private var connections = SlotTable<any Channel>()
    /// Connections accepted and not yet closed.
    var openCount: Int { connections.count }
    /// Slots the table holds (its peak of connections open at once).
    var slotCount: Int { connections.capacity }
    private var context: ChannelHandlerContext?
    /// An accept held back while `maxConnections` are open.
    private var readHeld = false

    private enum Phase {
        case serving
        /// Shutting down: the promise is kept when the last connection has closed.
        case quiescing(EventLoopPromise<Void>)
        case stopped
    }
    private var phase = Phase.serving

    init(loop: any EventLoop, maxConnections: Int) {
        self.loop = loop
        self.maxConnections = max(1, maxConnections)
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let channel = unwrapInboundIn(data)
        if case .stopped = phase {
            channel.close(promise: nil)
            return
        }
        let slot = connections.add(channel)
        channel.closeFuture.whenComplete { [self, loop] _ in
            if loop.inEventLoop {
                closed(slot)
            } else {
                loop.execute { self.closed(slot) }
            }
        }
        if case .quiescing = phase {
            channel.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        }
        context.fireChannelRead(data)
    }

    func read(context: ChannelHandlerContext) {
        guard openCount < maxConnections else {
            readHeld = true
            return
        }
        context.read()
    }

    private func closed(_ slot: Int) {
        connections.remove(slot)
        if readHeld, openCount < maxConnections, let context {
            readHeld = false
            context.read()
        }
        stopIfNoneOpen()
    }

    /// Shutting down and no connection left open: the promise is kept (once).
    private func stopIfNoneOpen() {
        guard openCount == 0, case .quiescing(let promise) = phase else { return }
        phase = .stopped
        promise.succeed()
    }

    /// Stops accepting (the listening socket is closed), asks every open connection to finish
    /// and close, and keeps `promise` when none is open. From any thread; asked again, the same.
    func quiesce(_ promise: EventLoopPromise<Void>) {
        loop.execute { self.quiesceOnLoop(promise) }
    }

    private func quiesceOnLoop(_ promise: EventLoopPromise<Void>) {
        switch phase {
        case .serving:
            phase = .quiescing(promise)
            context?.close(promise: nil)
            // (A connection told to finish may close at once, giving its slot back meanwhile.)
            for channel in connections.elements {
                channel.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
            }
            stopIfNoneOpen()
        case .quiescing(let first):
            first.futureResult.cascade(to: promise)
        case .stopped:
            promise.succeed()
        }
    }
}
