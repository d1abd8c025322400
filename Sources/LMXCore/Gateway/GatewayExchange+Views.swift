// What the exchange's state says (``GatewayExchange/State``), read by the handler and the tests:
// views of it, never stored beside it.
extension GatewayExchange {
    public var phase: Phase {
        switch state {
        case .collecting: .collecting
        case .waiting: .waiting
        case .connecting: .connecting
        case .forwarding: .forwarding
        case .answering: .answering
        case .answered: .answered
        case .refusing: .refusing
        case .finished: .finished
        }
    }
    public var clientEnded: Bool { body == .whole || body == .sent }
    /// The body went on as it came: the request can never be sent again.
    public var bodyPassedOn: Bool { body == .passing || body == .sent }
    /// The gateway holds the whole body (all of it came, none passed on): it can go again.
    public var bodyWhole: Bool { body == .whole }
    /// The stream is being opened again: the client already has the answer's head.
    public var resuming: Bool {
        switch state {
        case .waiting(let resuming), .connecting(let resuming), .forwarding(let resuming, _): resuming
        default: false
        }
    }
    /// The connection in hand was kept from an earlier answer (it may have been closing).
    public var onKeptConnection: Bool {
        if case .forwarding(_, let kept) = state { kept } else { false }
    }
    /// The answer is held until the client's body has come.
    public var holdsAnswer: Bool {
        if case .answering(.server(_, held: true)) = state { true } else { false }
    }
    /// The answer is an event stream.
    public var isStream: Bool {
        if case .answering(.server(stream: true, _)) = state { true } else { false }
    }
    /// The refusal that answers once the body has been read (``Phase/refusing``).
    public var refusal: Refusal? {
        if case .refusing(let refusal, _) = state { refusal } else { nil }
    }
    /// The gateway's own answer going out closes the connection after it.
    public var answerCloses: Bool {
        if case .answering(.gateway(closing: true)) = state { true } else { false }
    }
}
