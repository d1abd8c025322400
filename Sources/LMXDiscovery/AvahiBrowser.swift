import CAvahi
import LMXCore

#if canImport(Glibc)
import Glibc
#endif
#if canImport(Dispatch)
import Dispatch
#endif

/// Browses and resolves a DNS-SD service type through the system avahi-daemon.
///
/// Each sighting (instance × interface × protocol) gets a resolver that stays open, so later
/// changes of address, port, host or TXT are reported as they happen. With
/// ``BrowseConfiguration/waitForDaemon`` the browse survives the daemon's absence and restarts:
/// browsers and resolvers are rebuilt on a fresh client each time it comes back.
public enum AvahiBrowser {
    /// Starts browsing; stops when the consumer stops iterating.
    /// - Throws: ``DiscoveryError`` through the stream: the daemon is unreachable (when not
    ///   waiting for it), was lost, or refused the browse.
    public static func events(_ configuration: BrowseConfiguration) -> AsyncThrowingStream<BrowseEvent, any Error> {
        AsyncThrowingStream(bufferingPolicy: .unbounded) { continuation in
            let session = AvahiSession(configuration: configuration, continuation: continuation)
            continuation.onTermination = { _ in
                // Stopping the poll thread joins it, which must not happen on that thread;
                // termination can be triggered from it, so always stop from elsewhere.
                DispatchQueue.global().async { session.stop() }
            }
            session.start()
        }
    }
}

/// Owns the Avahi objects of one browse.
///
/// `@unchecked Sendable` is safe here because every mutable field is touched either on the
/// Avahi poll thread (all callbacks) or, in `start()` and `stop()`, while that thread is not
/// running; the continuation itself is Sendable.
private final class AvahiSession: @unchecked Sendable {
    private let configuration: BrowseConfiguration
    private let continuation: AsyncThrowingStream<BrowseEvent, any Error>.Continuation
    private let poll: OpaquePointer
    private var client: OpaquePointer?
    private var browser: OpaquePointer?
    private var resolvers: [RecordKey: Resolver] = [:]
    /// Sightings waiting for a resolver, oldest first (see `scheduleResolves`).
    private var queuedResolves: [QueuedResolve] = []
    private var resolveTimer: OpaquePointer?
    private var retryTimer: OpaquePointer?
    private var retireClient: OpaquePointer?
    private var wasConnected = false
    private var finished = false
    /// Every sighting the browser reports as present, so that a failed resolve can be retried
    /// while (and only while) it is still there.
    private var browsed: [RecordKey: QueuedResolve] = [:]
    /// Failed resolves in a row per sighting (cleared by an answer), and when each waiting one is
    /// due again.
    private var resolveAttempts: [RecordKey: Int] = [:]
    private var resolveDue: [RecordKey: Double] = [:]
    private var resolveRetryTimer: OpaquePointer?
    /// Sightings whose resolver has answered at least once.
    private var answered: Set<RecordKey> = []
    /// Resolvers kept open for updates at most. avahi-daemon allows each client a fixed number
    /// of objects (`objects-per-client-max`, 1024 by default); past this many (or past what the
    /// daemon allowed when it said "too many objects"), a resolver is closed after its first
    /// answer, so that every sighting is still resolved, one after the other.
    private var persistentResolvers = 256

    /// A resolver and the box that lets its callback find its sighting.
    private struct Resolver {
        var handle: OpaquePointer
        var context: Unmanaged<ResolverContext>
    }

    private struct QueuedResolve {
        var key: RecordKey
        var interface: AvahiIfIndex
        var proto: AvahiProtocol
    }

    /// Resolvers opened per turn of the poll loop.
    private static let resolveBatch = 8

    final class ResolverContext {
        let key: RecordKey
        unowned let session: AvahiSession
        init(key: RecordKey, session: AvahiSession) {
            self.key = key
            self.session = session
        }
    }

    init(configuration: BrowseConfiguration, continuation: AsyncThrowingStream<BrowseEvent, any Error>.Continuation) {
        self.configuration = configuration
        self.continuation = continuation
        guard let poll = avahi_threaded_poll_new() else { fatalError("avahi_threaded_poll_new: out of memory") }
        self.poll = poll
    }

