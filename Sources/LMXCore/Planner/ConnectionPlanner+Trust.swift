// Trust: which routes the user and the tunnels vouch for, impostors, keys.

extension ConnectionPlanner {
    /// Recomputes what the trust policy protects: every pairing, and configured endpoints that
    /// name their instance; trusted are the instances those routes pin or have reported.
    mutating func refreshUserRoutes() {
        var owners: [String: String] = [:]
        var setUp = false
        for state in routes.values.sorted(by: { $0.id < $1.id }) where state.route.source.isSetUp {
            setUp = true
            if let pin = state.route.pinnedInstance, owners[pin] == nil { owners[pin] = state.route.name }
            if let learned = state.instanceID, owners[learned] == nil { owners[learned] = state.route.name }
        }
        instanceOwners = owners
        hasUserRoutes = setUp
    }

    /// Announced routes that newly claim a set-up server's instance: each reported once (and
    /// again only after it stopped claiming it).
    mutating func flagImpostors() -> [PlannerEvent] {
        var events: [PlannerEvent] = []
        for id in flaggedImpostors where routes[id].map({ trust(of: $0) != .impostor }) ?? true {
            flaggedImpostors.remove(id)
        }
        guard !instanceOwners.isEmpty else { return [] }
        for state in routes.values where !state.route.source.isSetUp {
            guard let instance = state.instanceID, let owner = instanceOwners[instance],
                !flaggedImpostors.contains(state.id)
            else { continue }
            flaggedImpostors.insert(state.id)
            events.append(.impostor(state, owner: owner))
        }
        return events
    }

    // MARK: - Vouching

    /// Applies what a tunnel says about its server's LAN addresses (its discovery document's
    /// `endpoints`, read over HTTPS with a verified certificate): each vouched address becomes a
    /// LAN route of the same server, with the server's own keys (`lan_keys`), pinned to the
    /// instance the tunnel reported, probed at once; addresses it no longer lists go (back to
    /// plain announcements when mDNS still announces them). Addresses the user wrote stay as
    /// they are. Only HTTPS tunnels the user set up vouch.
    /// - Parameters:
    ///   - advertised: the document's URLs as sent (`ProbeReport.advertisedBaseURLs`).
    ///   - force: rebuild the routes even when the list did not change (keys policy changed).
    public mutating func applyVouches(
        for tunnelID: String, advertised: [String], instanceID: String?, now: Double, force: Bool = false
    ) -> [PlannerEvent] {
        guard let tunnel = routes[tunnelID]?.route, tunnel.via == .wan, tunnel.source.isSetUp,
            tunnel.baseURL.hasPrefix("https://")
        else { return [] }
        let wanted = TunnelVouch.lanBaseURLs(advertised)
        let instance = tunnel.pinnedInstance ?? instanceID
        let previous = vouches[tunnelID]
        let changed =
            previous.map { TunnelVouch.lanBaseURLs($0.baseURLs) != wanted || $0.instanceID != instance } ?? true
        guard changed || force else { return [] }
        vouches[tunnelID] = (wanted, instance)
        var events: [PlannerEvent] =
            changed ? [.vouchesChanged(tunnelID: tunnelID, baseURLs: wanted, instanceID: instance)] : []
        let wantedIDs = Set(wanted.map { Route.identifier(baseURL: $0, via: .lan) })
        for state in routes.values where state.route.vouchedBy == tunnelID && !wantedIDs.contains(state.id) {
            events += unvouch(state.id, reason: "no longer listed by \(tunnel.name)'s tunnel", now: now)
        }
        for url in wanted {
            let keys =
                policy.lanKeys == .vouched || url.hasPrefix("https://") ? tunnel.credentials.serverKeys : Credentials()
            let route = Route(
                baseURL: url, via: .lan, source: tunnel.source, name: tunnel.name, pinnedInstance: instance,
                credentials: keys, addresses: [url], vouchedBy: tunnelID)
            if let existing = routes[route.id] {
                // What the user wrote stays as written; the first tunnel to vouch keeps the route.
                if existing.route.source.isSetUp, existing.route.vouchedBy != tunnelID { continue }
            }
            let isNew = routes[route.id]?.route.vouchedBy != tunnelID
            events += upsert(route, now: now)
            if isNew { probeNow(route.id, now: now) }
        }
        return events
    }

    /// A vouched route its tunnel no longer lists: back to a plain announcement if mDNS still
    /// announces it, else removed.
    mutating func unvouch(_ routeID: String, reason: String, now: Double) -> [PlannerEvent] {
        guard var state = routes[routeID], state.route.vouchedBy != nil else { return [] }
        guard state.route.announced else { return remove(routeID, reason: reason, cause: .unvouched, now: now) }
        state.route = Route(
            id: state.id, baseURL: state.route.baseURL, via: .lan, source: .mdns, name: state.route.name,
            addresses: state.route.addresses, announced: true)
        routes[routeID] = state
        refreshUserRoutes()
        return [.routeUpdated(state)] + flagImpostors() + select(now: now)
    }

    // MARK: - Trust

    /// Who vouches for a route (CONTRACT §7).
    public func trust(of state: RouteState) -> RouteTrust {
        if state.route.source.isSetUp { return state.route.vouchedBy == nil ? .user : .tunnel }
        if let instance = state.instanceID, instanceOwners[instance] != nil { return .impostor }
        return .announced
    }

    /// Whether the trust policy lets this route be active and receive requests.
    public func isAllowed(_ state: RouteState) -> Bool {
        switch trust(of: state) {
        case .user, .tunnel: return true
        case .impostor: return false
        case .announced:
            switch policy.trust {
            case .lan: return true
            case .paired: return !hasUserRoutes
            case .pinned: return false
            }
        }
    }

    /// The server requires an inference key (its discovery document says so) and this route
    /// carries none: every inference request through it is a certain 401 unless the client
    /// brings its own key.
    public func lacksRequiredKey(_ state: RouteState) -> Bool {
        state.lastReport?.inferenceKeyRequired == true && state.route.credentials.inferenceKey == nil
    }

}
