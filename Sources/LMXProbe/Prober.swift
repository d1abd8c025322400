import AsyncHTTPClient
import LMXCore
import LMXSystem
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization

/// Probes Opta LMX endpoints over HTTP(S) by the contract (`ProbeSequence` decides, this performs).
/// One shared client, so connections to each server are pooled and reused between probes
/// (and dropped together when this machine's network changes: `dropConnections()`).
public final class Prober: Sendable {
    private let client: RenewableHTTPClient
    /// For probes whose connection attempt gives up early (a route whose network just came
    /// back): async-http-client sets the connect timeout per client.
    private let quickConnectClient: RenewableHTTPClient
    /// A client of its own for `/admin/events`: a stream holds its connection for as long as it
    /// lasts and must not take one from the probes.
    let eventClient: RenewableHTTPClient

    /// - Parameter extraCAFile: a PEM file of certificate authorities trusted in addition to the
    ///   system trust store (private deployments and tests).
    /// - Throws: when the CA file cannot be read.
    /// - Parameter quickConnectTimeout: the connect timeout of probes that ask for a short one.
    public init(extraCAFile: String? = nil, quickConnectTimeout: Double = ConnectionPlanner.pathReturnConnectTimeout)
        throws
    {
        let tls = try HTTPClients.tls(extraCAFile: extraCAFile)
        client = RenewableHTTPClient { HTTPClients.make(tls: tls, idleTimeout: 90) }
        quickConnectClient = RenewableHTTPClient {
            // Its connections are kept for a second at most: a check before a route is handed out
            // must open a new one (a kept one to a server gone silent would wait for the whole
            // timeout), and a new one gives up after the quick connect timeout.
            HTTPClients.make(tls: tls, connectTimeout: quickConnectTimeout, idleTimeout: 1)
        }
        eventClient = RenewableHTTPClient { HTTPClients.make(tls: tls, idleTimeout: 90) }
    }

    /// Closes pooled connections. Call once, before the process exits.
    public func shutdown() async {
        await client.shutdown()
        await quickConnectClient.shutdown()
        await eventClient.shutdown()
    }

    /// This machine's network changed: probes from now on open new connections (those pooled
    /// may be bound to an address that is gone); probes and streams in flight finish on theirs.
    public func dropConnections() {
        client.renew()
        quickConnectClient.renew()
        eventClient.renew()
    }

    /// Probes one route; never throws: every failure is a verdict.
    /// - Parameters:
    ///   - route: where and how to probe.
    ///   - timeout: per request, in seconds.
    ///   - full: `false` for a quick liveness check (`/readyz` only).
    ///   - connectTimeout: when given (and shorter than `timeout`), a connection attempt gives up
    ///     after the prober's quick connect timeout (the route's network just came back).
    ///   - checkAPI: also ask `/v1/models` and judge who answered it (``ProbeSequence``).
    public func probe(
        _ route: Route, timeout: Double, full: Bool = true, connectTimeout: Double? = nil, checkAPI: Bool = false
    ) async -> ProbeReport {
        let quick = connectTimeout.map { $0 < timeout } ?? false
        let start = ContinuousClock.now
        var sequence = ProbeSequence(
            servicePath: route.servicePath, via: route.via, pinnedInstance: route.pinnedInstance, quick: !full,
            hasInferenceKey: route.credentials.inferenceKey != nil, checkAPI: checkAPI, baseURL: route.baseURL)
        var path = sequence.firstPath
        while true {
            let result = await get(route, path: path, timeout: timeout, quickConnect: quick)
            switch sequence.receive(result) {
            case .request(let next):
                path = next
            case .finished(var report):
                let elapsed = ContinuousClock.now - start
                report.latency = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
                return report
            }
        }
    }

