import CDBus
import LMXSystem

#if canImport(Glibc)
import Glibc
#endif

/// The Desktop Notifications service (`org.freedesktop.Notifications`) on the user's session
/// bus: posts notifications (`Notify`, replacing one in place by its id) and hears which of ours
/// the person clicked (`ActionInvoked`), only from the service that answered our `Notify` and
/// only for ids it gave us. Used from one thread.
public final class DesktopNotifications {
    private let connection: OpaquePointer
    /// The bus connection's socket: poll it, then call ``drain()``.
    public let descriptor: Int32
    /// The notification server's unique name, from its answers.
    private var server: String?
    /// The ids the server gave our notifications.
    private var ours: Set<UInt32> = []

    private static let string = Int32(UInt8(ascii: "s"))
    private static let uint32 = Int32(UInt8(ascii: "u"))
    private static let int32 = Int32(UInt8(ascii: "i"))
    private static let byte = Int32(UInt8(ascii: "y"))
    private static let array = Int32(UInt8(ascii: "a"))
    private static let dictEntry = Int32(UInt8(ascii: "e"))
    private static let variant = Int32(UInt8(ascii: "v"))

    /// Connects to the session bus (`DBUS_SESSION_BUS_ADDRESS`) and listens for clicks.
    public init() throws(SystemError) {
        let (connection, fd) = try BusConnection.open(
            DBUS_BUS_SESSION, busName: "session (DBUS_SESSION_BUS_ADDRESS)", subject: "ActionInvoked",
            matches: [
                "type='signal',sender='org.freedesktop.Notifications',path='/org/freedesktop/Notifications',interface='org.freedesktop.Notifications',member='ActionInvoked'"
            ])
        self.connection = connection
        self.descriptor = fd
    }

    deinit { BusConnection.close(connection) }

    /// Posts a notification (replacing `replacing` when not 0): the id the server gave it.
    /// - Parameters:
    ///   - actions: pairs of key and label (`["default", "Open dashboard"]`).
    ///   - urgency: 0 low, 1 normal, 2 critical.
    public func notify(
        appName: String, replacing: UInt32, icon: String, summary: String, body: String, actions: [String],
        urgency: UInt8,
        category: String?, timeoutMS: Int32 = -1
    ) throws(SystemError) -> UInt32 {
        guard
            let call = dbus_message_new_method_call(
                "org.freedesktop.Notifications", "/org/freedesktop/Notifications", "org.freedesktop.Notifications",
                "Notify")
        else { throw SystemError("out of memory for a D-Bus message", code: ENOMEM) }
        defer { dbus_message_unref(call) }
        var arguments = DBusMessageIter()
        dbus_message_iter_init_append(call, &arguments)
        var ok = Self.append(&arguments, appName)
        var replaces = replacing
        ok = ok && dbus_message_iter_append_basic(&arguments, Self.uint32, &replaces) != 0
        ok = ok && Self.append(&arguments, icon) && Self.append(&arguments, summary) && Self.append(&arguments, body)
        var list = DBusMessageIter()
        ok = ok && dbus_message_iter_open_container(&arguments, Self.array, "s", &list) != 0
        for action in actions where ok { ok = Self.append(&list, action) }
        ok = ok && dbus_message_iter_close_container(&arguments, &list) != 0
        var hints = DBusMessageIter()
        ok = ok && dbus_message_iter_open_container(&arguments, Self.array, "{sv}", &hints) != 0
        var level = urgency
        ok =
            ok
            && Self.hint(&hints, "urgency", signature: "y") {
                dbus_message_iter_append_basic(&$0, Self.byte, &level) != 0
            }
        if let category {
            ok = ok && Self.hint(&hints, "category", signature: "s") { Self.append(&$0, category) }
        }
        ok = ok && dbus_message_iter_close_container(&arguments, &hints) != 0
        var timeout = timeoutMS
        ok = ok && dbus_message_iter_append_basic(&arguments, Self.int32, &timeout) != 0
        guard ok else { throw SystemError("could not build the Notify call", code: EINVAL) }

        var error = DBusError()
        dbus_error_init(&error)
        guard let reply = dbus_connection_send_with_reply_and_block(connection, call, 5000, &error) else {
            throw SystemError(
                "the notification server did not take the notification: \(BusConnection.take(&error))", code: EIO)
        }
        defer { dbus_message_unref(reply) }
        var iterator = DBusMessageIter()
        guard dbus_message_iter_init(reply, &iterator) != 0, dbus_message_iter_get_arg_type(&iterator) == Self.uint32
        else {
            throw SystemError("the notification server answered Notify without an id", code: EPROTO)
        }
        var id: UInt32 = 0
        dbus_message_iter_get_basic(&iterator, &id)
        server = dbus_message_get_sender(reply).map { String(cString: $0) }
        if ours.count > 4096 { ours.removeAll() }
        ours.insert(id)
        return id
    }

    /// Reads what arrived (never blocks).
    /// - Returns: the action keys clicked on our notifications, by id, and whether the bus is
    ///   still there (it goes with the session).
    public func drain() -> (actions: [(id: UInt32, key: String)], connected: Bool) {
        guard dbus_connection_read_write(connection, 0) != 0 else { return ([], false) }
        var actions: [(UInt32, String)] = []
        while let message = dbus_connection_pop_message(connection) {
            defer { dbus_message_unref(message) }
            guard dbus_message_is_signal(message, "org.freedesktop.Notifications", "ActionInvoked") != 0 else {
                continue
            }
            let sender = dbus_message_get_sender(message).map { String(cString: $0) }
            guard let sender, sender == server else { continue }
            var iterator = DBusMessageIter()
            guard dbus_message_iter_init(message, &iterator) != 0,
                dbus_message_iter_get_arg_type(&iterator) == Self.uint32
            else { continue }
            var id: UInt32 = 0
            dbus_message_iter_get_basic(&iterator, &id)
            guard ours.contains(id), dbus_message_iter_next(&iterator) != 0,
                dbus_message_iter_get_arg_type(&iterator) == Self.string
            else { continue }
            var key: UnsafePointer<CChar>?
            dbus_message_iter_get_basic(&iterator, &key)
            actions.append((id, key.map { String(cString: $0) } ?? ""))
        }
        return (actions, dbus_connection_get_is_connected(connection) != 0)
    }

    private static func append(_ iterator: inout DBusMessageIter, _ text: String) -> Bool {
        text.withCString { pointer -> Bool in
            var value: UnsafePointer<CChar>? = pointer
            return dbus_message_iter_append_basic(&iterator, string, &value) != 0
        }
    }

    /// One `{sv}` entry of the hints.
    private static func hint(
        _ hints: inout DBusMessageIter, _ key: String, signature: String, _ value: (inout DBusMessageIter) -> Bool
    ) -> Bool {
        var entry = DBusMessageIter()
        guard dbus_message_iter_open_container(&hints, dictEntry, nil, &entry) != 0 else { return false }
        var ok = append(&entry, key)
        var inner = DBusMessageIter()
        ok = ok && dbus_message_iter_open_container(&entry, variant, signature, &inner) != 0
        ok = ok && value(&inner)
        ok = ok && dbus_message_iter_close_container(&entry, &inner) != 0
        return dbus_message_iter_close_container(&hints, &entry) != 0 && ok
    }
}
