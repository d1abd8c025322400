import AsyncHTTPClient
import NIOCore
import NIOSSL
import Synchronization

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
    public static func make(
        tls: TLSConfiguration, connectTimeout: Double? = nil, idleTimeout: Int64, connectionsPerHost: Int = 8
    ) -> HTTPClient {
        var configuration = HTTPClient.Configuration(
            tlsConfiguration: tls,
            redirectConfiguration: .disallow,
            timeout: .init(connect: connectTimeout.map { .milliseconds(Int64($0 * 1000)) }),
            decompression: .disabled)
        configuration.connectionPool = .init(
            idleTimeout: .seconds(idleTimeout), concurrentHTTP1ConnectionsPerHostSoftLimit: connectionsPerHost)
        configuration.connectionPool.retryConnectionEstablishment = false
        configuration.httpVersion = .http1Only
        return HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    }
}

/// An HTTP client whose pooled connections can be dropped all at once (this machine's network
/// changed: they may be bound to an address that is gone) without cutting requests in flight:
/// `renew()` starts a new client for what follows; the old one shuts down when the last request
/// that leased it is done.
public final class RenewableHTTPClient: Sendable {
    private let make: @Sendable () -> HTTPClient
    private let current: Mutex<Generation>

    /// One client and the requests using it.
    final class Generation: Sendable {
        let client: HTTPClient
        private let state = Mutex((leases: 0, retired: false, closed: false))
        /// The servers (base URLs) this client has connected to: async-http-client keeps a pool
        /// per server until the client shuts down.
        let servers = Mutex(Set<String>())
        init(_ client: HTTPClient) { self.client = client }

        func acquire() { state.withLock { $0.leases += 1 } }
        func release() {
            state.withLock { $0.leases -= 1 }
            closeIfDone()
        }
        func retire() {
            state.withLock { $0.retired = true }
            closeIfDone()
        }

        private func closeIfDone() {
            let close = state.withLock { s in
                guard s.retired, s.leases == 0, !s.closed else { return false }
                s.closed = true
                return true
            }
            if close { Task { [client] in try? await client.shutdown() } }
        }
    }

    /// A client for one request, kept until the lease is released (or dropped).
    public final class Lease: Sendable {
        let generation: Generation
        public var client: HTTPClient { generation.client }
        init(_ generation: Generation) {
            self.generation = generation
            generation.acquire()
        }
        deinit { generation.release() }
    }

    public init(_ make: @escaping @Sendable () -> HTTPClient) {
        self.make = make
        current = Mutex(Generation(make()))
    }

    /// Servers one client may have pools for: async-http-client never forgets a server's pool
    /// while the client lives, so a stream of new announcers (each a new `host:port`) would grow
    /// it without bound. Past this many, the next new server gets a fresh client (the old one
    /// closes once its requests are done).
    public static let maxServersPerClient = 256

    public func lease() -> Lease { current.withLock { Lease($0) } }

    /// A lease for a request to `server` (its base URL), renewing the client first when it has
    /// pools for `maxServersPerClient` other servers already.
    public func lease(server: String) -> Lease {
        let full = current.withLock { generation in
            generation.servers.withLock { servers in
                if servers.contains(server) { return false }
                if servers.count >= Self.maxServersPerClient { return true }
                servers.insert(server)
                return false
            }
        }
        if full {
            renew()
            current.withLock { generation in _ = generation.servers.withLock { $0.insert(server) } }
        }
        return lease()
    }

    /// New connections from now on; the old pool closes once its last request is done.
    public func renew() {
        let fresh = Generation(make())
        let old = current.withLock { current in
            defer { current = fresh }
            return current
        }
        old.retire()
    }

    public func shutdown() async {
        let generation = current.withLock { $0 }
        generation.retire()
        try? await generation.client.shutdown()
    }
}
