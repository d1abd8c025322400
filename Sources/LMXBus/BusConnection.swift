import CDBus
import LMXSystem

#if canImport(Glibc)
import Glibc
#endif

/// What both bus adapters do to connect: a private connection (never the process-wide shared
/// one), the library's exit-on-disconnect turned off, match rules added, and the socket to poll.
enum BusConnection {
    /// Connects to `bus` and adds `matches`.
    /// - Parameters:
    ///   - busName: for messages (`system`, `session`).
    ///   - subject: what the rules subscribe to, for messages (`PrepareForSleep`).
    static func open(
        _ bus: DBusBusType, busName: String, subject: String, matches: [String]
    ) throws(SystemError) -> (connection: OpaquePointer, descriptor: Int32) {
        var error = DBusError()
        dbus_error_init(&error)
        guard let connection = dbus_bus_get_private(bus, &error) else {
            throw SystemError("no \(busName) D-Bus: \(take(&error))", code: ENOTCONN)
        }
        // The library's default is to exit the process when the bus goes away.
        dbus_connection_set_exit_on_disconnect(connection, 0)
        for rule in matches where dbus_error_is_set(&error) == 0 {
            dbus_bus_add_match(connection, rule, &error)
        }
        var fd: Int32 = -1
        if dbus_error_is_set(&error) != 0 || dbus_connection_get_unix_fd(connection, &fd) == 0 {
            let why = dbus_error_is_set(&error) != 0 ? take(&error) : "no socket"
            close(connection)
            throw SystemError("the \(busName) D-Bus refused the subscription to \(subject): \(why)", code: EACCES)
        }
        return (connection, fd)
    }

    static func close(_ connection: OpaquePointer) {
        dbus_connection_close(connection)
        dbus_connection_unref(connection)
    }

    /// The error's message (and the error freed).
    static func take(_ error: inout DBusError) -> String {
        defer { dbus_error_free(&error) }
        guard dbus_error_is_set(&error) != 0, let message = error.message else { return "unknown error" }
        return String(cString: message)
    }
}
