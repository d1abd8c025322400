#!/usr/bin/env python3
"""A python-zeroconf publisher for the test LAN: an mDNS responder that is not avahi.

Bound to one test address (never eth0); `--announce ADDR` puts another IPv4 address in the A
record (a hostile announcer: loopback, metadata, broadcast), still sent only from the test address. TXT values written "hex:ff00" are raw bytes. Prints "registered" once announced. Reads commands on
stdin: "update k=v ..." replaces the TXT record in place (prints "updated"); "quit" sends a
goodbye and exits. Killed with SIGKILL it vanishes without a goodbye, so peers only drop it
when its TTL runs out.
"""
import argparse
import socket
import sys

from zeroconf import IPVersion, ServiceInfo, Zeroconf


def properties(pairs):
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if value.startswith("hex:"):
            result[key.encode()] = bytes.fromhex(value[4:])
        else:
            result[key.encode()] = value.encode() if sep else None
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--type", default="_opta-lmx._tcp")
    parser.add_argument("--port", type=int, default=1234)
    parser.add_argument("--ttl", type=int, default=120)
    parser.add_argument("--host", default=None)
    parser.add_argument("--announce", default=None, help="the IPv4 address to announce (default: --address)")
    parser.add_argument("txt", nargs="*")
    args = parser.parse_args()

    zc = Zeroconf(interfaces=[args.address], ip_version=IPVersion.V4Only)
    service_type = args.type + ".local."
    host = args.host or (args.name.replace(" ", "-").replace(".", "-") + "-zc.local.")
    info = ServiceInfo(
        service_type,
        f"{args.name}.{service_type}",
        addresses=[socket.inet_aton(args.announce or args.address)],
        port=args.port,
        properties=properties(args.txt),
        server=host,
        host_ttl=args.ttl,
        other_ttl=args.ttl,
    )
    zc.register_service(info, ttl=args.ttl)
    print("registered", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "update":
            info = ServiceInfo(
                service_type, info.name, addresses=info.addresses, port=info.port,
                properties=properties(words[1:]), server=info.server,
                host_ttl=args.ttl, other_ttl=args.ttl)
            zc.update_service(info)
            print("updated", flush=True)
        elif words[0] == "quit":
            break
    zc.unregister_service(info)
    zc.close()


if __name__ == "__main__":
    main()
