#!/usr/bin/env python3
"""lmx-pair decode time against `zbarimg --raw` on the same files, in one run.

Files: a 1.1 MP PNG (qrencode) and a 12 MP JPEG (the code on a 4000 x 3000 white "photo",
slightly rotated and blurred, made with ImageMagick). Each tool runs RUNS times per file,
alternating; reported: median and min wall time of the whole process, and peak RSS.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import lmxtools  # noqa: E402

BIN = os.environ.get("LMX_BIN_DIR", ".build/release")
RUNS = int(os.environ.get("BENCH_RUNS", "15"))
RESULTS = os.environ.get("BENCH_RESULTS", "Benchmarks/results-pair.md")
TOKEN = ("opta-lmx://pair?v=1&name=Bench&url=https%3A%2F%2Fquiet-river-1234.trycloudflare.com&key=ADMIN"
         "&api_key=INFER&cf_id=ID.access&cf_secret=SECRET&instance=Mono512%3A1234&lan=192.168.188.11%3A1234")


def run(command):
    start = time.perf_counter()
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.decode()}")
    return elapsed, result.stdout




def main():
    work = tempfile.mkdtemp(prefix="lmx-pair-bench-")
    png = os.path.join(work, "code-1mp.png")
    jpg = os.path.join(work, "photo-12mp.jpg")
    subprocess.run(["qrencode", "-l", "M", "-s", "16", "-o", png, TOKEN], check=True)
    subprocess.run(["convert", png, "-background", "white", "-gravity", "center", "-rotate", "3", "-resize", "1800x1800",
                    "-extent", "4000x3000", "-blur", "0x1.2", "-quality", "85", jpg], check=True)
    db = os.path.join(work, "agent.db")
    rows = []
    for label, path in [("PNG", png), ("JPEG", jpg)]:
        size = subprocess.run(["identify", "-format", "%w x %h", path], stdout=subprocess.PIPE, check=True).stdout.decode()
        ours_cmd = [f"{BIN}/lmx-pair", path, "--dry-run", "--db", db, "--socket", os.path.join(work, "none.sock")]
        zbar_cmd = ["zbarimg", "--raw", "-q", path]
        ours, zbar = [], []
        for _ in range(RUNS):
            ours.append(run(ours_cmd)[0])
            zbar.append(run(zbar_cmd)[0])
        rows.append((label, size, len(open(path, "rb").read()) // 1024, ours, zbar, lmxtools.peak_rss_kib(ours_cmd), lmxtools.peak_rss_kib(zbar_cmd)))
    lines = [
        f"lmx-pair against zbarimg --raw, {RUNS} runs each, alternating (whole process, ms):",
        "",
        "| file | pixels | KiB | lmx-pair median | min | zbarimg median | min | lmx-pair RSS | zbarimg RSS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, size, kib, ours, zbar, ours_rss, zbar_rss in rows:
        lines.append(f"| {label} | {size} | {kib} | {statistics.median(ours)*1000:.1f} | {min(ours)*1000:.1f} | "
                     f"{statistics.median(zbar)*1000:.1f} | {min(zbar)*1000:.1f} | {ours_rss/1024:.1f} MiB | {zbar_rss/1024:.1f} MiB |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(RESULTS, "w") as f:
        f.write(text)
    subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
