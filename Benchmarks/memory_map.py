#!/usr/bin/env python3
"""Where a running process's memory goes (figures, not pass/fail): its resident memory from
/proc/PID/smaps, grouped by what each mapping is, and its threads by name.

  - file-backed: the executable, each shared library (libc, libsqlite3, libavahi-client, …), other
    files (ICU data would show here);
  - anonymous: the main heap (`[heap]`), glibc's malloc arenas of other threads (a read-write
    mapping followed by its reserved rest, 64 MiB together), thread stacks (a read-write mapping
    right above a one-page guard), the main thread's `[stack]`, the rest (Swift's and NIO's own
    mmaps, relocated data of the executable);
  - threads: /proc/PID/task/*/comm counted by name (NIO event loops, the blocking pool, Swift's
    cooperative pool, avahi, …);
  - the executable's resident pages by ELF section (/proc/PID/pagemap's present bits against
    readelf's section addresses): how much of the hot code (`.text.lmx_hot`), the rest of the code (`.text`),
    unwind tables, Swift metadata and data is mapped in. A page two sections share counts for each
    by the bytes it holds of it.

  python3 Benchmarks/memory_map.py PID [--json]
"""
import collections
import json
import os
import re
import subprocess
import sys

MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \d+\s*(.*)$")
ARENA = 64 * 1024 * 1024  # glibc's HEAP_MAX_SIZE on 64-bit: one arena's reservation


def mappings(pid):
    """Each mapping of smaps: start, end, permissions, name and its KiB fields."""
    result = []
    with open("/proc/%d/smaps" % pid) as f:
        for line in f:
            found = MAPPING.match(line)
            if found:
                start, end, perms, name = found.groups()
                result.append({"start": int(start, 16), "end": int(end, 16), "perms": perms, "name": name.strip()})
                continue
            parts = line.split()
            if result and len(parts) >= 3 and parts[0].endswith(":") and parts[2] == "kB":
                result[-1][parts[0][:-1]] = int(parts[1])
    return result


def classify(maps, executable):
    """(group, mapping) for each mapping."""
    out = []
    for i, m in enumerate(maps):
        name = m["name"]
        size = m["end"] - m["start"]
        before = maps[i - 1] if i else None
        after = maps[i + 1] if i + 1 < len(maps) else None
        if name and not name.startswith("["):
            if os.path.realpath(name) == executable:
                group = "file: the executable"
            else:
                base = os.path.basename(name)
                group = "file: " + (re.sub(r"\.so[.\d]*$", ".so", base) if ".so" in base else base)
            # Copy-on-write pages of a file's data (relocations, .data written) are anonymous.
            if m.get("Anonymous", 0):
                out.append(("anon: written pages of mapped files", {**m, "Rss": m["Anonymous"]}))
                m = {**m, "Rss": m.get("Rss", 0) - m["Anonymous"]}
        elif name == "[heap]":
            group = "anon: main heap ([heap])"
        elif name == "[stack]":
            group = "anon: main thread's stack"
        elif name.startswith("["):
            group = "other: " + name
        elif (m["perms"].startswith("rw") and after is not None and after["perms"].startswith("---")
              and after["start"] == m["end"] and (after["end"] - m["start"]) == ARENA and m["start"] % ARENA == 0):
            group = "anon: malloc arenas (other threads)"
        elif (m["perms"].startswith("rw") and before is not None and before["perms"].startswith("---")
              and before["end"] == m["start"] and before["end"] - before["start"] <= 64 * 1024):
            group = "anon: thread stacks"
        elif m["perms"].startswith("---"):
            group = "reserved (no memory)"
        else:
            group = "anon: other"
        _ = size
        out.append((group, m))
    return out


def threads(pid):
    names = collections.Counter()
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                name = f.read().strip()
        except OSError:
            continue
        # NIO names its threads "NIO-ELT-<group>-#<n>" and its pool "TP-#<n>": count them by kind.
        names[re.sub(r"#?\d+$", "#", name)] += 1
    return dict(names)


