import CDBus
import LMXSystem

#if canImport(Glibc)
import Glibc
#endif

/// logind's `PrepareForSleep` signal on the system bus: `true` before the machine sleeps,
/// `false` once it has woken. Only the owner of `org.freedesktop.login1` can send it (the bus
/// checks the sender; on a real system bus only root may own that name). Used from one thread.
public final class SleepSignal {
    private let connection: OpaquePointer
    /// The bus connection's socket: poll it, then call ``drain()``.
    public let descriptor: Int32

    /// Connects to the system bus (`DBUS_SYSTEM_BUS_ADDRESS`, else the standard socket) and
    /// subscribes.
    /// - Throws: when there is no system bus, or it refuses the subscription.
    public init() throws(SystemError) {
        var error = DBusError()
        dbus_error_init(&error)
        guard let connection = dbus_bus_get_private(DBUS_BUS_SYSTEM, &error) else {
            throw SystemError("no system D-Bus: \(Self.take(&error))", code: ENOTCONN)
        }
        // The library's default is to exit the process when the bus goes away.
        dbus_connection_set_exit_on_disconnect(connection, 0)
        dbus_bus_add_match(
            connection,
            "type='signal',sender='org.freedesktop.login1',path='/org/freedesktop/login1',interface='org.freedesktop.login1.Manager',member='PrepareForSleep'",
            &error)
        var fd: Int32 = -1
        if dbus_error_is_set(&error) != 0 || dbus_connection_get_unix_fd(connection, &fd) == 0 {
            let why = dbus_error_is_set(&error) != 0 ? Self.take(&error) : "no socket"
            dbus_connection_close(connection)
            dbus_connection_unref(connection)
            throw SystemError("the system D-Bus refused the subscription to PrepareForSleep: \(why)", code: EACCES)
        }
        self.connection = connection
        self.descriptor = fd
    }

    deinit {
        dbus_connection_close(connection)
        dbus_connection_unref(connection)
    }

    /// Reads what arrived (never blocks).
    /// - Returns: the `PrepareForSleep` values received, in order, and whether the bus is gone.
    public func drain() -> (signals: [Bool], connected: Bool) {
        guard dbus_connection_read_write(connection, 0) != 0 else { return ([], false) }
        var signals: [Bool] = []
        while let message = dbus_connection_pop_message(connection) {
            defer { dbus_message_unref(message) }
            guard dbus_message_is_signal(message, "org.freedesktop.login1.Manager", "PrepareForSleep") != 0 else { continue }
            var iterator = DBusMessageIter()
            let boolean = Int32(UInt8(ascii: "b"))  // DBUS_TYPE_BOOLEAN
            guard dbus_message_iter_init(message, &iterator) != 0,
                  dbus_message_iter_get_arg_type(&iterator) == boolean else { continue }
            var value: dbus_bool_t = 0
            dbus_message_iter_get_basic(&iterator, &value)
            signals.append(value != 0)
        }
        return (signals, dbus_connection_get_is_connected(connection) != 0)
    }

    private static func take(_ error: inout DBusError) -> String {
        defer { dbus_error_free(&error) }
        guard dbus_error_is_set(&error) != 0, let message = error.message else { return "unknown error" }
        return String(cString: message)
    }
}
