import Hummingbird
import HummingbirdCore
import LMXCore
import LMXSystem
import NIOCore
import Synchronization

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The general path: Hummingbird behind SwiftNIO's llhttp decoder, for what the data path hands
/// it. It serves the dashboard, and refuses every other request it is given (one llhttp read
/// because the data path's reader did not: ``ClientRequestParser``) in the gateway's own words;
/// it forwards nothing: every request to a server goes through the data path.
extension Gateway {
    func answer(_ request: Request, context: AgentRequestContext) async -> Response {
        // A bad request over TCP without a Host, the dashboard's too (as the data path answers it).
        if context.isTCP, request.head.authority == nil {
            metrics.gatewayRefused.increment()
            let refusal = GatewayPolicy.noHost
            return Self.error(refusal.status, code: refusal.code, message: refusal.message, path: request.uri.path)
        }
        if let resource = DashboardPolicy.resource(path: request.uri.path) {
            return await dashboard.respond(
                resource, request: request, context: context, localhostIsOurs: listeners.localhostIsOurs)
        }
        let clientHeaders = request.headers.map { (name: $0.name.canonicalName, value: $0.value) }
        metrics.gatewayRefused.increment()
        let refusal =
            GatewayPolicy.refusal(
                method: request.method.rawValue, path: request.uri.path, authority: request.head.authority,
                headers: clientHeaders, adminEnabled: adminEnabled, overTCP: context.isTCP,
                localhostIsOurs: listeners.localhostIsOurs)
            ?? GatewayPolicy.unreadRefusal(
                headers: clientHeaders, lines: clientHeaders.count + (request.head.authority == nil ? 0 : 1))
        return Self.error(refusal.status, code: refusal.code, message: refusal.message, path: request.uri.path)
    }

    /// `fields` with the security headers set (replacing any of the same name).
    static func secured(_ fields: HTTPFields) -> HTTPFields {
        var fields = fields
        for (name, value) in GatewayPolicy.securityHeaders {
            if let field = HTTPFields.Element.Name(name) { fields[field] = value }
        }
        return fields
    }

    /// An error in the shape the path's API reads (``errorBody(status:code:message:path:)``),
    /// so clients show the message.
    static func error(_ status: Int, code: String, message: String, path: String = "") -> Response {
        Response(
            status: HTTPResponse.Status(code: status),
            headers: secured([.contentType: "application/json", .cacheControl: "no-store"]),
            body: .init(
                byteBuffer: ByteBuffer(bytes: errorBody(status: status, code: code, message: message, path: path))))
    }
}

/// The gateway's ``AffinityTable``, shared by its requests, on the monotonic clock; per local
/// user (the uid of the client's connection).
final class ServerAffinityBook: Sendable {
    private let table = Mutex(AffinityTable())

    func record(_ object: ServerObject, on instance: String, user: UInt32?) {
        let now = SystemClock.monotonic()
        table.withLock { $0.record(object, on: instance, user: user, now: now) }
    }

    func owner(of object: ServerObject, user: UInt32?) -> String? {
        let now = SystemClock.monotonic()
        return table.withLock { $0.owner(of: object, user: user, now: now) }
    }
}
