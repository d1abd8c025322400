#!/usr/bin/env python3
"""Writes Packaging/lmx-agent-hot.ld: the code lmx-agentd runs, for the release link to place
side by side.

Why: the kernel maps a program's code 64 KB around each page it touches, so the daemon's
resident memory is mostly its own binary, spread over every 64 KB window that holds one function
it ran. With the functions it runs packed together, those windows are few (Benchmarks/README.md,
footprint).

How: the release build (RELEASE_BUILD in scripts/lib.sh: every function in a section of its own)
is linked once more with a map file and runs as lmx-agentd under valgrind's callgrind through the
footprint benchmark's workload (discovery of 1 then 200 announced servers, a paired TLS tunnel,
status, events, metrics, resolve and gateway requests). Every instruction address it executed is traced
back through the map to the input section that holds it (by object file and section name, which
also names the private functions that have no symbol), and the script lists those sections,
grouped by object file, for an output section `.text.lmx_hot` inserted before `.text` (their
order inside it does not matter for memory: only that they are together).

Run as root with the test LAN up (scripts/testbed.sh up) after `make release`; commit the file.
A section the script names that a later build no longer has matches nothing: a stale file costs
memory, never correctness. `python3 scripts/release/order-file.py --check` reports how many of the
named sections the current build still has (it relinks with a map file).
"""
import bisect
import collections
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import lmxtools  # noqa: E402

REPO = lmxtools.REPO
SCRIPT = os.path.join(REPO, "Packaging", "lmx-agent-hot.ld")
VERSIONS = os.path.join(REPO, "Packaging", "lmx-agent-hot.versions")


def release_link_with_map(map_path):
    """Relinks the multi-call binary with the release flags and a map file; returns its path."""
    # LMX_ORDER_SCRATCH: another build folder (swift build --scratch-path).
    scratch = " --scratch-path '%s'" % os.environ["LMX_ORDER_SCRATCH"] if os.environ.get("LMX_ORDER_SCRATCH") else ""
    build = ("source scripts/lib.sh && release_build_setup && swift build \"${RELEASE_BUILD[@]}\"%s -Xlinker -Map=%s --product lmx-agent >&2 "
             "&& swift build \"${RELEASE_BUILD[@]}\"%s --show-bin-path") % (scratch, map_path, scratch)
    bindir = subprocess.run(["bash", "-c", build], cwd=REPO, check=True, capture_output=True, text=True).stdout.split()[-1]
    return os.path.join(bindir, "lmx-agent")


def input_sections(map_path):
    """(address, size, file pattern, section name) of every code input section, by address."""
    line_re = re.compile(r"^\s*([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+\d+\s+(\S.*):\((\.text[^)]*)\)\s*$")
    sections = []
    for line in open(map_path, errors="replace"):
        m = line_re.match(line)
        if not m or int(m.group(2), 16) == 0:
            continue
        sections.append((int(m.group(1), 16), int(m.group(2), 16), pattern(m.group(3)), m.group(4)))
    sections.sort()
    return sections


def pattern(path):
    """A file pattern that names the same object in any checkout: `*/Module.build/File.o`, or
    `*libX.a:member.o` for an archive member."""
    m = re.match(r"^(.*)\((.*)\)$", path)
    if m:
        return "*" + os.path.basename(m.group(1)) + ":" + m.group(2)
    parts = path.split("/")
    return "*/" + "/".join(parts[-2:]) if len(parts) >= 2 else path


def gateway_get(path):
    try:
        s = socket.create_connection(("127.0.0.1", 1235), timeout=10)
    except OSError:
        return
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

    tunnel_addr = ab.ENV["LMX_TESTBED_H4_TUNNEL_ADDR"]
    tunnel = ab.lmx_server("root", 21950, tls=True, bind=tunnel_addr)
    for n in (1, 200):
        server = ab.lmx_server("h2", 10001, count=n)
        subprocess.run([ab.TESTBED, "publish-bulk", str(n), "Order"], check=True)
        agent = ab.Agent(ab.cfg(window=2, endpoints=[{"url": "https://%s:21950" % tunnel_addr}]))
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
            for path in ("/v1/status", "/v1/active", "/v1/pairings", "/metrics", "/v1/events?limit=20",
                         "/v1/resolve?model=m"):
                ab.request(agent.sock, path)
            gateway_get("/v1/models")
            time.sleep(2)
        agent.p.send_signal(15)
        agent.p.wait(180)
        shutil.rmtree(agent.dir, ignore_errors=True)
        subprocess.run([ab.TESTBED, "unpublish-bulk"], check=True)
        server.stop()
    tunnel.stop()


