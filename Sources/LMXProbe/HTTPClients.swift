import AsyncHTTPClient
import NIOCore
import NIOSSL

/// The one way the agent makes HTTP clients (probes, the event stream, the gateway): the system
/// trust store plus an optional CA file, no redirects followed (a redirect is the server's
/// answer: a Cloudflare Access login), bytes as the server sent them, HTTP/1.1, and a refused
/// connection reported at once rather than retried (it is a verdict, or a reason to try another
/// route).
public enum HTTPClients {
    /// - Throws: when the CA file cannot be read (said once, with its path, at start).
    public static func tls(extraCAFile: String?) throws -> TLSConfiguration {
        var tls = TLSConfiguration.makeClientConfiguration()
        if let extraCAFile {
            tls.additionalTrustRoots = [.file(extraCAFile)]
            _ = try NIOSSLCertificate.fromPEMFile(extraCAFile)
        }
        return tls
    }

    /// - Parameter connectionsPerHost: connections to one server at most (async-http-client's
    ///   default is 8; the gateway sets hundreds).
    public static func make(tls: TLSConfiguration, connectTimeout: Double? = nil, idleTimeout: Int64, connectionsPerHost: Int = 8) -> HTTPClient {
        var configuration = HTTPClient.Configuration(
            tlsConfiguration: tls,
            redirectConfiguration: .disallow,
            timeout: .init(connect: connectTimeout.map { .milliseconds(Int64($0 * 1000)) }),
            decompression: .disabled)
        configuration.connectionPool = .init(idleTimeout: .seconds(idleTimeout), concurrentHTTP1ConnectionsPerHostSoftLimit: connectionsPerHost)
        configuration.connectionPool.retryConnectionEstablishment = false
        configuration.httpVersion = .http1Only
        return HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    }
}
