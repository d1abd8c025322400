import Hummingbird
import HummingbirdCore
import LMXSystem
import NIOCore

/// Request context that keeps the connection, so handlers can ask the kernel who the peer is.
public struct AgentRequestContext: RequestContext {
    public var coreContext: CoreRequestContextStorage
    let channel: any Channel

    public init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        channel = source.channel
    }

    /// The peer's user id from `SO_PEERCRED` (Unix sockets only).
    public func peerUID() async -> UInt32? {
        await channel.peerCredentials()?.uid
    }
}

extension Channel {
    /// The peer's credentials as the kernel recorded them (`SO_PEERCRED`); nil off Unix sockets.
    func peerCredentials() async -> PeerCredentials? {
        try? await peerCredentialsFuture()?.get()
    }

    func peerCredentialsFuture() -> EventLoopFuture<PeerCredentials>? {
        guard let provider = self as? any SocketOptionProvider else { return nil }
        return provider.unsafeGetSocketOption(
            level: NIOBSDSocket.OptionLevel(rawValue: PeerCredentials.optionLevel),
            name: NIOBSDSocket.Option(rawValue: PeerCredentials.optionName))
    }
}