def executed(work, binary):
    """Link-time addresses of the instructions lmx-agentd executed (each once)."""
    symbols = {}
    for line in subprocess.run(["nm", "--defined-only", binary], check=True, capture_output=True, text=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "tTwW":
            symbols[parts[2]] = int(parts[0], 16)
    target = os.path.realpath(work + "/real/lmx-agentd")
    seen, order = set(), []
    for name in sorted(os.listdir(work)):
        if not name.startswith("cg."):
            continue
        ob = fn = None
        first = None
        # Callgrind gives the binary's own functions at link-time addresses, and code it could
        # not place in an object ("???": in practice ours too, functions valgrind read no
        # object for) at run-time addresses; each kind gets its own offset, found from the
        # functions it names.
        run, starts = [], {target: collections.Counter(), "???": collections.Counter()}
        for line in open(os.path.join(work, name), errors="replace"):
            if line.startswith("ob="):
                ob = line[3:].strip()
                ob = ob if ob == "???" else os.path.realpath(ob)
            elif line.startswith("fn="):
                fn, first = line[3:].strip().split("'")[0], None
            elif line.startswith("0x") and ob in starts:
                address = int(line.split()[0], 16)
                run.append((ob, address))
                if first is None and fn in symbols:
                    first = address
                    starts[ob][address - symbols[fn]] += 1
        base = {kind: counts.most_common(1)[0][0] for kind, counts in starts.items() if counts}
        for kind, address in run:
            if kind in base and address - base[kind] not in seen:
                seen.add(address - base[kind])
                order.append(address - base[kind])
    return order


def write_script(sections, addresses):
    starts = [s[0] for s in sections]
    hot, seen = [], set()
    for address in addresses:
        i = bisect.bisect_right(starts, address) - 1
        if i < 0 or address >= sections[i][0] + sections[i][1]:
            continue
        key = sections[i][2:]
        if key not in seen:
            seen.add(key)
            hot.append(key)
    by_file = collections.OrderedDict()
    for file, section in hot:
        by_file.setdefault(file, []).append(section)
    with open(SCRIPT, "w") as f:
        f.write("/* The code lmx-agentd runs, placed together before .text (scripts/release/order-file.py; the\n"
                "   release link reads it, scripts/lib.sh). %d sections from %d files. */\n" % (len(hot), len(by_file)))
        f.write("SECTIONS {\n  .text.lmx_hot : {\n")
        for file, names in by_file.items():
            f.write("    %s(%s)\n" % (file, " ".join(names)))
        f.write("  }\n} INSERT BEFORE .text;\n")
    return len(hot), len(by_file)


def main():
    if "--check" not in sys.argv:
        if os.geteuid() != 0 or not os.path.exists("/run/lmx-testbed/env"):
            sys.exit("order-file: run as root with the test LAN up (sudo scripts/testbed.sh up)")
        if not shutil.which("valgrind"):
            sys.exit("order-file: needs valgrind (apt-get install valgrind)")
    work = tempfile.mkdtemp(prefix="lmx-order-")
    map_path = work + "/lmx-agent.map"
    binary = release_link_with_map(map_path)
    sections = input_sections(map_path)
    if "--check" in sys.argv:
        have = {s[2:] for s in sections}
        named = re.findall(r"^    (\S+)\((.*)\)$", open(SCRIPT).read(), re.M)
        wanted = [(file, s) for file, names in named for s in names.split()]
        found = sum(1 for key in wanted if key in have)
        print("%s: %d of %d sections are in the current build (%.0f%%)" % (
            os.path.relpath(SCRIPT, REPO), found, len(wanted), 100.0 * found / max(1, len(wanted))))
        return shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work + "/real")
    # valgrind reads the symbols but not the Swift toolchain's DWARF: give it a copy without debug info.
    subprocess.run(["strip", "--strip-debug", "-o", work + "/real/lmx-agentd", binary], check=True)
    with open(work + "/lmx-agentd", "w") as f:
        f.write("#!/bin/sh\nexec valgrind -q --tool=callgrind --callgrind-out-file=%s/cg.%%p --dump-instr=yes "
                "--compress-strings=no --compress-pos=no --demangle=no %s/real/lmx-agentd \"$@\"\n" % (work, work))
    os.chmod(work + "/lmx-agentd", 0o755)
    workload(work)
    count, files = write_script(sections, executed(work, binary))
    # The dependency versions the script names functions of: the release uses it only with these.
    versions = subprocess.run(["bash", "-c", "source scripts/lib.sh && resolved_versions"], cwd=REPO, check=True,
                              capture_output=True, text=True).stdout
    with open(VERSIONS, "w") as f:
        f.write(versions)
    print("%d sections from %d files written to %s" % (count, files, os.path.relpath(SCRIPT, REPO)))
    if os.environ.get("LMX_ORDER_KEEP"):
        print("kept", work)
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
