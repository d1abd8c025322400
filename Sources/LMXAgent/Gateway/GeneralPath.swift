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
        if let resource = DashboardPolicy.resource(path: request.uri.path) {
            return await dashboard.respond(
                resource, request: request, context: context, localhostIsOurs: listeners.localhostIsOurs)
        }
        let clientHeaders = request.headers.map { (name: $0.name.canonicalName, value: $0.value) }
        metrics.gatewayRefused.increment()
        let refusal =
            GatewayPolicy.refusal(
                method: request.method.rawValue, path: request.uri.path, authority: request.head.authority,
                headers: clientHeaders, adminEnabled: configuration.admin, overTCP: context.isTCP,
                localhostIsOurs: listeners.localhostIsOurs)
            ?? GatewayPolicy.unreadRefusal(headers: clientHeaders)
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

    /// The largest answer read whole to learn the object it made (an agent run, a response):
    /// these are small JSON objects; a larger or unsized answer streams through unread.
    static let madeAnswerLimit = 1 << 20

    /// What the gateway sends upstream as `User-Agent` when the client sends none.
    static let userAgent = "lmx-agent/\(StatusAPI.version)"

    /// An error in the shape the path's API reads (``errorBody(status:code:message:path:)``),
    /// so clients show the message.
    static func error(_ status: Int, code: String, message: String, path: String = "") -> Response {
        Response(
            status: HTTPResponse.Status(code: status),
            headers: secured([.contentType: "application/json", .cacheControl: "no-store"]),
            body: .init(
                byteBuffer: ByteBuffer(bytes: errorBody(status: status, code: code, message: message, path: path))))
    }

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
