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

    /// The peer's user id, as the kernel says (see `Channel.peerUID()`).
    public func peerUID() async -> UInt32? {
        (try? await channel.peerUID().get()) ?? nil
    }
}

extension Channel {
    /// The peer's credentials as the kernel recorded them (`SO_PEERCRED`); nil off Unix sockets.
    func peerCredentialsFuture() -> EventLoopFuture<PeerCredentials>? {
        guard let provider = self as? any SocketOptionProvider else { return nil }
        return provider.unsafeGetSocketOption(
            level: NIOBSDSocket.OptionLevel(rawValue: PeerCredentials.optionLevel),
            name: NIOBSDSocket.Option(rawValue: PeerCredentials.optionName))
    }
}
