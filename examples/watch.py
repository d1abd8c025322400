#!/usr/bin/env python3
"""Follow lmx-agentd's /v1/watch stream and print one line per change of the active endpoint.

    examples/watch.py                 # until Ctrl-C
    examples/watch.py --count 3       # stop after three changes (after the first snapshot)

The stream is NDJSON over the agent's Unix socket: a snapshot first, then numbered lines
(`active`, `health`, `candidate-added`, `candidate-removed`, `avahi`, `heartbeat`). If the agent
restarts, the watcher reconnects and resumes with `?since=<last seq>` (the agent answers with
a fresh snapshot when it no longer has those lines). Standard library only.
Environment: LMX_SOCKET (default: your own agent's socket if it runs, else /run/lmx/agent.sock).
"""
import http.client
import json
import os
import socket
import sys
import time


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("lmx")
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def socket_path():
    if os.environ.get("LMX_SOCKET"):
        return os.environ["LMX_SOCKET"]
    own = os.path.join(os.environ.get("XDG_RUNTIME_DIR", f"/tmp/lmx-{os.getuid()}"), "lmx", "agent.sock")
    return own if os.getuid() != 0 and os.path.exists(own) else "/run/lmx/agent.sock"


def describe(active):
    if not active:
        return "none"
    return f"{active['base_url']} via {active['via']} ({active.get('name') or active.get('instance_id')})"


def main():
    count = int(sys.argv[sys.argv.index("--count") + 1]) if "--count" in sys.argv else None
    path = socket_path()
    seq, changes, current, waiting = None, 0, object(), False
    while True:
        try:
            connection = UnixConnection(path)
            connection.request("GET", "/v1/watch" + (f"?since={seq}" if seq is not None else ""))
            response = connection.getresponse()
            if response.status != 200:
                sys.exit(f"watch: {path} answered HTTP {response.status}")
            waiting = False
            for raw in response:
                line = json.loads(raw)
                seq = line.get("seq", seq)
                if line["type"] == "snapshot":
                    active, reason = line["status"].get("active"), line["status"].get("no_active_reason")
                elif line["type"] == "active":
                    active, reason = line.get("active"), line.get("reason")
                else:
                    continue
                if active == current:
                    continue
                stamp = time.strftime("%H:%M:%S")
                print(f"{stamp} active: {describe(active)}" + (f"  [{reason}]" if reason else ""), flush=True)
                if line["type"] == "active":
                    changes += 1
                current = active
                if count is not None and changes >= count:
                    return
        except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError, http.client.HTTPException):
            if not waiting:
                print(f"{time.strftime('%H:%M:%S')} waiting for lmx-agentd at {path}", file=sys.stderr, flush=True)
                waiting = True
            time.sleep(0.5)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
