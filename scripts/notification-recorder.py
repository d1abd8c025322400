#!/usr/bin/python3
"""A notification server for tests: owns org.freedesktop.Notifications on a session bus, answers
Notify as a desktop's notification daemon does (new ids, or the id it replaces), and records each
call as one JSON line on stdout:

  {"call": "Notify", "id": 1, "replaces_id": 0, "app_name": "...", "summary": "...", "body": "...",
   "actions": [...], "urgency": 1, "category": "...", "expire_timeout": -1, "sender": ":1.4"}

Reads commands on stdin, one per line:
  click ID [KEY]   emit ActionInvoked(ID, KEY) as a click on the notification does (KEY: default)
  quit

Usage: notification-recorder.py --bus ADDRESS
Prints "ready" once it owns the name. Needs Debian's python3-dbus and python3-gi (run with
/usr/bin/python3).
"""
import argparse
import json
import sys
import threading

import dbus
import dbus.mainloop.glib
import dbus.service
from gi.repository import GLib

NAME = "org.freedesktop.Notifications"
PATH = "/org/freedesktop/Notifications"


def say(record):
    sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
    sys.stdout.flush()


class Server(dbus.service.Object):
    def __init__(self, bus):
        super().__init__(bus, PATH)
        self.next_id = 0

    @dbus.service.method(NAME, in_signature="susssasa{sv}i", out_signature="u", sender_keyword="sender")
    def Notify(self, app_name, replaces_id, app_icon, summary, body, actions, hints, expire_timeout, sender=None):
        if replaces_id:
            nid = int(replaces_id)
        else:
            self.next_id += 1
            nid = self.next_id
        say({
            "call": "Notify", "id": nid, "replaces_id": int(replaces_id), "app_name": str(app_name),
            "app_icon": str(app_icon), "summary": str(summary), "body": str(body),
            "actions": [str(a) for a in actions],
            "urgency": int(hints["urgency"]) if "urgency" in hints else None,
            "category": str(hints["category"]) if "category" in hints else None,
            "expire_timeout": int(expire_timeout), "sender": str(sender),
        })
        return dbus.UInt32(nid)

    @dbus.service.method(NAME, in_signature="", out_signature="as")
    def GetCapabilities(self):
        return ["actions", "body"]

    @dbus.service.method(NAME, in_signature="", out_signature="ssss")
    def GetServerInformation(self):
        return ("notification-recorder", "lmx-agent tests", "1.0", "1.2")

    @dbus.service.method(NAME, in_signature="u", out_signature="")
    def CloseNotification(self, nid):
        say({"call": "CloseNotification", "id": int(nid)})

    @dbus.service.signal(NAME, signature="us")
    def ActionInvoked(self, nid, key):
        pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bus", required=True, help="D-Bus address, e.g. unix:path=/tmp/x/bus")
    args = parser.parse_args()
    dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
    bus = dbus.bus.BusConnection(args.bus)
    name = dbus.service.BusName(NAME, bus, do_not_queue=True)
    server = Server(bus)
    loop = GLib.MainLoop()

    def commands():
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] == "click" and len(words) >= 2:
                key = words[2] if len(words) > 2 else "default"
                GLib.idle_add(lambda n=int(words[1]), k=key: (server.ActionInvoked(dbus.UInt32(n), k), False)[1])
                say({"call": "clicked", "id": int(words[1]), "key": key})
            elif words[0] == "quit":
                break
        GLib.idle_add(loop.quit)

    threading.Thread(target=commands, daemon=True).start()
    say({"call": "ready", "name": str(name.get_name())})
    loop.run()


if __name__ == "__main__":
    main()
