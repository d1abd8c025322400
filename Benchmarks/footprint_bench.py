#!/usr/bin/env python3
"""Footprint benchmark: what the package costs on disk and in memory, and how fast the commands
start (figures, not pass/fail tests).

  - the package: .deb size, Installed-Size, each file in /usr/bin (stripped, as shipped);
  - the multi-call binary by dependency: symbol bytes per Swift module and C library
    (Benchmarks/sizes.py on the unstripped release build);
  - the daemon (the packaged binary, its pages dropped from the page cache first, as after a
    reboot) with 1 and 200 live servers announced over mDNS: RSS split into anonymous and
    file-backed, the part of it that is the binary's own pages, and PSS (budgets on each);
  - start-up, whole process (hyperfine): `lmx-status --url` as its own binary and as a link to the
    multi-call binary, `--help` of both, against avahi-browse --help.
Run through `make bench` (BENCH=footprint): root, the test LAN up, the release build made.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import lmxtools  # noqa: E402

REPO = lmxtools.REPO
sys.path.insert(0, os.path.join(REPO, "Benchmarks"))
import memory_map  # noqa: E402

# Seconds of steady probing over which the daemon's idle CPU is measured.
IDLE_WINDOW = float(os.environ.get("BENCH_IDLE_WINDOW", "60"))
# BENCH_DAEMON_ONLY=1: the daemon's rows alone, from the release build in .build/release (or
# LMX_BIN_DIR), no package: RSS, PSS, idle CPU and where the memory goes (a few minutes, test LAN).
DAEMON_ONLY = os.environ.get("BENCH_DAEMON_ONLY") == "1"
SIZES = [int(n) for n in os.environ.get("BENCH_SIZES", "1,200").split(",")]


def sh(*argv, **kw):
    return subprocess.run(list(argv), check=True, capture_output=True, text=True, **kw).stdout


def package(results):
    debs = sorted(f for f in os.listdir(REPO) if f.startswith("lmx-agent_") and f.endswith(".deb"))
    deb = os.path.join(REPO, debs[-1])
    results["deb_bytes"] = os.path.getsize(deb)
    results["installed_kib"] = int(sh("dpkg-deb", "--field", deb, "Installed-Size").strip())
    root = tempfile.mkdtemp(prefix="lmx-footprint-")
    sh("dpkg-deb", "-x", deb, root)
    for name in sorted(os.listdir(root + "/usr/bin")):
        path = root + "/usr/bin/" + name
        results["file_" + name] = "-> " + os.readlink(path) if os.path.islink(path) else os.path.getsize(path)
    # The code the daemon runs, gathered by Packaging/lmx-agent-hot.ld, against all of its code.
    for line in sh("readelf", "-SW", root + "/usr/bin/lmx-agentd").splitlines():
        parts = line.replace("[ ", "[").split()
        if len(parts) > 6 and parts[1] in (".text.lmx_hot", ".text"):
            results["code_" + parts[1].strip(".").replace(".", "_")] = int(parts[5], 16)
    return root


def rss(pid, binary):
    status = dict(line.split(":", 1) for line in open("/proc/%d/status" % pid))
    def kib(key):
        return int(status[key].split()[0])
    own = 0
    name = None
    for line in open("/proc/%d/smaps" % pid):
        parts = line.split()
        if len(parts) >= 5 and "-" in parts[0] and ":" not in parts[0]:
            name = parts[5] if len(parts) > 5 else ""
        elif parts and parts[0] == "Rss:" and name and os.path.realpath(name) == os.path.realpath(binary):
            own += int(parts[1])
    pss = lmxtools.memory_kib(pid)["pss"]
    return kib("VmRSS") / 1024, kib("RssAnon") / 1024, kib("RssFile") / 1024, own / 1024, pss / 1024


def cpu_seconds(pid):
    """utime + stime of a process so far, seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def daemon(results, bindir):
    os.environ["LMX_BIN_DIR"] = bindir
    import agent_bench as ab  # noqa: E402 (reads LMX_BIN_DIR when imported)

    for n in SIZES:
        # As after a reboot: the binary's pages come in through the daemon's own page faults
        # (readahead makes large folios, which the kernel maps whole), not from the extraction.
        fd = os.open(os.path.realpath(bindir + "/lmx-agentd"), os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        server = ab.lmx_server("h2", 10001, count=n)
        subprocess.run([ab.TESTBED, "publish-bulk", str(n), "Footprint"], check=True)
        agent = ab.Agent(ab.cfg())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status, body = ab.request(agent.sock, "/v1/status")
            if status == 200:
                routes = [r for c in json.loads(body)["candidates"] for r in c["routes"]
                          if r["base_url"].startswith("http://%s:" % ab.ENV["LMX_TESTBED_H2_ADDR"])]
                if len([r for r in routes if r.get("verdict") == "ready"]) >= n:
                    break
            time.sleep(0.2)
        # Steady probing, nobody asking: the idle CPU over the window (utime + stime), then
        # status requests below.
        cpu = cpu_seconds(agent.p.pid)
        started = time.monotonic()
        time.sleep(IDLE_WINDOW)
        cpu_ms_per_min = (cpu_seconds(agent.p.pid) - cpu) / (time.monotonic() - started) * 60 * 1000
        for _ in range(20):
            ab.request(agent.sock, "/v1/status")
        total, anon, file_backed, own, pss = rss(agent.p.pid, bindir + "/lmx-agentd")
        results["rss_%d" % n] = {"total": total, "anon": anon, "file": file_backed, "binary": own, "pss": pss,
                                 "idle_cpu_ms_per_min": cpu_ms_per_min}
        # Where it goes: smaps by kind of mapping, and the threads by name.
        results["map_%d" % n] = memory_map.table(memory_map.breakdown(agent.p.pid))
        agent.stop()
        subprocess.run([ab.TESTBED, "unpublish-bulk"], check=True)
        server.stop()
        time.sleep(2)


def startup(results, bindir):
    import agent_bench as ab

    server = ab.lmx_server("h1", 21900)
    endpoint = {"url": "http://%s:21900" % ab.ENV["LMX_TESTBED_H1_ADDR"]}
    agent = ab.Agent(ab.cfg(endpoints=[endpoint]), ["--no-discovery", "--gateway", "off"])
    agent.wait_active(lambda a: a is not None)
    links = tempfile.mkdtemp(prefix="lmx-links-")
    os.symlink(bindir + "/lmx-agentd", links + "/lmx-status")
    commands = {
        "status_url": "%s/lmx-status --socket %s --url" % (bindir, agent.sock),
        "status_url_multicall": "%s/lmx-status --socket %s --url" % (links, agent.sock),
        "status_help": "%s/lmx-status --help" % bindir,
        "discover_help": "%s/lmx-discover --help" % bindir,
        "avahi_browse_help": "avahi-browse --help",
    }
    out = tempfile.mktemp(suffix=".json")
    subprocess.run(["hyperfine", "-N", "--warmup", "10", "--runs", "50", "--export-json", out, *commands.values()],
                   check=True, capture_output=True)
    for key, result in zip(commands, json.load(open(out))["results"]):
        results["start_" + key + "_ms"] = result["median"] * 1000
    agent.stop()
    server.stop()


def daemon_rows(results):
    rows = []
    for n in SIZES:
        r = results["rss_%d" % n]
        rows.append(("daemon RSS with %d live server(s): total (anonymous + file-backed; of which the binary)" % n,
                     "%.1f MiB (%.1f + %.1f; %.1f)" % (r["total"], r["anon"], r["file"], r["binary"]),
                     "≤ 20 MiB" if n == 1 else "≤ 25 MiB"))
        # The budgets that matter when several programs share the machine: the daemon's own heap
        # (anonymous memory, which no other process shares and swap must hold), and PSS (each
        # shared page divided among the processes that map it: what the daemon costs the machine).
        rows.append(("daemon anonymous memory with %d live server(s)" % n, "%.1f MiB" % r["anon"],
                     "≤ 6 MiB" if n == 1 else "≤ 12 MiB"))
        rows.append(("daemon PSS with %d live server(s)" % n, "%.1f MiB" % r["pss"],
                     "≤ 18 MiB" if n == 1 else "≤ 24 MiB"))
        rows.append(("daemon idle CPU with %d live server(s) (%g s window)" % (n, IDLE_WINDOW),
                     "%.0f ms/min" % r["idle_cpu_ms_per_min"], "≤ 60 ms/min" if n == 1 else ""))
    return rows


def daemon_maps(results):
    return "".join("\n\nWhere the daemon's memory goes with %d live server(s):\n\n%s" % (n, results["map_%d" % n])
                   for n in SIZES)


def main():
    results = {}
    if DAEMON_ONLY:
        bindir = os.environ.get("LMX_BIN_DIR", os.path.join(REPO, ".build", "release"))
        daemon(results, bindir)
        table = "| measure | lmx-agent | target |\n|---|---|---|\n" + "\n".join(
            "| %s | %s | %s |" % r for r in daemon_rows(results)) + daemon_maps(results)
        print(table)
        return
    root = package(results)
    bindir = root + "/usr/bin"
    results["by_dependency"] = sh("python3", os.path.join(REPO, "Benchmarks", "sizes.py"),
                                  os.path.join(REPO, ".build", "release", "lmx-agent"), "--top", "25")
    daemon(results, bindir)
    startup(results, bindir)
    def mb(b):
        return "%.1f MB" % (b / 1e6)
    rows = [
        ("package (.deb)", mb(results["deb_bytes"]), "≤ 15 MB"),
        ("installed (Installed-Size)", "%.1f MB" % (results["installed_kib"] * 1024 / 1e6), "≤ 50 MB"),
    ]
    for key, value in sorted(results.items()):
        if key.startswith("file_"):
            rows.append(("/usr/bin/" + key[5:], value if isinstance(value, str) else mb(value), ""))
    if "code_text_lmx_hot" in results:
        rows.append(("lmx-agentd's code: the part it runs (`.text.lmx_hot`) / the rest (`.text`)",
                     "%s / %s" % (mb(results["code_text_lmx_hot"]), mb(results.get("code_text", 0))), ""))
    rows += daemon_rows(results)
    for key, label, target in (
        ("status_url", "`lmx-status --url` (its own binary), whole process", "≤ 3 ms"),
        ("status_url_multicall", "`lmx-status --url` as a link to the multi-call binary", ""),
        ("status_help", "`lmx-status --help`", ""),
        ("discover_help", "`lmx-discover --help` (the multi-call binary)", ""),
        ("avahi_browse_help", "`avahi-browse --help`", ""),
    ):
        rows.append((label + " (median of 50)", "%.1f ms" % results["start_%s_ms" % key], target))
    table = "| measure | lmx-agent | target |\n|---|---|---|\n" + "\n".join("| %s | %s | %s |" % r for r in rows)
    table += daemon_maps(results)
    table += "\n\nThe multi-call binary by dependency (symbol bytes, unstripped release build):\n\n" + results["by_dependency"]
    print(table)
    out = os.environ.get("BENCH_RESULTS", os.path.join(REPO, "Benchmarks", "results-footprint.md"))
    with open(out, "w") as f:
        f.write(table + "\n\n```json\n" + json.dumps({k: v for k, v in results.items() if k != "by_dependency"}, indent=1, sort_keys=True) + "\n```\n")


if __name__ == "__main__":
    main()
