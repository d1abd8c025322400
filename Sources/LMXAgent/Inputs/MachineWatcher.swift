import LMXBus
import LMXCore
import LMXDiscovery
import LMXProbe
import LMXSystem
import Logging
import ServiceLifecycle

/// Follows this machine across networks and sleep (anchor: tailscale's `net/netmon`):
/// - the kernel's link, address and route changes (rtnetlink): after a burst settles, the paths
///   to LAN routes are looked up again (the manager and planner decide), pooled connections are
///   dropped (they may be bound to an address that is gone), and avahi-daemon is asked again
///   when a link or an address came up;
/// - logind's `PrepareForSleep(false)` on the system bus, and where logind is absent a jump
///   between `CLOCK_BOOTTIME` and `CLOCK_MONOTONIC`: a wake, after which every verdict is stale.
/// One ``PollingThread`` blocks in `poll` on both sockets (waking once a second for the clocks,
/// at once for the stop) and hands what it saw to the async side.
public struct MachineWatcher: Service {
    let manager: ConnectionManager
    let prober: Prober
    let gateway: Gateway?
    let requery: AvahiRequery?
    let logger: Logger
    /// How long a burst of network messages may go on before the agent looks, seconds.
    static let settle = 0.03

    enum Seen: Sendable {
        case network(NetworkChange)
        case woke(String)
    }

    public init(manager: ConnectionManager, prober: Prober, gateway: Gateway?, requery: AvahiRequery?, logger: Logger) {
        self.manager = manager
        self.prober = prober
        self.gateway = gateway
        self.requery = requery
        self.logger = logger
    }

    public func run() async throws {
        var monitor: NetworkMonitor?
        do {
            monitor = try NetworkMonitor()
        } catch {
            logger.warning(
                "network changes are not followed (\(error)): a move between networks is noticed by probes only")
        }
        let box = UncheckedBox(monitor)
        let logger = logger
        let paths = manager.paths
        let seen: AsyncStream<Seen>
        let thread: PollingThread
        do {
            (seen, thread) = try PollingThread.start(label: "lmx.machine-watch") { poller, send in
                Self.watch(box.value, paths: paths, poller: poller, logger: logger, send: send)
            }
        } catch {
            logger.warning("network changes and wakes are not followed (\(error)): they are noticed by probes only")
            return
        }
        await withGracefulShutdownHandler {
            for await event in seen {
                switch event {
                case .woke(let how):
                    await manager.woke(how)
                case .network(let change):
                    let relevant = await manager.networkChanged(change) { [prober, gateway] in
                        prober.dropConnections()
                        gateway?.dropConnections()
                    }
                    if relevant, change.linkOrAddressUp { requery?.now() }
                }
            }
        } onGracefulShutdown: {
            thread.stop()
        }
    }

    /// The least time between two wakes heard.
    static let minimumWakeGap = 2.0

    /// The thread: polls netlink and the system bus, checks the clocks, until it is stopped.
    static func watch(
        _ monitor: NetworkMonitor?, paths: any PathLookup, poller: PollingThread, logger: Logger, send: (Seen) -> Void
    ) {
        // The network as last read: each change is handed over as the state before and after.
        var network = paths.network()
        var bus: SleepSignal?
        var busFresh = false
        var nextBusAttempt = 0.0
        var detector = SuspendDetector()
        var loggedNoBus = false
        var lastWake = (logind: -Double.infinity, clocks: -Double.infinity)
        var refusedSignals = 0
        // logind and the clocks both tell of the same sleep: the second to tell is not heard.
        // Wakes are also rate-limited: a machine does not wake twice within `minimumWakeGap`,
        // so a flood (even of real signals) cannot keep every route stale.
        func wake(_ how: String, fromLogind: Bool) {
            let now = SystemClock.monotonic()
            let other = fromLogind ? lastWake.clocks : lastWake.logind
            let same = fromLogind ? lastWake.logind : lastWake.clocks
            if now - other >= 10, now - same >= minimumWakeGap { send(.woke(how)) }
            if fromLogind { lastWake.logind = now } else { lastWake.clocks = now }
        }
        while !poller.isStopped {
            let now = SystemClock.monotonic()
            if bus == nil, now >= nextBusAttempt {
                do {
                    bus = try SleepSignal()
                    // Read once whatever it is: messages libdbus took in while connecting wait
                    // in its queue, not on the descriptor.
                    busFresh = true
                } catch {
                    if !loggedNoBus {
                        logger.notice(
                            "logind's sleep signal is not followed (\(error)): a wake is noticed from the clocks instead"
                        )
                        loggedNoBus = true
                    }
                    nextBusAttempt = now + 30
                }
            }
            let fds = [monitor?.descriptor, bus?.descriptor].compactMap { $0 }
            // Each second the clocks are compared (a sleep without logind's word); a descriptor
            // is read only when it has something (each read costs syscalls and a 32 KiB buffer).
            let ready: Set<Int32>
            switch poller.wait(for: fds, milliseconds: 1000) {
            case .stopped: return
            case .timedOut: ready = []
            case .readable(let which): ready = which
            }
            if let monitor, ready.contains(monitor.descriptor) {
                var change = monitor.drain()
                if change.any {
                    // Let the burst settle (an address moving is a handful of messages): one
                    // look at the end of it.
                    SystemClock.sleep(seconds: settle)
                    let more = monitor.drain()
                    change.linkOrAddressUp = change.linkOrAddressUp || more.linkOrAddressUp
                    let now = paths.network()
                    send(.network(NetworkChange(old: network, new: now, linkOrAddressUp: change.linkOrAddressUp)))
                    network = now
                }
            }
            if let current = bus, busFresh || ready.contains(current.descriptor) {
                busFresh = false
                let (signals, connected) = current.drain()
                if signals.contains(false) { wake("logind: PrepareForSleep(false)", fromLogind: true) }
                // At 1, 2, 4, 8… refusals: a flood logs a few lines.
                if current.refused > refusedSignals, current.refused >= 2 * refusedSignals {
                    logger.warning(
                        "a PrepareForSleep signal not sent by logind was ignored",
                        metadata: ["refused": "\(current.refused)", "login1_owner": "\(current.login1Owner ?? "none")"])
                    refusedSignals = current.refused
                }
                if !connected {
                    logger.notice("the system D-Bus went away: following logind's sleep signal again once it is back")
                    bus = nil
                    nextBusAttempt = SystemClock.monotonic() + 5
                }
            }
            if let slept = detector.check() { wake("the clocks: about \(Int(slept)) s asleep", fromLogind: false) }
        }
    }
}
