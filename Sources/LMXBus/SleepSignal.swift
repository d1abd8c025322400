import CDBus
import LMXSystem

#if canImport(Glibc)
import Glibc
#endif

/// logind's `PrepareForSleep` signal on the system bus: `true` before the machine sleeps,
/// `false` once it has woken. Heard only as logind sends it: a broadcast (no destination), on
/// `/org/freedesktop/login1`, from the connection that owns `org.freedesktop.login1` now (asked at
/// start, then followed through the bus's `NameOwnerChanged`; on a real system bus only root may
/// own that name). A signal of that name sent by anyone else, or sent to the agent directly
/// (unicast, which no match rule filters), is not heard. Used from one thread.
public final class SleepSignal {
    private let connection: OpaquePointer
    /// The unique name of `org.freedesktop.login1`'s owner; nil while nobody owns it.
    public private(set) var login1Owner: String?
    /// Signals of that name that were not logind's, so far (for the log).
    public private(set) var refused = 0
    /// The bus connection's socket: poll it, then call ``drain()``.
    public let descriptor: Int32

    /// Connects to the system bus (`DBUS_SYSTEM_BUS_ADDRESS`, else the standard socket) and
    /// subscribes.
    /// - Throws: when there is no system bus, or it refuses the subscription.
    public init() throws(SystemError) {
        let (connection, fd) = try BusConnection.open(
            DBUS_BUS_SYSTEM, busName: "system", subject: "PrepareForSleep",
            matches: [
                "type='signal',sender='org.freedesktop.login1',path='/org/freedesktop/login1',interface='org.freedesktop.login1.Manager',member='PrepareForSleep'",
                "type='signal',sender='org.freedesktop.DBus',path='/org/freedesktop/DBus',interface='org.freedesktop.DBus',member='NameOwnerChanged',arg0='org.freedesktop.login1'",
            ])
        self.connection = connection
        self.descriptor = fd
        login1Owner = Self.nameOwner(connection, "org.freedesktop.login1")
    }

    /// The unique name owning `name` now (`org.freedesktop.DBus.GetNameOwner`), or nil.
    private static func nameOwner(_ connection: OpaquePointer, _ name: String) -> String? {
        guard
            let call = dbus_message_new_method_call(
                "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetNameOwner")
        else { return nil }
        defer { dbus_message_unref(call) }
        var iterator = DBusMessageIter()
        dbus_message_iter_init_append(call, &iterator)
        let appended = name.withCString { text -> Bool in
            var pointer: UnsafePointer<CChar>? = text
            return dbus_message_iter_append_basic(&iterator, Int32(UInt8(ascii: "s")), &pointer) != 0
        }
        guard appended else { return nil }
        var error = DBusError()
        dbus_error_init(&error)
        guard let reply = dbus_connection_send_with_reply_and_block(connection, call, 2000, &error) else {
            dbus_error_free(&error)  // org.freedesktop.DBus.Error.NameHasNoOwner: nobody yet
            return nil
        }
        defer { dbus_message_unref(reply) }
        return Self.strings(reply).first
    }

    /// The leading string arguments of a message.
    private static func strings(_ message: OpaquePointer) -> [String] {
        var iterator = DBusMessageIter()
        var out: [String] = []
        guard dbus_message_iter_init(message, &iterator) != 0 else { return out }
        while dbus_message_iter_get_arg_type(&iterator) == Int32(UInt8(ascii: "s")), out.count < 8 {
            var value: UnsafePointer<CChar>?
            dbus_message_iter_get_basic(&iterator, &value)
            out.append(value.map { String(cString: $0) } ?? "")
            if dbus_message_iter_next(&iterator) == 0 { break }
        }
        return out
    }

    deinit { BusConnection.close(connection) }

    /// Reads what arrived (never blocks).
    /// - Returns: the `PrepareForSleep` values received, in order, and whether the bus is gone.
    public func drain() -> (signals: [Bool], connected: Bool) {
        guard dbus_connection_read_write(connection, 0) != 0 else { return ([], false) }
        var signals: [Bool] = []
        while let message = dbus_connection_pop_message(connection) {
            defer { dbus_message_unref(message) }
            let sender = dbus_message_get_sender(message).map { String(cString: $0) }
            if dbus_message_is_signal(message, "org.freedesktop.DBus", "NameOwnerChanged") != 0 {
                // Only the bus itself says who owns a name.
                guard sender == "org.freedesktop.DBus", dbus_message_get_destination(message) == nil else { continue }
                let names = Self.strings(message)
                if names.count == 3, names[0] == "org.freedesktop.login1" {
                    login1Owner = names[2].isEmpty ? nil : names[2]
                }
                continue
            }
            guard dbus_message_is_signal(message, "org.freedesktop.login1.Manager", "PrepareForSleep") != 0 else {
                continue
            }
            let path = dbus_message_get_path(message).map { String(cString: $0) }
            guard dbus_message_get_destination(message) == nil, path == "/org/freedesktop/login1",
                let sender, sender == login1Owner
            else {
                refused += 1
                continue
            }
            var iterator = DBusMessageIter()
            let boolean = Int32(UInt8(ascii: "b"))  // DBUS_TYPE_BOOLEAN
            guard dbus_message_iter_init(message, &iterator) != 0,
                dbus_message_iter_get_arg_type(&iterator) == boolean
            else { continue }
            var value: dbus_bool_t = 0
            dbus_message_iter_get_basic(&iterator, &value)
            signals.append(value != 0)
        }
        return (signals, dbus_connection_get_is_connected(connection) != 0)
    }
}