    /// Whether the route's host accepts a new TCP connection within `timeout` seconds: its
    /// kernel answers for it, as it does for a server busy generating (whose health paths may
    /// answer late), and not for one that vanished (a cut link, a powered-off machine). The
    /// connection is closed at once; nothing is sent.
    public func connects(_ route: Route, timeout: Double) async -> Bool {
        let url = BaseURL(route.baseURL)
        let host: String
        switch url.host {
        case .ipv4(let address), .name(let address): host = address
        case .ipv6(let address, let zone): host = zone.map { address + "%" + $0 } ?? address
        }
        let port = url.port ?? (url.scheme == "https" ? 443 : 80)
        let bootstrap = ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.milliseconds(Int64(max(timeout, 0.01) * 1000)))
        do {
            let channel = try await bootstrap.connect(host: host, port: port).get()
            try? await channel.close()
            return true
        } catch {
            return false
        }
    }

    private func get(_ route: Route, path: String, timeout: Double, quickConnect: Bool) async -> Result<
        ProbeResponse, ProbeTransportFailure
    > {
        var request = HTTPClientRequest(url: route.baseURL + path)
        request.method = .GET
        request.headers.add(name: "User-Agent", value: "lmx-agent/\(StatusAPI.version)")
        request.headers.add(name: "Accept", value: "application/json")
        // A quick-connect probe (a check before a route is handed out, a network just back) is
        // never sent over a kept connection: one to a server gone silent would wait for the whole
        // timeout, where a new one gives up after the quick connect timeout.
        if quickConnect { request.headers.add(name: "Connection", value: "close") }
        for header in route.credentials.headers(forPath: path) {
            request.headers.add(name: header.name, value: header.value)
        }
        // One deadline for the whole exchange, head and body: async-http-client's own deadline ends
        // with the head, and a server that stalls mid-body would otherwise hold the probe forever.
        let client = (quickConnect ? quickConnectClient : self.client).lease(server: route.baseURL)
        let prepared = request
        let budget = TimeAmount.milliseconds(Int64(timeout * 1000))
        return await Self.withDeadline(seconds: timeout) {
            do {
                let response = try await client.client.execute(prepared, deadline: .now() + budget)
                var headers: [String: String] = [:]
                for (name, value) in response.headers {
                    let name = name.lowercased()
                    if name == "content-type", let first = headers[name] {
                        // A second one: read as the request path reads it (``AnswerLabel/then(_:)``).
                        let label = AnswerLabel(contentType: first)
                        if label.then(AnswerLabel(contentType: value)) != label { headers[name] = value }
                    } else {
                        headers[name] = headers[name] ?? value
                    }
                }
                var body: [UInt8] = []
                // Only small JSON documents matter: stop reading at the cap (the connection is
                // then closed, not reused).
                for try await chunk in response.body {
                    body.append(contentsOf: chunk.readableBytesView.prefix(Self.bodyLimit - body.count))
                    if body.count >= Self.bodyLimit { break }
                }
                return .success(ProbeResponse(status: Int(response.status.code), headers: headers, body: body))
            } catch {
                return .failure(Self.classify(error))
            }
        }
    }

    /// Bytes of a response body read at most.
    static let bodyLimit = 65_536

    /// Runs `operation` in its own task and answers `.timeout` if it has not finished within
    /// `seconds`; the operation is then cancelled and not waited for, so a peer that ignores
    /// cancellation cannot hold the caller.
    static func withDeadline(
        seconds: Double, _ operation: @escaping @Sendable () async -> Result<ProbeResponse, ProbeTransportFailure>
    ) async -> Result<ProbeResponse, ProbeTransportFailure> {
        let once = ResumeOnce()
        var work: Task<Void, Never>?
        var timer: Task<Void, Never>?
        let result = await withCheckedContinuation { continuation in
            once.set(continuation)
            work = Task { once.resume(await operation()) }
            timer = Task {
                try? await Task.sleep(for: .milliseconds(Int64(seconds * 1000)))
                if !Task.isCancelled { once.resume(.failure(.timeout)) }
            }
        }
        work?.cancel()
        timer?.cancel()
        return result
    }

    /// Maps the many error types of the HTTP stack to the kinds people care about.
    public static func classify(_ error: any Error) -> ProbeTransportFailure {
        if let error = error as? HTTPClientError {
            switch error {
            case .deadlineExceeded, .connectTimeout, .readTimeout, .writeTimeout, .getConnectionFromPoolTimeout:
                return .timeout
            case .remoteConnectionClosed:
                return .reset
            default:
                break
            }
        }
        if let error = error as? IOError { return classify(errno: error.errnoCode) }
        if let error = error as? NIOConnectionError {
            if let inner = error.connectionErrors.first?.error { return classify(inner) }
            if error.dnsAError != nil || error.dnsAAAAError != nil { return .nameResolution }
        }
        if error is NIOSSLError || error is BoringSSLError {
            return .tls(tlsSummary(error))
        }
        if error is ChannelError, case .connectTimeout = error as! ChannelError { return .timeout }
        let text = String(describing: error)
        if text.contains("refused") { return .refused }
        if text.contains("reset") { return .reset }
        if text.contains("unreachable") { return .unreachable }
        if text.contains("certificate") || text.contains("SSL") || text.contains("TLS") {
            return .tls(tlsSummary(error))
        }
        if text.contains("lookup") || text.contains("resolve") { return .nameResolution }
        return .other(String(text.prefix(160)))
    }

    static func classify(errno code: Int32) -> ProbeTransportFailure {
        switch SystemError.connectFailure(code) {
        case .refused: .refused
        case .reset: .reset
        case .unreachable: .unreachable
        case .timedOut: .timeout
        case .noAddress: .noAddress
        case .blocked: .blocked
        case .other: .other(SystemError.connectWords(code))
        }
    }

    static func tlsSummary(_ error: any Error) -> String {
        let text = String(describing: error)
        if text.contains("CERTIFICATE_VERIFY_FAILED") || text.contains("certificate verify") {
            return "certificate not trusted"
        }
        if text.contains("hostname") || text.contains("unableToValidateCertificate") {
            return "certificate does not match the host"
        }
        return "handshake failed"
    }
}

/// A continuation resumed by whichever of two tasks finishes first.
private final class ResumeOnce: Sendable {
    private let continuation = Mutex<CheckedContinuation<Result<ProbeResponse, ProbeTransportFailure>, Never>?>(nil)

    func set(_ c: CheckedContinuation<Result<ProbeResponse, ProbeTransportFailure>, Never>) {
        continuation.withLock { $0 = c }
    }

    func resume(_ result: Result<ProbeResponse, ProbeTransportFailure>) {
        let c = continuation.withLock { c in
            defer { c = nil }
            return c
        }
        c?.resume(returning: result)
    }
}
