import Hummingbird
import HummingbirdCore
import LMXCore
import LMXSystem
import NIOCore
import NIOHTTP1
import Prometheus
import Synchronization

extension Gateway {
    /// The largest answer read whole to learn the object it made (an agent run, a response):
    /// these are small JSON objects; a larger or unsized answer streams through unread.
    static let madeAnswerLimit = 1 << 20

    /// What the gateway sends upstream as `User-Agent` when the client sends none.
    static let userAgent = "lmx-agent/\(StatusAPI.version)"

    /// The JSON of an error in the OpenAI API's shape, with a final newline.
    /// The gateway's own error in the shape the request's API reads: Anthropic's
    /// (`{"type": "error", "error": {"type": …, "message": …}}`) on `/v1/messages`, where the
    /// Anthropic SDKs read it; OpenAI's everywhere else.
    static func errorBody(status: Int, code: String, message: String, path: String) -> [UInt8] {
        guard path == "/v1/messages" || path.hasPrefix("/v1/messages/") else {
            return errorBody(code: code, message: message)
        }
        struct Body: Encodable {
            struct Detail: Encodable {
                var type: String
                var message: String
                var code: String
            }
            var type = "error"
            var error: Detail
        }
        let type =
            switch status {
            case 400: "invalid_request_error"
            case 401: "authentication_error"
            case 403: "permission_error"
            case 404: "not_found_error"
            case 413: "request_too_large"
            case 429: "rate_limit_error"
            case 503, 529: "overloaded_error"
            default: "api_error"
            }
        let body = Body(error: .init(type: type, message: message, code: code))
        var bytes = (try? StatusAPI.encoder.encode(body)).map { Array($0) } ?? Array("{}".utf8)
        bytes.append(0x0A)
        return bytes
    }

    static func errorBody(code: String, message: String) -> [UInt8] {
        struct Body: Encodable {
            struct Detail: Encodable {
                var message: String
                var type: String
                var code: String
            }
            var error: Detail
        }
        let body = Body(error: .init(message: message, type: "lmx_gateway_error", code: code))
        var bytes = (try? StatusAPI.encoder.encode(body)).map { Array($0) } ?? Array("{}".utf8)
        bytes.append(0x0A)
        return bytes
    }

    /// A stream of events that ended in the middle of a line: cut (a reader would drop that
    /// event anyway).
    struct StreamEndedMidEvent: Error {}

    /// Events of a streamed answer as they pass: how many, when the first and the last came.
    struct EventTally {
        var events = 0
        /// When the first and the last event passed (``SystemClock/monotonic()``, seconds: read
        /// as a `Double` at once, where a `Duration` between two clock instants is turned into
        /// seconds by dividing a 128-bit count, about 190 instructions each).
        var first: Double?
        var last: Double?
        var line = EventBoundary.Line.start

        mutating func count(_ bytes: UnsafeRawBufferPointer) {
            let ended = EventBoundary.count(in: bytes, line: &line)
            guard ended > 0 else { return }
            let now = SystemClock.monotonic()
            if first == nil { first = now }
            last = now
            events += ended
        }
    }

    /// The largest partial event held back while its end has not arrived.
    static let maxHeldEvent = 1 << 20

    /// `event: error` with the OpenAI error shape, `code: upstream_lost` and the route.
    static func streamLostEvent(target: GatewayTarget, error: any Error) -> [UInt8] {
        struct Body: Encodable {
            struct Detail: Encodable {
                var message: String
                var type = "lmx_gateway_error"
                var code = "upstream_lost"
                var route: String
            }
            var error: Detail
        }
        let detail = Body.Detail(
            message: "the connection to the Opta LMX server was lost mid-answer; the agent is probing it again",
            route: target.routeID)
        let json = (try? StatusAPI.encoder.encode(Body(error: detail))).map { Array($0) } ?? Array("{}".utf8)
        return Array("event: error\ndata: ".utf8) + json + Array("\n\n".utf8)
    }
}

/// How busy each route is, as the gateway sees it: its own requests in flight, and the servers
/// that answered 429 (all slots busy) or 503 overloaded, passed over until their `Retry-After`.
final class RouteLoad: Sendable {
    /// One route's requests in flight: counted without the table's lock (the data path keeps the
    /// count of the route it last used and adds to it with one atomic operation).
    final class Count: Sendable {
        private let value = Atomic<Int>(0)
        /// When a byte last came from the route's server (``NIODeadline/uptimeNanoseconds``; 0:
        /// never): the manager reads it as proof of life (``observed()``).
        private let heardValue = Atomic<UInt64>(0)
        var current: Int { value.load(ordering: .relaxed) }
        func add() { value.add(1, ordering: .relaxed) }
        func remove() { value.subtract(1, ordering: .relaxed) }
        func heard(at time: NIODeadline) { heardValue.store(time.uptimeNanoseconds, ordering: .relaxed) }
        var lastHeard: NIODeadline? {
            let nanos = heardValue.load(ordering: .relaxed)
            return nanos == 0 ? nil : .uptimeNanoseconds(nanos)
        }
    }