    private var userdata: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }
    private var pollAPI: UnsafePointer<AvahiPoll> { avahi_threaded_poll_get(poll) }

    // MARK: Lifecycle

    func start() {
        connect()
        if !finished { avahi_threaded_poll_start(poll) }
    }

    func stop() {
        avahi_threaded_poll_stop(poll)
        closeBrowsing()
        if let retryTimer { lmx_avahi_timeout_free(pollAPI, retryTimer) }
        retryTimer = nil
        if let resolveTimer { lmx_avahi_timeout_free(pollAPI, resolveTimer) }
        resolveTimer = nil
        if let resolveRetryTimer { lmx_avahi_timeout_free(pollAPI, resolveRetryTimer) }
        resolveRetryTimer = nil
        if let retireClient { avahi_client_free(retireClient) }
        if let client { avahi_client_free(client) }
        client = nil
        retireClient = nil
        avahi_threaded_poll_free(poll)
    }

    /// Creates a client; runs on the caller's thread before the poll starts, then on the poll thread.
    private func connect() {
        if let retireClient {
            avahi_client_free(retireClient)
            self.retireClient = nil
        }
        var error: Int32 = 0
        let flags = configuration.waitForDaemon ? AVAHI_CLIENT_NO_FAIL : AvahiClientFlags(0)
        // The state callback may run inside avahi_client_new; it stores the client itself.
        let created = avahi_client_new(pollAPI, flags, { client, state, userdata in
            guard let client, let userdata else { return }
            Unmanaged<AvahiSession>.fromOpaque(userdata).takeUnretainedValue().clientChanged(client, state)
        }, userdata, &error)
        if let created {
            client = created
            return
        }
        let detail = String(cString: avahi_strerror(error))
        if configuration.waitForDaemon {
            // NO_FAIL covers an absent avahi-daemon but not an absent system bus: poll for it.
            continuation.yield(.daemon(.waiting(reason: "system D-Bus unreachable: \(detail)")))
            scheduleReconnect(after: configuration.busRetryInterval)
        } else {
            finish(throwing: .daemonUnreachable(detail))
        }
    }

    private func finish(throwing error: DiscoveryError) {
        guard !finished else { return }
        finished = true
        continuation.finish(throwing: error)
    }

    private func scheduleReconnect(after seconds: Double) {
        var when = timeval()
        avahi_elapse_time(&when, UInt32(seconds * 1000), 0)
        if let retryTimer {
            lmx_avahi_timeout_update(pollAPI, retryTimer, &when)
        } else {
            retryTimer = lmx_avahi_timeout_new(pollAPI, &when, { _, userdata in
                guard let userdata else { return }
                let session = Unmanaged<AvahiSession>.fromOpaque(userdata).takeUnretainedValue()
                lmx_avahi_timeout_update(session.pollAPI, session.retryTimer, nil)
                session.connect()
            }, userdata)
        }
    }

    // MARK: Client state

    private func clientChanged(_ client: OpaquePointer, _ state: AvahiClientState) {
        switch state {
        case AVAHI_CLIENT_S_RUNNING, AVAHI_CLIENT_S_REGISTERING, AVAHI_CLIENT_S_COLLISION:
            self.client = client
            guard browser == nil else { return }
            wasConnected = true
            continuation.yield(.daemon(.running))
            openBrowser(client)

        case AVAHI_CLIENT_CONNECTING:
            continuation.yield(.daemon(.waiting(reason: "avahi-daemon is not running")))

        case AVAHI_CLIENT_FAILURE:
            let errno = avahi_client_errno(client)
            let detail = String(cString: avahi_strerror(errno))
            closeBrowsing()
            guard configuration.waitForDaemon else {
                finish(throwing: wasConnected ? .daemonLost(detail) : .daemonUnreachable(detail))
                return
            }
            continuation.yield(.daemon(.reconnecting))
            // A client must not be freed inside its own callback: retire it and reconnect from
            // a timer on the same thread.
            retireClient = client
            self.client = nil
            scheduleReconnect(after: 0)

        default:
            break
        }
    }

    // MARK: Browsing

    private func openBrowser(_ client: OpaquePointer) {
        let created = avahi_service_browser_new(
            client, AvahiIfIndex(AVAHI_IF_UNSPEC), avahiProtocol(configuration.ipProtocol),
            configuration.serviceType, configuration.domain, AvahiLookupFlags(0),
            { _, interface, proto, event, name, type, domain, _, userdata in
                guard let userdata else { return }
                Unmanaged<AvahiSession>.fromOpaque(userdata).takeUnretainedValue()
                    .browserEvent(interface, proto, event, name, type, domain)
            }, userdata)
        guard let created else {
            let detail = String(cString: avahi_strerror(avahi_client_errno(client)))
            if configuration.waitForDaemon {
                // Not the end of discovery: start over on a new client, as after a daemon restart.
                continuation.yield(.daemon(.waiting(reason: "avahi-daemon refused the browse: \(detail); retrying")))
                retireClient = self.client
                self.client = nil
                scheduleReconnect(after: configuration.busRetryInterval)
            } else {
                finish(throwing: .browseFailed("\(detail) for service type '\(configuration.serviceType)'"))
            }
            return
        }
        browser = created
    }

    private func closeBrowsing() {
        queuedResolves.removeAll()
        browsed.removeAll()
        resolveAttempts.removeAll()
        resolveDue.removeAll()
        answered.removeAll()
        if let resolveRetryTimer { lmx_avahi_timeout_update(pollAPI, resolveRetryTimer, nil) }
        for resolver in resolvers.values {
            avahi_service_resolver_free(resolver.handle)
            resolver.context.release()
        }
        resolvers.removeAll()
        if let browser { avahi_service_browser_free(browser) }
        browser = nil
    }

    private func browserEvent(
        _ interface: AvahiIfIndex, _ proto: AvahiProtocol, _ event: AvahiBrowserEvent,
        _ name: UnsafePointer<CChar>?, _ type: UnsafePointer<CChar>?, _ domain: UnsafePointer<CChar>?
    ) {
        switch event {
        case AVAHI_BROWSER_NEW, AVAHI_BROWSER_REMOVE:
            guard let key = recordKey(interface, proto, name, type, domain),
                  configuration.interfaces.allows(key.interface.name) else { return }
            if event == AVAHI_BROWSER_NEW {
                guard browsed[key] == nil else { return }
                let queued = QueuedResolve(key: key, interface: interface, proto: proto)
                browsed[key] = queued
                continuation.yield(.found(key))
                queuedResolves.append(queued)
                scheduleResolves()
            } else {
                browsed[key] = nil
                resolveAttempts[key] = nil
                resolveDue[key] = nil
                answered.remove(key)
                queuedResolves.removeAll { $0.key == key }
                dropResolver(key)
                continuation.yield(.lost(key))
            }
        case AVAHI_BROWSER_ALL_FOR_NOW:
            continuation.yield(.allForNow)
        case AVAHI_BROWSER_FAILURE:
            let detail = client.map { String(cString: avahi_strerror(avahi_client_errno($0))) } ?? "unknown error"
            if configuration.waitForDaemon {
                // Treated like a daemon restart: rebuild everything on a new client.
                closeBrowsing()
                continuation.yield(.daemon(.reconnecting))
                retireClient = client
                client = nil
                scheduleReconnect(after: configuration.busRetryInterval)
            } else {
                finish(throwing: .browseFailed(detail))
            }
        default:
            break // CACHE_EXHAUSTED carries nothing we need.
        }
    }

    /// Opening a resolver is a blocking D-Bus round trip, and the daemon sends every cached
    /// sighting at once. Opening them inline would let no answer through before the last
    /// sighting is handled; instead a timer opens a few per turn, a millisecond apart, so the
    /// browse events drain first and answers are dispatched between batches.
    private func scheduleResolves() {
        var when = timeval()
        avahi_elapse_time(&when, 1, 0)
        if let resolveTimer {
            lmx_avahi_timeout_update(pollAPI, resolveTimer, &when)
        } else {
            resolveTimer = lmx_avahi_timeout_new(pollAPI, &when, { _, userdata in
                guard let userdata else { return }
                Unmanaged<AvahiSession>.fromOpaque(userdata).takeUnretainedValue().openQueuedResolvers()
            }, userdata)
        }
    }

    private func openQueuedResolvers() {
        lmx_avahi_timeout_update(pollAPI, resolveTimer, nil)
        for key in closeSoon { dropResolver(key) }
        closeSoon.removeAll()
        let batch = queuedResolves.prefix(Self.resolveBatch)
        queuedResolves.removeFirst(batch.count)
        for queued in batch { openResolver(queued.key, queued.interface, queued.proto) }
        if !queuedResolves.isEmpty { scheduleResolves() }
    }

    private func openResolver(_ key: RecordKey, _ interface: AvahiIfIndex, _ proto: AvahiProtocol) {
        guard let client else { return }
        let context = Unmanaged.passRetained(ResolverContext(key: key, session: self))
        // A sighting over IPv4 asks for the A record: with "unspecified" (avahi-browse's choice)
        // a dual-stack host's IPv4 sighting can resolve to its IPv6 address, and its IPv4
        // address is then missing. Over IPv6 any family is accepted, so IPv4-only servers (the
        // reference server publishes no AAAA) still resolve there.
        let addressProtocol = proto == AvahiProtocol(AVAHI_PROTO_INET) ? proto : AvahiProtocol(AVAHI_PROTO_UNSPEC)
        let instance = key.instance
        let handle = avahi_service_resolver_new(
            client, interface, proto, instance.name, instance.type, instance.domain, addressProtocol, AvahiLookupFlags(0),
            { _, _, _, event, _, _, _, host, address, port, txt, _, userdata in
                guard let userdata else { return }
                let context = Unmanaged<ResolverContext>.fromOpaque(userdata).takeUnretainedValue()
                context.session.resolverEvent(context.key, event, host, address, port, txt)
            }, context.toOpaque())
        guard let handle else {
            context.release()
            let code = avahi_client_errno(client)
            if code == AVAHI_ERR_TOO_MANY_OBJECTS {
                // The daemon's per-client limit: keep fewer resolvers open from now on.
                persistentResolvers = max(8, resolvers.count - 8)
                closeAnsweredBeyondLimit()
            }
            continuation.yield(.resolveFailed(key, reason: String(cString: avahi_strerror(code))))
            retryResolve(key)
            return
        }
        resolvers[key] = Resolver(handle: handle, context: context)
    }

    private func dropResolver(_ key: RecordKey) {
        guard let resolver = resolvers.removeValue(forKey: key) else { return }
        avahi_service_resolver_free(resolver.handle)
        resolver.context.release()
    }

    private func resolverEvent(
        _ key: RecordKey, _ event: AvahiResolverEvent, _ host: UnsafePointer<CChar>?,
        _ address: UnsafePointer<AvahiAddress>?, _ port: UInt16, _ txt: UnsafeMutablePointer<AvahiStringList>?
    ) {
        guard event == AVAHI_RESOLVER_FOUND, let host, let address else {
            let detail = client.map { String(cString: avahi_strerror(avahi_client_errno($0))) } ?? "resolver failed"
            // Freeing inside the callback is what avahi-browse does; the context outlives it
            // because we hold it until here.
            dropResolver(key)
            continuation.yield(.resolveFailed(key, reason: detail))
            retryResolve(key)
            return
        }
        resolveAttempts[key] = nil
        answered.insert(key)
        var text = [CChar](repeating: 0, count: Int(AVAHI_ADDRESS_STR_MAX))
        avahi_address_snprint(&text, text.count, address)
        let record = ResolvedRecord(
            key: key, hostName: String(cString: host), address: Self.string(text),
            port: port, txt: TXTRecord(entries: Self.entries(txt)))
        continuation.yield(.resolved(record))
        if resolvers.count > persistentResolvers {
            // Past the budget: this one has answered; close it (from a timer, not inside its
            // own callback) and make room for the next.
            closeSoon.append(key)
            scheduleResolves()
        }
    }

    /// Resolvers to close after their answer (see `persistentResolvers`).
    private var closeSoon: [RecordKey] = []

    /// Closes answered resolvers until at most `persistentResolvers` stay open.
    private func closeAnsweredBeyondLimit() {
        var excess = resolvers.count - persistentResolvers
        for key in resolvers.keys where excess > 0 && answered.contains(key) {
            dropResolver(key)
            excess -= 1
        }
    }

    private static func monotonic() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    /// Schedules another resolve of a sighting that is still browsed: 1, 2, 4 … up to 30 s.
    private func retryResolve(_ key: RecordKey) {
        guard browsed[key] != nil else { return }
        let attempts = resolveAttempts[key, default: 0] + 1
        resolveAttempts[key] = attempts
        resolveDue[key] = Self.monotonic() + min(30, Double(1 << min(attempts - 1, 5)))
        armRetryTimer()
    }

    private func armRetryTimer() {
        guard let next = resolveDue.values.min() else { return }
        var when = timeval()
        avahi_elapse_time(&when, UInt32(max(1, (next - Self.monotonic()) * 1000)), 0)
        if let resolveRetryTimer {
            lmx_avahi_timeout_update(pollAPI, resolveRetryTimer, &when)
        } else {
            resolveRetryTimer = lmx_avahi_timeout_new(pollAPI, &when, { _, userdata in
                guard let userdata else { return }
                Unmanaged<AvahiSession>.fromOpaque(userdata).takeUnretainedValue().retryDueResolves()
            }, userdata)
        }
    }

    private func retryDueResolves() {
        lmx_avahi_timeout_update(pollAPI, resolveRetryTimer, nil)
        let now = Self.monotonic()
        for (key, due) in resolveDue where due <= now {
            resolveDue[key] = nil
            guard let queued = browsed[key], resolvers[key] == nil else { continue }
            if !queuedResolves.contains(where: { $0.key == key }) { queuedResolves.append(queued) }
        }
        scheduleResolves()
        armRetryTimer()
    }

    // MARK: Conversions

    /// The client library hands TXT over in wire order.
    private static func entries(_ list: UnsafeMutablePointer<AvahiStringList>?) -> [[UInt8]] {
        var result: [[UInt8]] = []
        var node = list
        while let current = node {
            let size = avahi_string_list_get_size(current)
            if let text = avahi_string_list_get_text(current) {
                result.append(Array(UnsafeBufferPointer(start: text, count: size)))
            } else {
                result.append([])
            }
            node = avahi_string_list_get_next(current)
        }
        return result
    }

    private func recordKey(
        _ interface: AvahiIfIndex, _ proto: AvahiProtocol,
        _ name: UnsafePointer<CChar>?, _ type: UnsafePointer<CChar>?, _ domain: UnsafePointer<CChar>?
    ) -> RecordKey? {
        guard let name, let type, let domain else { return nil }
        let ipProtocol: IPProtocol = proto == AvahiProtocol(AVAHI_PROTO_INET6) ? .ipv6 : .ipv4
        let instance = ServiceInstanceID(name: String(cString: name), type: String(cString: type), domain: String(cString: domain))
        return RecordKey(instance: instance, interface: NetworkInterface(index: interface, name: Self.interfaceName(interface)), ipProtocol: ipProtocol)
    }

    private static func interfaceName(_ index: AvahiIfIndex) -> String {
        var buffer = [CChar](repeating: 0, count: Int(IF_NAMESIZE) + 1)
        guard index > 0, if_indextoname(UInt32(index), &buffer) != nil else { return "if\(index)" }
        return string(buffer)
    }

    private static func string(_ buffer: [CChar]) -> String {
        String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    private func avahiProtocol(_ ipProtocol: IPProtocol?) -> AvahiProtocol {
        switch ipProtocol {
        case .ipv4: AvahiProtocol(AVAHI_PROTO_INET)
        case .ipv6: AvahiProtocol(AVAHI_PROTO_INET6)
        case nil: AvahiProtocol(AVAHI_PROTO_UNSPEC)
        }
    }
}
