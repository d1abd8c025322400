#!/usr/bin/python3
"""A stand-in for systemd-logind on a test bus: owns org.freedesktop.login1 and sends its
PrepareForSleep signal, as logind does around a suspend.

Usage: login1-standin.py --bus ADDRESS sleep|wake|both
  sleep  PrepareForSleep(true)   (the machine is about to sleep)
  wake   PrepareForSleep(false)  (it has woken)
  both   one, then the other
Prints "sent <value>" for each signal. Needs Debian's python3-dbus (run with /usr/bin/python3).
"""
import argparse
import sys

import dbus
import dbus.lowlevel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bus", required=True, help="D-Bus address, e.g. unix:path=/run/lmx-testbed/h4/bus")
    parser.add_argument("what", choices=["sleep", "wake", "both"])
    args = parser.parse_args()
    bus = dbus.bus.BusConnection(args.bus)
    reply = bus.request_name("org.freedesktop.login1", dbus.bus.NAME_FLAG_DO_NOT_QUEUE)
    if reply not in (dbus.bus.REQUEST_NAME_REPLY_PRIMARY_OWNER, dbus.bus.REQUEST_NAME_REPLY_ALREADY_OWNER):
        sys.exit("could not own org.freedesktop.login1 on %s (reply %d)" % (args.bus, reply))
    values = {"sleep": [True], "wake": [False], "both": [True, False]}[args.what]
    for value in values:
        signal = dbus.lowlevel.SignalMessage("/org/freedesktop/login1", "org.freedesktop.login1.Manager", "PrepareForSleep")
        signal.append(dbus.Boolean(value), signature="b")
        bus.send_message(signal)
        bus.flush()
        print("sent %s" % ("true" if value else "false"), flush=True)
    bus.close()


if __name__ == "__main__":
    main()
