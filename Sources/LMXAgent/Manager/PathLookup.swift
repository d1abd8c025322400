import LMXSystem

/// This machine's network as read at one moment: the usable interfaces and their addresses (what
/// a change is compared by) and what path look-ups need.
public struct MachineNetwork: Sendable {
    /// `name address/mask` of every interface that is up with a carrier (loopback aside).
    public var usable: Set<String>
    let interfaces: RouteLookup.Interfaces

    public init(usable: Set<String>, interfaces: RouteLookup.Interfaces = .init()) {
        self.usable = usable
        self.interfaces = interfaces
    }
}

/// What changed on this machine's network: the state before and after a burst of kernel
/// messages (as tailscale's netmon hands its listeners a delta).
public struct NetworkChange: Sendable {
    public var old: MachineNetwork
    public var new: MachineNetwork
    /// A link or an address came up: worth asking mDNS again.
    public var linkOrAddressUp: Bool

    public init(old: MachineNetwork, new: MachineNetwork, linkOrAddressUp: Bool) {
        self.old = old
        self.new = new
        self.linkOrAddressUp = linkOrAddressUp
    }

    /// The usable addresses differ.
    public var addressesChanged: Bool { old.usable != new.usable }
}

/// Where the manager learns how this machine reaches a LAN address: the kernel's interfaces and
/// routing table (``KernelPaths``), or a table in tests.
public protocol PathLookup: Sendable {
    /// Reads this machine's network now.
    func network() -> MachineNetwork
    /// The path a connection to `host` (an IP literal, `%zone` allowed) would take in `network`.
    func path(to host: String, in network: MachineNetwork) -> Result<LocalPath, SystemError>
}

/// Path look-ups by the kernel: `getifaddrs` and a route chosen for a UDP socket (no packet sent).
public struct KernelPaths: PathLookup {
    public init() {}

    public func network() -> MachineNetwork {
        let interfaces = RouteLookup.interfaces()
        return MachineNetwork(usable: interfaces.usable, interfaces: interfaces)
    }

    public func path(to host: String, in network: MachineNetwork) -> Result<LocalPath, SystemError> {
        RouteLookup.path(to: host, in: network.interfaces)
    }
}
