import LMXCore

/// What to browse for and how to treat the daemon.
public struct BrowseConfiguration: Sendable, Hashable {
    /// The DNS-SD service type; Opta LMX servers use `_opta-lmx._tcp`.
    public var serviceType: String
    /// The browse domain; `nil` means Avahi's default (`local`).
    public var domain: String?
    /// Restrict to one IP protocol; `nil` browses both.
    public var ipProtocol: IPProtocol?
    /// Which interfaces' results count.
    public var interfaces: InterfaceFilter
    /// Wait for avahi-daemon while it is absent and reconnect after it restarts, instead of
    /// failing with ``DiscoveryError/daemonUnreachable``.
    public var waitForDaemon: Bool
    /// Seconds between attempts to reach the system D-Bus while it is absent.
    public var busRetryInterval: Double

    public static let defaultServiceType = "_opta-lmx._tcp"

    public init(
        serviceType: String = BrowseConfiguration.defaultServiceType,
        domain: String? = nil,
        ipProtocol: IPProtocol? = nil,
        interfaces: InterfaceFilter = InterfaceFilter(),
        waitForDaemon: Bool = false,
        busRetryInterval: Double = 1
    ) {
        self.serviceType = serviceType
        self.domain = domain
        self.ipProtocol = ipProtocol
        self.interfaces = interfaces
        self.waitForDaemon = waitForDaemon
        self.busRetryInterval = busRetryInterval
    }
}

/// Failures of discovery that end a browse.
///
/// A struct wrapping a private enum, so new cases can be added without breaking anyone.
public struct DiscoveryError: Error, Hashable, Sendable, CustomStringConvertible {
    private enum Kind: Hashable, Sendable {
        case daemonUnreachable
        case daemonLost
        case browseFailed
    }

    private let kind: Kind
    /// Avahi's own words for the failure.
    public let detail: String

    private init(_ kind: Kind, _ detail: String) {
        self.kind = kind
        self.detail = detail
    }

    /// avahi-daemon (or the system D-Bus it is reached through) is not running.
    public static func daemonUnreachable(_ detail: String) -> DiscoveryError { .init(.daemonUnreachable, detail) }
    /// The connection to avahi-daemon was lost during a browse that does not wait for it.
    public static func daemonLost(_ detail: String) -> DiscoveryError { .init(.daemonLost, detail) }
    /// Avahi refused or aborted the browse (for example an invalid service type).
    public static func browseFailed(_ detail: String) -> DiscoveryError { .init(.browseFailed, detail) }

    public var isDaemonUnavailable: Bool { kind == .daemonUnreachable || kind == .daemonLost }

    public var description: String {
        switch kind {
        case .daemonUnreachable:
            "avahi-daemon is not reachable (\(detail)): start it with `systemctl start avahi-daemon` (or `avahi-daemon -D`); it needs the system D-Bus"
        case .daemonLost:
            "lost the connection to avahi-daemon (\(detail)): check that it is still running (`systemctl status avahi-daemon`)"
        case .browseFailed:
            "avahi-daemon refused the browse (\(detail))"
        }
    }
}