    /// Each counted route's requests in flight and seconds since its server's last byte, for the
    /// manager (passive health, and whether the agent is in use).
    func observed() -> [String: (inFlight: Int, heardAgo: Double?)] {
        let now = NIODeadline.now()
        return state.withLock { s in
            var seen: [String: (inFlight: Int, heardAgo: Double?)] = [:]
            for (route, count) in s.counts {
                let ago = count.lastHeard.map { Double((now - $0).nanoseconds) / 1e9 }
                seen[route.id] = (count.current, ago)
            }
            return seen
        }
    }

    private struct State {
        var counts: [RouteKey: Count] = [:]
        var coolUntil: [RouteKey: ContinuousClock.Instant] = [:]
    }
    private let state = Mutex(State())
    /// Changes whenever counts leave the table: a count kept from before is looked up again.
    private let generationValue = Atomic<Int>(0)
    var generation: Int { generationValue.load(ordering: .acquiring) }

    /// The count of `route`'s requests in flight (made at its first request).
    func count(_ route: RouteKey) -> Count {
        state.withLock { s in
            if let known = s.counts[route] { return known }
            // Many routes counted (servers come and go): the idle ones go (their next request
            // makes them again); whoever kept one looks it up again.
            if s.counts.count >= 64 {
                s.counts = s.counts.filter { $0.value.current > 0 }
                generationValue.add(1, ordering: .releasing)
            }
            let made = Count()
            s.counts[route] = made
            return made
        }
    }

    /// Counts a request to `route` until the returned token is released.
    func started(_ route: RouteKey) -> any AnyObject & Sendable {
        let count = count(route)
        count.add()
        return Token(count)
    }

    /// A request counted by ``started(_:)``: uncounted when released (one object per request,
    /// where a ``Release`` would take a closure's too).
    private final class Token: Sendable {
        let count: Count
        init(_ count: Count) { self.count = count }
        deinit { count.remove() }
    }

    func coolDown(_ route: RouteKey, seconds: Double) {
        guard seconds.isFinite, seconds > 0 else { return }
        let until = ContinuousClock.now + .milliseconds(Int64(min(seconds, 86_400) * 1000))
        state.withLock { $0.coolUntil[route] = until }
    }

    /// Best first: routes not cooling down before those that are, then the planner's rank, then
    /// the fewest requests in flight (the gateway's own, and what the server said at its last
    /// probe); the planner's order breaks the remaining ties.
    func order(_ targets: [GatewayTarget]) -> [GatewayTarget] {
        guard targets.count > 1 else { return targets }  // one route: nothing to weigh
        let now = ContinuousClock.now
        // Each target's weights, read under the lock in the targets' order.
        let weights: [(cooling: Bool, count: Int)] = state.withLock { s in
            s.coolUntil = s.coolUntil.filter { $0.value > now }
            return targets.map {
                (
                    s.coolUntil[$0.routeKey] != nil,
                    max(s.counts[$0.routeKey]?.current ?? 0, 0)
                        &+ min(max($0.serverInFlight, 0), OutsideInput.maxCount)
                )
            }
        }
        return targets.enumerated().sorted { a, b in
            let (wa, wb) = (weights[a.offset], weights[b.offset])
            let ka = (wa.cooling ? 1 : 0, a.element.rank, wa.count, a.offset)
            let kb = (wb.cooling ? 1 : 0, b.element.rank, wb.count, b.offset)
            return ka < kb
        }.map(\.element)
    }

    /// The cool-down a busy answer asks for: 429, or 503 that says it is overloaded (or gives a
    /// `Retry-After`); its `Retry-After` seconds, capped; nil for any other answer.
    static func busyCooldown(code: Int, retryAfter: String?, cap: Double) -> Double? {
        let retryAfter = retryAfter.flatMap { OutsideInput.delaySeconds($0, cap: cap) }
        guard code == 429 || (code == 503 && retryAfter != nil) else { return nil }
        return min(max(retryAfter ?? 5, 1), max(cap, 1))
    }
}

/// Runs `action` once, when released.
final class Release: Sendable {
    let action: @Sendable () -> Void
    init(_ action: @escaping @Sendable () -> Void) { self.action = action }
    deinit { action() }
}

/// Where a forwarded answer's figures go (``GatewayTraffic``): the request's model and start.
struct TrafficTap: Sendable {
    let traffic: GatewayTraffic
    let model: String?
    /// When the request came (``SystemClock/monotonic()``).
    let started: Double

    /// The answer's head came (now): its status, and the time to it unless it is a stream.
    /// Returns the series it was counted under (`recent`, the event loop's last, when the model
    /// and path are the same: ``GatewayTraffic/answered(model:via:status:firstByte:answered:recent:)``).
    @discardableResult
    func answered(_ via: Via, status: Int, stream: Bool, recent: GatewayTraffic.Series? = nil) -> GatewayTraffic.Series
    {
        let firstByte = stream ? nil : SystemClock.monotonic() - started
        return traffic.answered(
            model: model, via: via, status: status, firstByte: firstByte, answered: true, recent: recent)
    }

    /// A stream's figures under the series its answer was counted under (its model's text is
    /// labelled and hashed at most once per request).
    func streamed(series: GatewayTraffic.Series, _ tally: Gateway.EventTally) {
        let firstEvent = tally.first.map { $0 - started }
        let span = tally.first.flatMap { first in tally.last.map { $0 - first } } ?? 0
        traffic.streamed(series: series, firstEvent: firstEvent, events: tally.events, seconds: span)
    }
}
