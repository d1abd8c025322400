import Hummingbird
import HummingbirdCore
import LMXCore
import LMXSystem
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import ServiceLifecycle
import Synchronization

/// A Hummingbird server run the way `Application` runs one (its responder, its server's child
/// channel, `Date` and `Server` headers on every answer), without the task `Application` keeps
/// for the `Date` header's text: that task wakes every second for the daemon's whole life, most
/// of an idle daemon's CPU. Here the text is made by the answer that finds the second changed
/// (``HTTPDateText``): while nobody asks, nothing runs.
struct QuietApplication<Responder: HTTPResponder>: Service
where Responder.Context: InitializableFromSource<ApplicationRequestContextSource> {
    let responder: Responder
    let server: HTTPServerBuilder
    let configuration: ServerConfiguration
    let onServerRunning: @Sendable (any Channel) async -> Void
    let logger: Logger

    struct AnswerNotWritten: Error {}

    func run() async throws {
        let dates = HTTPDateText()
        let (responder, logger, serverName) = (self.responder, self.logger, configuration.serverName)
        let service = try server.buildServer(
            configuration: configuration, eventLoopGroup: MultiThreadedEventLoopGroup.singleton, logger: logger,
            responder: { request, writer, channel in
                let context = Responder.Context(source: .init(channel: channel, logger: logger))
                var response: Response
                do {
                    response = try await responder.respond(to: request, context: context)
                } catch let error as HTTPParserError {
                    throw error
                } catch {
                    logger.debug("a request's handler failed", metadata: ["error.type": "\(type(of: error))"])
                    response = Response(status: .internalServerError, body: .init())
                }
                response.headers[.date] = dates.now()
                if let serverName { response.headers[.server] = serverName }
                do {
                    try await writer.write(response: response.head, body: response.body)
                } catch is HTTPParserError {
                    // Not the parser error itself: the connection's handler would answer it
                    // with a second response.
                    throw AnswerNotWritten()
                }
            },
            onServerRunning: onServerRunning)
        try await service.run()
    }
}

/// The `Date` header's text for now: formatted again only when the second has changed since the
/// last answer's (one clock read per answer otherwise).
final class HTTPDateText: Sendable {
    private let last = Mutex<(second: Int64, text: String)>((.min, ""))

    func now() -> String {
        let second = SystemClock.unixTime()
        if let text = last.withLock({ $0.second == second ? $0.text : nil }) { return text }
        let text = HTTPDate.format(unixSeconds: second)
        last.withLock { $0 = (second, text) }
        return text
    }
}
