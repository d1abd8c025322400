import LMXCore
import LMXSystem

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The status API as Swift calls (as tailscale's `client/local` is for its daemon): one method
/// per endpoint, answers decoded, the API's errors as `StatusClientError.answered` with the
/// agent's own reason. Used by `lmx-status` and `lmx-pair`.
public struct AgentClient: Sendable {
    public let http: StatusClient

    public init(socketPath: String, timeout: Double = 5) {
        http = StatusClient(socketPath: socketPath, timeout: timeout)
    }

    public var socketPath: String { http.socketPath }

    /// `GET /v1/status`, with its raw JSON.
    public func status() throws(StatusClientError) -> (status: StatusAPI.Status, json: [UInt8]) {
        let response = try http.request("GET", "/v1/status")
        return (try decode(response, expecting: 200), response.body)
    }

    /// `GET /v1/active`: the active endpoint, or nil and why there is none.
    public func active() throws(StatusClientError) -> (active: StatusAPI.Active?, reason: String) {
        let response = try http.request("GET", "/v1/active")
        if response.status == 503 { return (nil, Self.reason(response)) }
        return (try decode(response, expecting: 200) as StatusAPI.Active, "")
    }

    /// `GET /v1/resolve?model=`: the best usable endpoint that has `model` (its `endpoint` is nil
    /// when none has), with the raw JSON.
    public func resolve(model: String) throws(StatusClientError) -> (resolved: StatusAPI.Resolved, json: [UInt8]) {
        let response = try http.request("GET", "/v1/resolve?model=" + Pairing.percentEncodeComponent(model))
        guard response.status == 200 || response.status == 503,
            let resolved = try? JSONDecoder().decode(StatusAPI.Resolved.self, from: Data(response.body))
        else { throw .answered(status: response.status, reason: Self.reason(response)) }
        return (resolved, response.body)
    }

    /// `GET /v1/history?since=` (a duration back from now, `24h`; or a time), with its raw JSON.
    public func history(since: String) throws(StatusClientError) -> (history: StatusAPI.History, json: [UInt8]) {
        let response = try http.request("GET", "/v1/history?since=" + Pairing.percentEncodeComponent(since))
        return (try decode(response, expecting: 200), response.body)
    }

    public func pairings() throws(StatusClientError) -> [PairingSummary] {
        try decode(try http.request("GET", "/v1/pairings"), expecting: 200)
    }

    public func importPairings(_ upload: PairingUpload) throws(StatusClientError) -> [PairingImportResult] {
        let body = (try? JSONEncoder().encode(upload)).map { Array($0) } ?? []
        return try decode(try http.request("POST", "/v1/pairings", body: body), expecting: 201)
    }

    public func removePairing(_ idOrName: String) throws(StatusClientError) -> PairingSummary {
        try decode(
            try http.request("DELETE", "/v1/pairings/" + Pairing.percentEncodeComponent(idOrName)), expecting: 200)
    }

    /// Follows `/v1/watch`: `line` gets each decoded line (nil for one it cannot read) with its
    /// raw bytes, until the agent closes the stream or `line` returns false.
    public func watch(_ line: (StatusAPI.WatchLine?, [UInt8]) -> Bool) throws(StatusClientError) {
        try http.stream("/v1/watch") { bytes in
            line(try? JSONDecoder().decode(StatusAPI.WatchLine.self, from: Data(bytes)), bytes)
        }
    }

    private func decode<T: Decodable>(_ response: StatusResponse, expecting status: Int) throws(StatusClientError) -> T
    {
        guard response.status == status else { throw .answered(status: response.status, reason: Self.reason(response)) }
        guard let value = try? JSONDecoder().decode(T.self, from: Data(response.body)) else {
            throw .protocolError("unreadable answer (HTTP \(response.status))")
        }
        return value
    }

    /// The API's reason for an error answer.
    public static func reason(_ response: StatusResponse) -> String {
        (try? JSONDecoder().decode(StatusAPI.ErrorBody.self, from: Data(response.body)))?.reason
            ?? "HTTP \(response.status)"
    }
}

/// Pairings through the running agent: probed at once.
public struct AgentPairingBook: PairingBook {
    let client: AgentClient

    public init(client: AgentClient) { self.client = client }

    public var location: String { "lmx-agentd" }
    public var isLive: Bool { true }

    private func translate(_ error: StatusClientError, _ what: String) -> PairingBookError {
        switch error {
        case .notRunning: .agentNotRunning(error.description)
        case .forbidden:
            .unavailable(
                "permission denied on \(client.socketPath): run lmx-pair as root (sudo) or as the agent's user")
        case .answered(403, _):
            .unavailable("lmx-agentd refused: only root or the agent's own user may \(what) (try sudo)")
        case .answered(404, let reason): .notFound(reason)
        case .answered(422, let reason): .invalid("lmx-agentd refused the pairing: \(reason)")
        case .answered(_, let reason): .unavailable("lmx-agentd could not \(what): \(reason)")
        default: .unavailable("\(error); retry, or stop the agent to use its database directly")
        }
    }

    public func list() throws(PairingBookError) -> [PairingSummary] {
        do { return try client.pairings() } catch { throw translate(error, "list pairings") }
    }

    public func add(_ upload: PairingUpload, parsed: [Pairing]) throws(PairingBookError) -> [PairingImportResult] {
        do { return try client.importPairings(upload) } catch { throw translate(error, "import pairings") }
    }

    public func remove(_ idOrName: String) throws(PairingBookError) -> PairingSummary {
        do { return try client.removePairing(idOrName) } catch { throw translate(error, "remove pairings") }
    }
}

extension PairingBook {
    /// Polls until every route of the pairings in `results` has a verdict, at most `timeout`
    /// seconds: the latest results, and whether all verdicts came.
    public func awaitVerdicts(_ results: [PairingImportResult], timeout: Double) -> (
        results: [PairingImportResult], complete: Bool
    ) {
        let ids = Set(results.map(\.pairing.id))
        let deadline = SystemClock.monotonic() + timeout
        var latest = results
        while true {
            if let mine = try? list().filter({ ids.contains($0.id) }) {
                latest = results.map { result in
                    var result = result
                    if let fresh = mine.first(where: { $0.id == result.pairing.id }) { result.pairing = fresh }
                    return result
                }
                if mine.count == ids.count && mine.allSatisfy({ ($0.routes ?? []).allSatisfy { $0.verdict != nil } }) {
                    return (latest, true)
                }
            }
            if SystemClock.monotonic() >= deadline { return (latest, false) }
            SystemClock.sleep(seconds: 0.1)
        }
    }
}
