import LMXCore

/// What one browse of one unicast DNS domain found.
public struct DomainBrowse: Sendable, Hashable {
    public var domain: String
    /// One record per instance and IP protocol, resolved (SRV, TXT, then the target's address).
    public var records: [ResolvedRecord]
    /// Why the domain listed no instance at all (`nil` when the PTR question was answered).
    public var failure: DNSFailure?
    /// Instances listed whose SRV or address could not be read, with why.
    public var unresolved: [String: String]
    /// The smallest TTL of the records read: when to ask again.
    public var ttl: UInt32
}

/// DNS-based service discovery over unicast DNS (RFC 6763): the site's own DNS server lists
/// `_opta-lmx._tcp` instances in a domain, which reaches across subnets where mDNS does not.
/// Queries go to the name servers of /etc/resolv.conf (through `UnicastDNS`).
public enum WideAreaBrowser {
    /// The browse domains the network announces under its search domains (RFC 6763 §11:
    /// `b._dns-sd._udp` and `lb._dns-sd._udp`), each once, in the order found.
    public static func announcedDomains(searchDomains: [String]) async -> [String] {
        await announcedDomainsIfAnswered(searchDomains: searchDomains) ?? []
    }

    /// As ``announcedDomains(searchDomains:)``, but `nil` when no DNS server answered any of the
    /// questions (nothing is known, as opposed to nothing announced).
    static func announcedDomainsIfAnswered(searchDomains: [String]) async -> [String]? {
        let names = searchDomains.filter { !$0.isEmpty }.flatMap { ["b._dns-sd._udp.\($0)", "lb._dns-sd._udp.\($0)"] }
        if names.isEmpty { return [] }
        let answers = await withTaskGroup(of: (Int, [String]?).self) { group in
            for (index, name) in names.enumerated() {
                group.addTask {
                    switch await UnicastDNS.query(name, type: UnicastDNS.typePTR) {
                    case .failure(.noAnswer), .failure(.noConfiguration):
                        return (index, nil)
                    case .failure:
                        return (index, [])
                    case .success(let records):
                        return (
                            index,
                            records.compactMap {
                                guard $0.owner == name.lowercased(), case .pointer(let target) = $0.data else {
                                    return nil
                                }
                                return target.plainText
                            }
                        )
                    }
                }
            }
            var all: [(Int, [String]?)] = []
            for await answer in group { all.append(answer) }
            return all.sorted { $0.0 < $1.0 }.map(\.1)
        }
        return announced(answers)
    }

    /// Browse domains taken from the network's announcements at most. RFC 6763 §11 expects a
    /// handful; a DNS server (any network's, handed out with its search domain) that lists
    /// hundreds would otherwise have each browsed, and up to 64 instances resolved in each, every
    /// refresh. The same bound as the configured `browse_domains`.
    public static let maxAnnouncedDomains = 16

    /// The announced domains from the answers to each question (`nil`: not answered), each once
    /// in the order found, at most ``maxAnnouncedDomains``; `nil` when no question was answered.
    static func announced(_ answers: [[String]?]) -> [String]? {
        if answers.allSatisfy({ $0 == nil }) { return nil }
        var seen = Set<String>()
        var domains: [String] = []
        for domain in answers.compactMap({ $0 }).joined() where domains.count < maxAnnouncedDomains {
            if !domain.isEmpty && seen.insert(domain.lowercased()).inserted { domains.append(domain) }
        }
        return domains
    }

    /// Lists and resolves every instance of `type` in `domain`.
    public static func browse(domain: String, type: String = BrowseConfiguration.defaultServiceType) async
        -> DomainBrowse
    {
        let listName = "\(type).\(domain)"
        var result = DomainBrowse(domain: domain, records: [], failure: nil, unresolved: [:], ttl: 3600)
        let listed: [DNSRecord]
        switch await UnicastDNS.query(listName, type: UnicastDNS.typePTR) {
        case .success(let records): listed = records
        case .failure(let failure):
            result.failure = failure
            return result
        }
        let instances = listed.compactMap { record -> DNSName? in
            guard record.owner == listName.lowercased(), case .pointer(let target) = record.data else { return nil }
            result.ttl = min(result.ttl, record.ttl)
            return target
        }
        if instances.isEmpty { result.failure = .noData }
        let resolved = await withTaskGroup(of: ([ResolvedRecord], String?, DNSName, UInt32).self) { group in
            for instance in instances.prefix(64) {
                group.addTask { await resolve(instance, type: type, domain: domain) }
            }
            var all: [([ResolvedRecord], String?, DNSName, UInt32)] = []
            for await item in group { all.append(item) }
            return all
        }
        for (records, problem, instance, ttl) in resolved {
            result.records += records
            result.ttl = min(result.ttl, ttl)
            if let problem { result.unresolved[instance.firstLabel] = problem }
        }
        result.records.sort { $0.key < $1.key }
        return result
    }

