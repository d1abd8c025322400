#!/usr/bin/env python3
"""Hostile local clients for lmx-agentd's Unix socket (run as another user by the tests).

  hostile-clients.py --socket PATH --count N --seconds S
      Opens N connections and keeps them for S seconds: a third send half a request, a third
      start /v1/watch and never read, a third send nothing. Prints "open K refused R" once all
      were tried (R: connections the agent closed at once), then "done" when it lets go.
  hostile-clients.py --tcp HOST:PORT --slow-body --count N --seconds S
      The same against the gateway's TCP listener: every connection starts a POST that announces
      a 10 MB body, sends its first bytes, then one more byte a second.
Bounded in count and time; stops by itself.
"""
import argparse
import resource
import socket
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket")
    parser.add_argument("--tcp")
    parser.add_argument("--slow-body", action="store_true")
    parser.add_argument("--count", type=int, default=1100)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.count + 64)), hard))
    held = []
    failed = 0
    for i in range(min(args.count, 5000)):
        if args.tcp:
            host, port = args.tcp.rsplit(":", 1)
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        else:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            if args.tcp:
                s.connect((host, int(port)))
            else:
                s.connect(args.socket)
            kind = i % 3
            if args.slow_body:
                s.send(("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                        "Content-Length: 10000000\r\n\r\n{\"messages\": [" % args.tcp).encode())
            elif kind == 0:
                s.send(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n")
            elif kind == 1:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.send(b"GET /v1/watch HTTP/1.1\r\nHost: x\r\n\r\n")
            held.append(s)
        except OSError:
            failed += 1
            s.close()
    time.sleep(1)
    # The agent closes what is over the limit: those read as end of stream.
    refused = 0
    for s in held:
        s.setblocking(False)
        try:
            if s.recv(1, socket.MSG_PEEK) == b"":
                refused += 1
        except BlockingIOError:
            pass
        except OSError:
            refused += 1
    print("open %d refused %d failed %d" % (len(held) - refused, refused, failed), flush=True)
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        time.sleep(1)
        if args.slow_body:
            for s in held:
                try:
                    s.send(b" ")
                except OSError:
                    pass
    for s in held:
        s.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
