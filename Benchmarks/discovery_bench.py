#!/usr/bin/env python3
"""Discovery benchmark: lmx-discover against avahi-browse on the test LAN, side by side.

For 1, 50 and 200 services published from a namespace host it measures, in one run:
  - wall time to a complete listing: `lmx-discover --json` vs `avahi-browse -rtp`
  - time to the first resolved server, warm daemon cache and cold (daemon just restarted):
    `lmx-discover --watch` first "added" line vs `avahi-browse -rp` first "=" line
  - peak RSS of each process (wait4 rusage)
Run through `make bench` (needs root and the test LAN, which scripts/bench.sh brings up).
"""
import json
import os
import sys
import platform
import statistics
import subprocess
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import lmxtools  # noqa: E402

REPO = lmxtools.REPO
TESTBED = lmxtools.TESTBED
LMX = os.environ.get("LMX_DISCOVER", os.path.join(REPO, ".build", "release", "lmx-discover"))
AVAHI = "/usr/bin/avahi-browse"
TYPE = "_opta-lmx._tcp"
SIZES = [int(s) for s in os.environ.get("BENCH_SIZES", "1,50,200").split(",")]
RUNS = int(os.environ.get("BENCH_RUNS", "7"))
COLD_RUNS = int(os.environ.get("BENCH_COLD_RUNS", "3"))
PREFIX = "Bench"


def run_complete(argv, expect):
    """Runs argv to completion and checks it listed every service; returns seconds."""
    start = time.perf_counter()
    out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
    elapsed = time.perf_counter() - start
    found = count_found(argv, out.decode("utf-8", "replace"))
    if found != expect:
        raise SystemExit(f"{argv[0]} listed {found} of {expect} services")
    return elapsed




def count_found(argv, text):
    if argv[0] == LMX:
        return sum(1 for s in json.loads(text) if s["name"].startswith(PREFIX))
    return sum(1 for line in text.splitlines() if line.startswith("=;") and f";{PREFIX}\\032" in line)


def first_result(argv, marker, timeout=10.0):
    """Seconds from spawn to the first stdout line containing marker."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        while True:
            line = proc.stdout.readline()
            if not line:
                raise SystemExit(f"{argv[0]} ended before a result")
            if marker in line:
                return time.perf_counter() - start
            if time.perf_counter() - start > timeout:
                raise SystemExit(f"{argv[0]}: no result in {timeout} s")
    finally:
        proc.kill()
        proc.wait()


def testbed(*args):
    subprocess.run([TESTBED, *args], check=True, stdout=subprocess.DEVNULL)


def wait_published(n):
    for _ in range(100):
        out = subprocess.run([AVAHI, "-rtp", TYPE], capture_output=True, text=True).stdout
        if count_found([AVAHI], out) == n:
            return
        time.sleep(0.2)
    raise SystemExit(f"only {count_found([AVAHI], out)} of {n} services appeared")


def ms(values):
    return statistics.median(values) * 1000


def main():
    lmx_complete = [LMX, "--json", "--timeout", "20"]
    avahi_complete = [AVAHI, "-rtp", TYPE]
    lmx_first = ([LMX, "--watch"], b'"event":"added"')
    avahi_first = ([AVAHI, "-rp", TYPE], b"=;")
    startup = {}
    for tool, argv in [("lmx-discover", [LMX, "--help"]), ("avahi-browse", [AVAHI, "--help"])]:
        samples = []
        for _ in range(30):
            start = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            samples.append(time.perf_counter() - start)
        startup[tool] = ms(samples)
    rows = []
    for n in SIZES:
        testbed("publish-bulk", str(n), PREFIX)
        wait_published(n)
        result = {"n": n}
        for tool, complete, (first_argv, marker) in [
            ("lmx-discover", lmx_complete, (lmx_first)),
            ("avahi-browse", avahi_complete, (avahi_first)),
        ]:
            result[tool] = {"complete": [], "rss": [], "warm": [], "cold": []}
        # Interleave the tools so drift on the machine hits both alike.
        for _ in range(RUNS):
            for tool, argv in [("lmx-discover", lmx_complete), ("avahi-browse", avahi_complete)]:
                result[tool]["complete"].append(run_complete(argv, n))
            for tool, (argv, marker) in [("lmx-discover", lmx_first), ("avahi-browse", avahi_first)]:
                result[tool]["warm"].append(first_result(argv, marker))
        for tool, argv in [("lmx-discover", lmx_complete), ("avahi-browse", avahi_complete)]:
            result[tool]["rss"] = [lmxtools.peak_rss_kib(argv) for _ in range(3)]
        for _ in range(COLD_RUNS):
            for tool, (argv, marker) in [("lmx-discover", lmx_first), ("avahi-browse", avahi_first)]:
                testbed("restart-avahi", "root")  # empty cache
                result[tool]["cold"].append(first_result(argv, marker))
        wait_published(n)
        rows.append(result)
        testbed("unpublish-bulk")
        time.sleep(1.5)

    header = "| services | tool | complete listing, median (min–max) | first result, warm cache | first result, cold cache | peak RSS |"
    lines = [header, "|---:|---|---:|---:|---:|---:|"]
    for result in rows:
        for tool in ("lmx-discover", "avahi-browse"):
            r = result[tool]
            lines.append(
                f"| {result['n']} | {tool} | {ms(r['complete']):.0f} ms ({min(r['complete'])*1000:.0f}–{max(r['complete'])*1000:.0f}) "
                f"| {ms(r['warm']):.1f} ms | {ms(r['cold']):.0f} ms | {max(r['rss'])/1024:.1f} MiB |")
    lines.append("")
    lines.append(f"Process start-up alone (`--help`, median of 30): lmx-discover {startup['lmx-discover']:.1f} ms, "
                 f"avahi-browse {startup['avahi-browse']:.1f} ms.")
    table = "\n".join(lines)
    print(table)

    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    swift = subprocess.run(["swift", "--version"], capture_output=True, text=True).stdout.splitlines()
    avahi_version = subprocess.run(["avahi-daemon", "--version"], capture_output=True, text=True).stdout.strip()
    machine = (f"{os.cpu_count()} cores, {cpu}, Linux {platform.release()}, "
               f"{swift[0] if swift else 'swift ?'}, {avahi_version}, release build, "
               f"{RUNS} warm runs and {COLD_RUNS} cold runs per tool and size, {time.strftime('%Y-%m-%d')}")
    print("\n" + machine)
    out = os.environ.get("BENCH_RESULTS")
    if out:
        with open(out, "w") as f:
            f.write(table + "\n\n" + machine + "\n")


if __name__ == "__main__":
    main()
