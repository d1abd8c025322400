import AsyncHTTPClient
import LMXCore
import NIOCore
import NIOHTTP1
import Synchronization

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// How a followed event stream ended.
public enum EventStreamEnd: Sendable, Hashable {
    /// Nothing (not even a heartbeat) within the timeout: the server or the path is stuck.
    case silent(seconds: Double)
    /// The server refused (401/403: wrong admin key; 404: no such endpoint).
    case refused(status: Int)
    /// The connection failed or closed.
    case closed(String)
}

extension Prober {
    /// Follows `GET /admin/events` on `route` with its admin key until the stream ends, is
    /// silent for `silence` seconds, or the task is cancelled. Every event is passed to
    /// `onEvent` (heartbeats too).
    public func followEvents(
        _ route: Route, silence: Double, connectTimeout: Double,
        onEvent: @escaping @Sendable (ServerEvent) async -> Void
    ) async -> EventStreamEnd {
        var request = HTTPClientRequest(url: route.baseURL + "/admin/events")
        request.method = .GET
        request.headers.add(name: "User-Agent", value: "lmx-agent/\(StatusAPI.version)")
        request.headers.add(name: "Accept", value: "text/event-stream")
        for header in route.credentials.headers(forPath: "/admin/events") {
            request.headers.add(name: header.name, value: header.value)
        }
        let response: HTTPClientResponse
        let lease = eventClient.lease()
        defer { withExtendedLifetime(lease) {} }
        do {
            response = try await lease.client.execute(
                request, deadline: .now() + .milliseconds(Int64(connectTimeout * 1000)))
        } catch {
            return .closed(Self.classify(error).detail)
        }
        guard response.status == .ok else { return .refused(status: Int(response.status.code)) }
        let lastActivity = ActivityClock()
        let body = response.body
        return await withTaskGroup(of: EventStreamEnd.self) { group in
            group.addTask {
                var parser = ServerEventParser()
                do {
                    for try await chunk in body {
                        lastActivity.touch()
                        for event in parser.feed(chunk.readableBytesView) { await onEvent(event) }
                    }
                    return .closed("the server ended the stream")
                } catch {
                    return .closed(Self.classify(error).detail)
                }
            }
            group.addTask {
                while !Task.isCancelled {
                    try? await Task.sleep(for: .milliseconds(250))
                    if lastActivity.secondsSince() > silence { return .silent(seconds: silence) }
                }
                return .closed("stopped")
            }
            let end = await group.next() ?? .closed("stopped")
            group.cancelAll()
            return end
        }
    }
}

/// When the stream last carried a byte.
private final class ActivityClock: Sendable {
    private let last = Mutex(ContinuousClock.now)
    func touch() { last.withLock { $0 = .now } }
    func secondsSince() -> Double {
        let d = ContinuousClock.now - last.withLock { $0 }
        return Double(d.components.seconds) + Double(d.components.attoseconds) * 1e-18
    }
}
