import LMXCore
import LMXProbe
import LMXSystem
import NIOCore
import NIOHTTP1
import Prometheus

/// A part of an answer of the data path, as written to the client (its head already bytes).
enum ClientOutput {
    case head(ByteBuffer)
    case body(ByteBuffer)
    case end
}

/// How an answer's body is framed to the client (``GatewayConnectionHandler/answerHead(_:status:sized:estimate:headers:)``).
enum ClientFraming {
    /// As it is: its length, or no body (`HEAD`, 204, 304).
    case asIs
    /// Chunked: no length, to an HTTP/1.1 client.
    case chunked
    /// Until the connection closes: no length, to an HTTP/1.0 client.
    case untilClose
}

/// A request the data path forwards, from its head to its answer's end: what its exchange
/// (``GatewayExchange``, the decisions; ``UpstreamExchange``, which performs them and holds the
/// server's connection) needs beside it — its bytes, its routes, what it holds of the answer and
/// of the gateway's counts.
final class ForwardedRequest {
    /// The exchange's state and rules (a value in the core, tested without I/O).
    var machine: GatewayExchange
    /// The head, with its bytes as the client sent them (given to llhttp if the request is handed over).
    let head: ClientHead
    let path: String
    /// The path may name or make an object of one server (``ServerAffinity/mayConcern(path:)``).
    let mayConcern: Bool
    /// When its head came (``SystemClock/monotonic()``: the traffic figures' start).
    let started = SystemClock.monotonic()
    /// What the body read ahead holds of the shared budget (made with the first body part).
    private var reservation: ReadAheadBudget.Reservation?
    /// The body read ahead (while collecting), then what arrives while connecting: one part as
    /// it came, or from the second on one buffer they are copied into (``add(_:)``), never a
    /// buffer per part (a body sent a byte at a time held about 180 bytes per byte that way).
    var parts: [ByteBuffer] = []
    /// Bytes of storage ``parts`` holds beyond the body's own bytes (a coalesced buffer's room to
    /// grow), counted against the read-ahead budget with them.
    private(set) var slack = 0
    /// ``parts`` is one buffer of the gateway's own (not a slice of a read).
    private var coalesced = false
    var model: String?
    /// The client brings a key of its own (`Authorization`, `X-Api-Key`).
    var clientHasKey = false
    var madeByRequest: ServerObject?
    /// The server that holds the object the request names (``ServerAffinity/named``), as the
    /// client's user's table knows it: the request goes to that server only.
    var server: (instance: String, object: ServerObject)?
    /// The answer names an object made by the request (``ServerAffinity/answerMakes``).
    var answerMakes = false
    /// The `Idempotency-Key` the gateway adds to a run's creation that came without one.
    var addedIdempotencyKey: String?
    /// The answer's body, read as it passes when it may name an object made (bounded).
    var madeAnswer: [UInt8]?
    var targets: [GatewayTarget] = []
    var keepAlive = true
    /// How the answer's body is framed to the client.
    var framing = ClientFraming.asIs
    /// The answer held until the client's body has come (``GatewayExchange/holdsAnswer``).
    var held = HeldAnswer()
    var relay: EventRelay?
    /// The traffic figures' series the answer was counted under (its stream's figures go under it).
    var traffic: GatewayTraffic.Series?
    /// The gateway's in-flight gauge, while it counts this request.
    var inFlight: Gauge?
    /// The route's count of requests in flight, while it counts this request.
    var routeCount: RouteLoad.Count?

    init(
        head: ClientHead, path: String, declaredLength: Int, mayConcern: Bool, configuration: GatewayConfiguration,
        maxBodyBytes: Int
    ) {
        self.head = head
        self.path = path
        self.mayConcern = mayConcern
        machine = GatewayExchange(
            method: head.method.rawValue, declaredLength: declaredLength,
            maxBodyBytes: maxBodyBytes,
            readAheadBytes: configuration.readAheadBytes)
        machine.resumable = StreamContinuation.resumable(method: head.method.rawValue, path: path)
    }

    var clientEnded: Bool { machine.clientEnded }
    var phase: GatewayExchange.Phase { machine.phase }
    /// The route tried now.
    var target: GatewayTarget { targets[min(machine.attempt, targets.count - 1)] }

