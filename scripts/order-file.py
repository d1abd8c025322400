#!/usr/bin/env python3
"""Writes Packaging/lmx-agent.order: every function the daemon runs, for the release link to
place side by side (lld --symbol-ordering-file).

Why: the kernel maps a program's code 64 KB around each page it touches, so the daemon's
resident memory is mostly its own binary, spread over every 64 KB window that holds one function
it ran. With the functions it runs packed together, those windows are few (Benchmarks/README.md,
footprint).

How: the release build (scripts/lib.sh RELEASE_BUILD compiles with function sections) runs as
lmx-agentd under valgrind's callgrind through the footprint benchmark's workload (discovery of 1
then 200 announced servers, a paired TLS tunnel, status, watch, metrics and gateway requests),
and the names of the functions it entered are kept in the order they were first reached.

Run as root with the test LAN up (scripts/testbed.sh up) after `make release`; commit the file.
A function missing from the file is not an error: it is placed after the ordered ones, so a stale
file costs memory, never correctness. `python3 scripts/order-file.py --check` reports how much of
the file the current build still has.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.environ.get("LMX_ORDER_BINARY", os.path.join(REPO, ".build", "release", "lmx-agent"))
ORDER = os.path.join(REPO, "Packaging", "lmx-agent.order")


def symbols(binary):
    out = subprocess.run(["nm", "--defined-only", binary], check=True, capture_output=True, text=True).stdout
    return {line.split()[2] for line in out.splitlines() if len(line.split()) == 3 and line.split()[1] in "tTwW"}


def check():
    names = [line.strip() for line in open(ORDER) if line.strip() and not line.startswith("#")]
    have = symbols(BINARY)
    found = sum(1 for name in names if name in have)
    print("%s: %d of %d functions are in %s (%.0f%%)" % (os.path.relpath(ORDER, REPO), found, len(names),
                                                          os.path.relpath(BINARY, REPO), 100.0 * found / max(1, len(names))))


def gateway_get(path):
    s = socket.create_connection(("127.0.0.1", 1235), timeout=10)
    try:
        s.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % path).encode())
        while s.recv(65536):
            pass
    except OSError:
        pass
    finally:
        s.close()


def workload(work):
    """The footprint benchmark's steps, slower: everything runs about 50 times slower under callgrind."""
    os.environ["LMX_BIN_DIR"] = work
    sys.path.insert(0, os.path.join(REPO, "Benchmarks"))
    import agent_bench as ab

    tunnel = ab.lmx_server("root", 21950, tls=True, bind=ab.ENV.get("LMX_TESTBED_H4_TUNNEL_ADDR", "10.253.0.1"))
    for n in (1, 200):
        server = ab.lmx_server("h2", 10001, count=n)
        subprocess.run([ab.TESTBED, "publish-bulk", str(n), "Order"], check=True)
        config = ab.cfg(window=2, endpoints=[{"url": "https://%s:21950" % ab.ENV.get("LMX_TESTBED_H4_TUNNEL_ADDR", "10.253.0.1")}])
        agent = ab.Agent(config)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            status, body = ab.request(agent.sock, "/v1/status")
            if status == 200:
                ready = [r for c in json.loads(body)["candidates"] for r in c["routes"] if r.get("verdict") == "ready"]
                if len(ready) >= n:
                    break
            time.sleep(1)
        end = time.monotonic() + 90
        while time.monotonic() < end:
            for path in ("/v1/status", "/v1/active", "/v1/pairings", "/metrics", "/v1/events?limit=20"):
                ab.request(agent.sock, path)
            gateway_get("/v1/models")
            time.sleep(2)
        agent.p.send_signal(15)
        agent.p.wait(120)
        shutil.rmtree(agent.dir, ignore_errors=True)
        subprocess.run([ab.TESTBED, "unpublish-bulk"], check=True)
        server.stop()
    tunnel.stop()


def main():
    if "--check" in sys.argv:
        return check()
    work = tempfile.mkdtemp(prefix="lmx-order-")
    os.makedirs(work + "/real")
    # valgrind reads the symbols but not the Swift toolchain's DWARF: give it a copy without debug info.
    subprocess.run(["strip", "--strip-debug", "-o", work + "/real/lmx-agentd", BINARY], check=True)
    wrapper = work + "/lmx-agentd"
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\nexec valgrind -q --tool=callgrind --callgrind-out-file=%s/cg.%%p --dump-instr=no "
                "--compress-strings=no --compress-pos=no --demangle=no %s/real/lmx-agentd \"$@\"\n" % (work, work))
    os.chmod(wrapper, 0o755)
    workload(work)
    seen, order = set(), []
    for name in sorted(os.listdir(work)):
        if not name.startswith("cg."):
            continue
        for line in open(os.path.join(work, name), errors="replace"):
            if line.startswith(("fn=", "cfn=")):
                symbol = line.split("=", 1)[1].strip()
                if symbol not in seen:
                    seen.add(symbol)
                    order.append(symbol)
    have = symbols(BINARY)
    kept = [name for name in order if name in have]
    with open(ORDER, "w") as f:
        f.write("# Functions lmx-agentd runs, in the order first reached (scripts/order-file.py); the release\n"
                "# link places them together (lld --symbol-ordering-file). Regenerate after larger changes.\n")
        f.write("\n".join(kept) + "\n")
    print("%d functions written to %s" % (len(kept), os.path.relpath(ORDER, REPO)))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
