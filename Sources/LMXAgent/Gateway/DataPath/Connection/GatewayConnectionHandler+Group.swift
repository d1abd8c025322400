import LMXSystem
import NIOCore

extension GatewayConnectionHandler {
    /// `gateway.group` and a user the gate has no fresh answer for: where the lookup stands.
    enum GroupLookup {
        case none
        /// Asked of the account database (which may wait on a directory service), off the event
        /// loop (``GatewayDataPath/LoopState/groupLookup``): the connection's requests wait,
        /// reads held.
        case pending
        /// The answer, for the request that waited on it (nil: the group is gone).
        case answered(uid: UInt32, member: Bool?)
    }

    /// The request whose head is `head` waits, with the parts read after it, while the gate asks
    /// whether `uid` is a member; then it is taken with the answer.
    func lookUpGroup(_ head: ClientRequestParser.Part, uid: UInt32, gate: GroupMembership) {
        guard let context else { return }
        var parts = queued.take() ?? []
        parts.prepend(head)
        queued = parts
        groupLookup = .pending
        state.groupLookup(gate, uid)
            .hop(to: context.eventLoop)
            .assumeIsolated()
            .whenComplete { [self] result in
                let member = (try? result.get()) ?? nil
                if member == nil {
                    gateway.logger.warning(
                        "gateway.group: no group named \(gate.group) any more; only root and the agent's user are served"
                    )
                }
                groupLookup = .answered(uid: uid, member: member)
                guard self.context != nil else { return }
                drainQueue()
                closeIfDone()
            }
    }

    /// Whether `uid` may use the gateway: the answer just looked up for it, or the gate's own;
    /// nil when it must be looked up.
    func groupMember(_ uid: UInt32, _ gate: GroupMembership) -> Bool? {
        if case .answered(let answered, let member) = groupLookup, answered == uid {
            groupLookup = .none
            return member ?? false
        }
        return gate.knownAnswer(uid)
    }

    var waitsForGroup: Bool {
        if case .pending = groupLookup { return true }
        return false
    }
}
