import CAvahi
import LMXCore
import LMXSystem

#if canImport(Glibc)
import Glibc
#endif
#if canImport(Dispatch)
import Dispatch
#endif

// Resolving: one resolver per sighting, opened a few at a time, retried, the answered ones
// closed beyond a limit.
extension AvahiSession {
    /// Opening a resolver is a blocking D-Bus round trip, and the daemon sends every cached
    /// sighting at once. Opening them inline would let no answer through before the last
    /// sighting is handled; instead a timer opens a few per turn, a millisecond apart, so the
    /// browse events drain first and answers are dispatched between batches.
    func scheduleResolves() {
        var when = timeval()
        avahi_elapse_time(&when, 1, 0)
        if let resolveTimer {
            lmx_avahi_timeout_update(pollAPI, resolveTimer, &when)
        } else {
            resolveTimer = lmx_avahi_timeout_new(
                pollAPI, &when,
                { _, userdata in
                    guard let userdata else { return }
                    Unmanaged<AvahiSession>.fromOpaque(userdata).takeUnretainedValue().openQueuedResolvers()
                }, userdata)
        }
    }

    func openQueuedResolvers() {
        lmx_avahi_timeout_update(pollAPI, resolveTimer, nil)
        for key in closeSoon { dropResolver(key) }
        closeSoon.removeAll()
        let batch = queuedResolves.prefix(Self.resolveBatch)
        queuedResolves.removeFirst(batch.count)
        for queued in batch { openResolver(queued.key, queued.interface, queued.proto) }
        if !queuedResolves.isEmpty { scheduleResolves() }
    }

    func openResolver(_ key: RecordKey, _ interface: AvahiIfIndex, _ proto: AvahiProtocol) {
        guard let client else { return }
        let context = Unmanaged.passRetained(ResolverContext(key: key, session: self))
        // A sighting over IPv4 asks for the A record: with "unspecified" (avahi-browse's choice)
        // a dual-stack host's IPv4 sighting can resolve to its IPv6 address, and its IPv4
        // address is then missing. Over IPv6 any family is accepted, so IPv4-only servers (the
        // reference server publishes no AAAA) still resolve there.
        let addressProtocol = proto == AvahiProtocol(AVAHI_PROTO_INET) ? proto : AvahiProtocol(AVAHI_PROTO_UNSPEC)
        let instance = key.instance
        let handle = avahi_service_resolver_new(
            client, interface, proto, instance.name, instance.type, instance.domain, addressProtocol,
            AvahiLookupFlags(0),
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

    func dropResolver(_ key: RecordKey) {
        guard let resolver = resolvers.removeValue(forKey: key) else { return }
        avahi_service_resolver_free(resolver.handle)
        resolver.context.release()
    }

    func resolverEvent(
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

    /// Closes answered resolvers until at most `persistentResolvers` stay open.
    func closeAnsweredBeyondLimit() {
        var excess = resolvers.count - persistentResolvers
        for key in resolvers.keys where excess > 0 && answered.contains(key) {
            dropResolver(key)
            excess -= 1
        }
    }

    /// Schedules another resolve of a sighting that is still browsed: 1, 2, 4 … up to 30 s.
    func retryResolve(_ key: RecordKey) {
        guard browsed[key] != nil else { return }
        let attempts = resolveAttempts[key, default: 0] + 1
        resolveAttempts[key] = attempts
        resolveDue[key] = SystemClock.monotonic() + min(30, Double(1 << min(attempts - 1, 5)))
        armRetryTimer()
    }

    func armRetryTimer() {
        guard let next = resolveDue.values.min() else { return }
        var when = timeval()
        avahi_elapse_time(&when, UInt32(max(1, (next - SystemClock.monotonic()) * 1000)), 0)
        if let resolveRetryTimer {
            lmx_avahi_timeout_update(pollAPI, resolveRetryTimer, &when)
        } else {
            resolveRetryTimer = lmx_avahi_timeout_new(
                pollAPI, &when,
                { _, userdata in
                    guard let userdata else { return }
                    Unmanaged<AvahiSession>.fromOpaque(userdata).takeUnretainedValue().retryDueResolves()
                }, userdata)
        }
    }

    func retryDueResolves() {
        lmx_avahi_timeout_update(pollAPI, resolveRetryTimer, nil)
        let now = SystemClock.monotonic()
        for (key, due) in resolveDue where due <= now {
            resolveDue[key] = nil
            guard let queued = browsed[key], resolvers[key] == nil else { continue }
            if !queuedResolves.contains(where: { $0.key == key }) { queuedResolves.append(queued) }
        }
        scheduleResolves()
        armRetryTimer()
    }
}
