#!/usr/bin/python3
"""Forges logind's wake signal the ways another local user could: PrepareForSleep(false) sent
*unicast* to every connection on the bus (match rules filter only broadcasts), from a connection
that does not own org.freedesktop.login1, COUNT times each. For the tests: an agent must not hear
any of them.

Usage: forge-wake.py --bus ADDRESS [--count N]
Prints "sent N" at the end. Needs Debian's python3-dbus (run with /usr/bin/python3).
"""
import argparse

import dbus
import dbus.lowlevel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bus", required=True)
    parser.add_argument("--count", type=int, default=50)
    args = parser.parse_args()
    bus = dbus.bus.BusConnection(args.bus)
    names = [n for n in bus.list_names() if n.startswith(":") and n != bus.get_unique_name()]
    sent = 0
    for _ in range(min(args.count, 1000)):
        for name in names:
            signal = dbus.lowlevel.SignalMessage("/org/freedesktop/login1", "org.freedesktop.login1.Manager", "PrepareForSleep")
            signal.set_destination(name)
            signal.append(dbus.Boolean(False), signature="b")
            bus.send_message(signal)
            sent += 1
    bus.flush()
    print("sent %d" % sent, flush=True)
    bus.close()


if __name__ == "__main__":
    main()
