import CAvahi
import LMXCore
import Synchronization

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
    /// - Parameter requery: lets the caller ask avahi-daemon again (a link came up).
    public static func events(_ configuration: BrowseConfiguration, requery: AvahiRequery? = nil)
        -> AsyncThrowingStream<BrowseEvent, any Error>
    {
        AsyncThrowingStream(bufferingPolicy: .unbounded) { continuation in
            let session = AvahiSession(configuration: configuration, continuation: continuation)
            continuation.onTermination = { _ in
                // Stopping the poll thread joins it, which must not happen on that thread;
                // termination can be triggered from it, so always stop from elsewhere.
                DispatchQueue.global().async {
                    requery?.attach(nil)
                    session.stop()
                }
            }
            session.start()
            requery?.attach(session)
        }
    }
}

/// Asks avahi-daemon to browse again now: a new browser sends a fresh query at once, instead of
/// waiting for the daemon's query backoff (minutes, once a browse has run for a while). What is
/// already known is not reported again.
public final class AvahiRequery: Sendable {
    private let session = Mutex<AvahiSession?>(nil)

    public init() {}

    func attach(_ session: AvahiSession?) { self.session.withLock { $0 = session } }

    public func now() {
        session.withLock { $0?.requery() }
    }
}

/// Owns the Avahi objects of one browse.
///
/// `@unchecked Sendable` is safe here because every mutable field is touched either on the
/// Avahi poll thread (all callbacks) or, in `start()` and `stop()`, while that thread is not
/// running; the continuation itself is Sendable.
final class AvahiSession: @unchecked Sendable {
    let configuration: BrowseConfiguration
    let continuation: AsyncThrowingStream<BrowseEvent, any Error>.Continuation
    let poll: OpaquePointer
    var client: OpaquePointer?
    var browser: OpaquePointer?
    var resolvers: [RecordKey: Resolver] = [:]
    /// Sightings waiting for a resolver, oldest first (see `scheduleResolves`).
    var queuedResolves: [QueuedResolve] = []
    var resolveTimer: OpaquePointer?
    var retryTimer: OpaquePointer?
    var retireClient: OpaquePointer?
    var wasConnected = false
    var finished = false
    /// Every sighting the browser reports as present, so that a failed resolve can be retried
    /// while (and only while) it is still there.
    var browsed: [RecordKey: QueuedResolve] = [:]
    /// Failed resolves in a row per sighting (cleared by an answer), and when each waiting one is
    /// due again.
    var resolveAttempts: [RecordKey: Int] = [:]
    var resolveDue: [RecordKey: Double] = [:]
    var resolveRetryTimer: OpaquePointer?
    /// Sightings whose resolver has answered at least once.
    var answered: Set<RecordKey> = []
    /// Resolvers kept open for updates at most. avahi-daemon allows each client a fixed number
    /// of objects (`objects-per-client-max`, 1024 by default); past this many (or past what the
    /// daemon allowed when it said "too many objects"), a resolver is closed after its first
    /// answer, so that every sighting is still resolved, one after the other.
    var persistentResolvers = 256
    /// Resolvers to close after their answer (see `persistentResolvers`).
    var closeSoon: [RecordKey] = []

    /// A resolver and the box that lets its callback find its sighting.
    struct Resolver {
        var handle: OpaquePointer
        var context: Unmanaged<ResolverContext>
    }

    struct QueuedResolve {
        var key: RecordKey
        var interface: AvahiIfIndex
        var proto: AvahiProtocol
    }

    /// Resolvers opened per turn of the poll loop.
    static let resolveBatch = 8

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

    var userdata: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }
    var pollAPI: UnsafePointer<AvahiPoll> { avahi_threaded_poll_get(poll) }

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
    func connect() {
        if let retireClient {
            avahi_client_free(retireClient)
            self.retireClient = nil
        }
        var error: Int32 = 0
        let flags = configuration.waitForDaemon ? AVAHI_CLIENT_NO_FAIL : AvahiClientFlags(0)
        // The state callback may run inside avahi_client_new; it stores the client itself.
        let created = avahi_client_new(
            pollAPI, flags,
            { client, state, userdata in
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

    func finish(throwing error: DiscoveryError) {
        guard !finished else { return }
        finished = true
        continuation.finish(throwing: error)
    }

    func scheduleReconnect(after seconds: Double) {
        var when = timeval()
        avahi_elapse_time(&when, UInt32(seconds * 1000), 0)
        if let retryTimer {
            lmx_avahi_timeout_update(pollAPI, retryTimer, &when)
        } else {
            retryTimer = lmx_avahi_timeout_new(
                pollAPI, &when,
                { _, userdata in
                    guard let userdata else { return }
                    let session = Unmanaged<AvahiSession>.fromOpaque(userdata).takeUnretainedValue()
                    lmx_avahi_timeout_update(session.pollAPI, session.retryTimer, nil)
                    session.connect()
                }, userdata)
        }
    }

    // MARK: Client state

    func clientChanged(_ client: OpaquePointer, _ state: AvahiClientState) {
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

    /// A new browser in place of the current one (on any thread but the poll's).
    func requery() {
        avahi_threaded_poll_lock(poll)
        defer { avahi_threaded_poll_unlock(poll) }
        guard !finished, let client, let old = browser, let fresh = makeBrowser(client) else { return }
        browser = fresh
        avahi_service_browser_free(old)
    }

    func openBrowser(_ client: OpaquePointer) {
        let created = makeBrowser(client)
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

    func makeBrowser(_ client: OpaquePointer) -> OpaquePointer? {
        avahi_service_browser_new(
            client, AvahiIfIndex(AVAHI_IF_UNSPEC), avahiProtocol(configuration.ipProtocol),
            configuration.serviceType, configuration.domain, AvahiLookupFlags(0),
            { _, interface, proto, event, name, type, domain, _, userdata in
                guard let userdata else { return }
                Unmanaged<AvahiSession>.fromOpaque(userdata).takeUnretainedValue()
                    .browserEvent(interface, proto, event, name, type, domain)
            }, userdata)
    }

    func closeBrowsing() {
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

    func browserEvent(
        _ interface: AvahiIfIndex, _ proto: AvahiProtocol, _ event: AvahiBrowserEvent,
        _ name: UnsafePointer<CChar>?, _ type: UnsafePointer<CChar>?, _ domain: UnsafePointer<CChar>?
    ) {
        switch event {
        case AVAHI_BROWSER_NEW, AVAHI_BROWSER_REMOVE:
            guard let key = recordKey(interface, proto, name, type, domain),
                configuration.interfaces.allows(key.interface.name)
            else { return }
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
            break  // CACHE_EXHAUSTED carries nothing we need.
        }
    }
}