    /// SRV and TXT of one instance, then the target's IPv4 and IPv6 addresses.
    private static func resolve(_ instance: DNSName, type: String, domain: String) async -> (
        [ResolvedRecord], String?, DNSName, UInt32
    ) {
        async let serviceAnswer = UnicastDNS.query(instance.text, type: UnicastDNS.typeSRV)
        async let textAnswer = UnicastDNS.query(instance.text, type: UnicastDNS.typeTXT)
        let owner = instance.text.lowercased()
        guard case .success(let serviceRecords) = await serviceAnswer,
            let service = serviceRecords.first(where: { $0.owner == owner && isService($0.data) }),
            case .service(_, _, let port, let target) = service.data
        else {
            _ = await textAnswer
            return ([], "no SRV record", instance, 3600)
        }
        var ttl = service.ttl
        var txt = TXTRecord()
        if case .success(let texts) = await textAnswer,
            let text = texts.first(where: { $0.owner == owner }), case .text(let entries) = text.data
        {
            txt = TXTRecord(entries: entries)
            ttl = min(ttl, text.ttl)
        }
        // Addresses may come along in the SRV answer's additional section; otherwise ask.
        let targetOwner = target.text.lowercased()
        func addresses(_ records: [DNSRecord], v6: Bool) -> [(String, UInt32)] {
            records.compactMap {
                guard $0.owner == targetOwner, case .address(let address) = $0.data, address.contains(":") == v6 else {
                    return nil
                }
                return (address, $0.ttl)
            }
        }
        var v4 = addresses(serviceRecords, v6: false)
        var v6 = addresses(serviceRecords, v6: true)
        if v4.isEmpty && v6.isEmpty {
            async let a = UnicastDNS.query(target.text, type: UnicastDNS.typeA)
            async let aaaa = UnicastDNS.query(target.text, type: UnicastDNS.typeAAAA)
            if case .success(let records) = await a { v4 = addresses(records, v6: false) }
            if case .success(let records) = await aaaa { v6 = addresses(records, v6: true) }
        }
        let id = ServiceInstanceID(name: instance.firstLabel, type: type, domain: domain)
        var records: [ResolvedRecord] = []
        for (found, proto) in [(v4.first, IPProtocol.ipv4), (v6.first, IPProtocol.ipv6)] {
            guard let pair = found else { continue }
            let (address, addressTTL) = pair
            ttl = min(ttl, addressTTL)
            records.append(
                ResolvedRecord(
                    key: RecordKey(instance: id, interface: .unicastDNS, ipProtocol: proto),
                    hostName: target.plainText, address: address, port: port, txt: txt))
        }
        return (records, records.isEmpty ? "no address for \(target.plainText)" : nil, instance, ttl)
    }

    private static func isService(_ data: DNSRecordData) -> Bool {
        if case .service = data { return true }
        return false
    }

    /// Follows the servers of unicast DNS domains: `domains` and, when `announced` is set, those
    /// the network names under its search domains. Yields the same events as an mDNS browse (a
    /// record that changed is resolved again, one that went is lost), asking again when the
    /// records' TTL runs out, within `refresh`. Ends when the consumer stops iterating.
    public static func events(
        domains: [String], announced: Bool, type: String = BrowseConfiguration.defaultServiceType,
        refresh: ClosedRange<Double> = 5...300
    ) -> AsyncStream<BrowseEvent> {
        AsyncStream(bufferingPolicy: .unbounded) { continuation in
            let task = Task {
                var known: [RecordKey: ResolvedRecord] = [:]
                /// The last answer per domain: a domain whose DNS server does not answer this
                /// time keeps what it listed (a server restarting is not every server gone).
                var lastByDomain: [String: [ResolvedRecord]] = [:]
                var lastAnnounced: [String] = []
                var first = true
                while !Task.isCancelled {
                    var all = domains
                    if announced {
                        let search = UnicastDNS.configuration().searchDomains
                        if let found = await announcedDomainsIfAnswered(searchDomains: search) { lastAnnounced = found }
                        all += lastAnnounced
                    }
                    var seenDomains = Set<String>()
                    all = all.filter { seenDomains.insert($0.lowercased()).inserted }
                    let browses = await withTaskGroup(of: DomainBrowse.self) { group in
                        for domain in all { group.addTask { await browse(domain: domain, type: type) } }
                        var results: [DomainBrowse] = []
                        for await result in group { results.append(result) }
                        return results
                    }
                    var byDomain: [String: [ResolvedRecord]] = [:]
                    for browse in browses {
                        let key = browse.domain.lowercased()
                        byDomain[key] = browse.failure == .noAnswer ? lastByDomain[key] ?? [] : browse.records
                    }
                    lastByDomain = byDomain
                    var now: [RecordKey: ResolvedRecord] = [:]
                    for records in byDomain.values { for record in records { now[record.key] = record } }
                    for (key, record) in now.sorted(by: { $0.key < $1.key }) where known[key] != record {
                        if known[key] == nil { continuation.yield(.found(key)) }
                        continuation.yield(.resolved(record))
                    }
                    for key in known.keys.sorted() where now[key] == nil { continuation.yield(.lost(key)) }
                    known = now
                    if first {
                        continuation.yield(.allForNow)
                        first = false
                    }
                    let ttl = Double(browses.map(\.ttl).min() ?? UInt32(refresh.upperBound))
                    try? await Task.sleep(for: .seconds(min(max(ttl, refresh.lowerBound), refresh.upperBound)))
                }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }
}