    /// Keeps a part of the body: the first as it came (a slice of the read that brought it),
    /// the next ones copied with it into one buffer of the body's size when declared, else grown
    /// by doubling (``countStorage(in:for:)`` counts it). (The array moved out and back: its
    /// growth spans a call the compiler cannot see into, which would make every access to it
    /// checked at run time.)
    func add(_ chunk: ByteBuffer) {
        var parts: [ByteBuffer] = []
        swap(&parts, &self.parts)
        defer { swap(&parts, &self.parts) }
        guard var whole = parts.first else {
            parts.append(chunk)
            return
        }
        parts = []
        var chunk = chunk
        let needed = whole.readableBytes + chunk.readableBytes
        if !coalesced {
            // The first copy: one buffer sized for the declared body when that is near, or for
            // twice what came.
            coalesced = true
            let declared = machine.declaredLength
            var buffer = ByteBufferAllocator().buffer(
                capacity: declared >= needed && declared <= needed * 2 ? declared : needed * 2)
            buffer.writeBuffer(&whole)
            whole = buffer
        }
        whole.writeBuffer(&chunk)
        parts.append(whole)
        slack = whole.capacity - whole.readableBytes
    }

    /// The body went on as it came: nothing of it is kept.
    func dropBody() {
        parts = []
        slack = 0
        coalesced = false
    }

    /// Once the body is one buffer of the gateway's (``add(_:)``), its reservation counts that
    /// buffer's whole capacity: the bytes the budget took as they came, and the room beyond them.
    func countStorage(in budget: ReadAheadBudget, for peer: PeerUser) {
        guard coalesced, let whole = parts.first else { return }
        let reservation = reservation(from: budget, for: peer)
        reservation.hold(whole.capacity - reservation.bytes)
    }

    func reservation(from budget: ReadAheadBudget, for peer: PeerUser) -> ReadAheadBudget.Reservation {
        if let reservation { return reservation }
        let made = budget.reservation(for: peer.uid)
        reservation = made
        return made
    }

    /// Counted in flight (the gateway's gauge) from now until released.
    func countInFlight(_ gauge: Gauge) {
        guard inFlight == nil else { return }
        gauge.increment()
        inFlight = gauge
    }

    /// Counted against `count` (its route's) from now until released, and no longer against the
    /// route it was counted against before.
    func countOnRoute(_ count: RouteLoad.Count) {
        count.add()
        routeCount?.remove()
        routeCount = count
    }

    /// No longer counted against its route (the attempt on it failed).
    func leaveRoute() {
        routeCount?.remove()
        routeCount = nil
    }

    /// No longer counted in flight, on the gateway or its route.
    func releaseCounts() {
        inFlight?.decrement()
        inFlight = nil
        leaveRoute()
    }

    deinit { releaseCounts() }
}

/// An answer held while the client is still sending its body (``GatewayExchange/holdsAnswer``):
/// its parts in order, the body's bytes among them, and what their storage takes.
struct HeldAnswer {
    private(set) var parts: [ClientOutput] = []
    /// The body's bytes held (the bound is on these).
    private(set) var bodyBytes = 0
    /// The last part is a body buffer of the gateway's own.
    private var lastOwned = false

    var isEmpty: Bool { parts.isEmpty }

    /// Holds a part (as ``ForwardedRequest/add(_:)`` the client's body): body parts after the
    /// first copied into one buffer of the gateway's, never a slice of a server's read each (a
    /// server sending a byte a chunk would have had each read's buffer and an entry per byte held).
    mutating func hold(_ part: ClientOutput) {
        guard case .body(var bytes) = part else {
            parts.append(part)
            lastOwned = false
            return
        }
        bodyBytes += bytes.readableBytes
        guard case .body(var last)? = parts.last else {
            parts.append(part)
            lastOwned = false
            return
        }
        parts.removeLast()
        if !lastOwned {
            lastOwned = true
            var owned = ByteBufferAllocator().buffer(capacity: 2 * (last.readableBytes + bytes.readableBytes))
            owned.writeBuffer(&last)
            last = owned
        }
        last.writeBuffer(&bytes)
        parts.append(.body(last))
    }

    /// The parts held, and none held any more.
    mutating func take() -> [ClientOutput] {
        defer { self = HeldAnswer() }
        return parts
    }

    /// The storage the parts take.
    var storage: Int {
        parts.reduce(0) { total, part in
            switch part {
            case .head(let bytes), .body(let bytes): total + max(bytes.capacity, bytes.readableBytes)
            case .end: total
            }
        }
    }
}