PAGE = os.sysconf("SC_PAGE_SIZE")


def sections_resident(pid, executable):
    """{section: (resident KiB, size KiB)} of the executable's allocated sections, or {} when
    readelf or the process's pagemap cannot be read."""
    try:
        headers = subprocess.run(["readelf", "-SWl", executable], check=True, capture_output=True,
                                 text=True).stdout
        pagemap = open("/proc/%d/pagemap" % pid, "rb")
    except (OSError, subprocess.CalledProcessError):
        return {}
    # The load bias: where the segment at file offset 0 was mapped, less its link-time address.
    first_load = re.search(r"^\s*LOAD\s+0x0+\s+0x([0-9a-f]+)", headers, re.M)
    starts = [int(line.split("-")[0], 16) for line in open("/proc/%d/maps" % pid)
              if line.split()[2] == "00000000" and os.path.realpath(line.split(None, 5)[-1].strip()) == executable]
    if not first_load or not starts:
        return {}
    bias = min(starts) - (int(first_load.group(1), 16) & ~(PAGE - 1))
    result = {}
    with pagemap:
        for m in re.finditer(r"^\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+\S+\s+(\S*A\S*)\s",
                             headers, re.M):
            name, address, size = m.group(1), bias + int(m.group(2), 16), int(m.group(3), 16)
            if size == 0 or "T" in m.group(4):  # empty, or thread-local (a template, not mapped as such)
                continue
            first, last = address // PAGE, (address + size - 1) // PAGE
            pagemap.seek(first * 8)
            entries = pagemap.read((last - first + 1) * 8)
            resident = 0
            for i in range(last - first + 1):
                if int.from_bytes(entries[i * 8:i * 8 + 8], "little") >> 63:
                    page = (first + i) * PAGE
                    resident += min(page + PAGE, address + size) - max(page, address)
            result[name] = (resident / 1024, size / 1024)
    return result


def breakdown(pid):
    executable = os.path.realpath("/proc/%d/exe" % pid)
    groups = collections.defaultdict(lambda: {"rss_kib": 0, "pss_kib": 0, "mappings": 0})
    for group, m in classify(mappings(pid), executable):
        g = groups[group]
        g["rss_kib"] += m.get("Rss", 0)
        g["pss_kib"] += m.get("Pss", 0) if not group.startswith("anon: written") else 0
        g["mappings"] += 1
    return {"groups": dict(groups), "threads": threads(pid), "sections": sections_resident(pid, executable)}


def table(result):
    rows = ["| part | RSS | mappings |", "|---|---:|---:|"]
    total = 0
    for group, g in sorted(result["groups"].items(), key=lambda kv: -kv[1]["rss_kib"]):
        if g["rss_kib"] == 0:
            continue
        total += g["rss_kib"]
        rows.append("| %s | %.2f MiB | %d |" % (group, g["rss_kib"] / 1024, g["mappings"]))
    rows.append("| **total** | %.2f MiB | |" % (total / 1024))
    threads_line = "Threads (%d): %s." % (sum(result["threads"].values()), ", ".join(
        "%s × %d" % (name, n) for name, n in sorted(result["threads"].items(), key=lambda kv: -kv[1])))
    sections = sorted(result.get("sections", {}).items(), key=lambda kv: -kv[1][0])
    big = [(name, r, size) for name, (r, size) in sections if r >= 64]
    sections_line = ("\n\nThe executable's resident pages by section (/proc/PID/pagemap), MiB resident of its size: %s; "
                     "the other sections %.2f MiB." % (
                         ", ".join("%s %.2f of %.2f" % (name, r / 1024, size / 1024) for name, r, size in big),
                         sum(r for _, (r, _) in sections) / 1024 - sum(r for _, r, _ in big) / 1024)) if sections else ""
    return "\n".join(rows) + "\n\n" + threads_line + sections_line


def main():
    pid = int(sys.argv[1])
    result = breakdown(pid)
    print(json.dumps(result, indent=1) if "--json" in sys.argv else table(result))


if __name__ == "__main__":
    main()
