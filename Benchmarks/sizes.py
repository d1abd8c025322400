#!/usr/bin/env python3
"""Bytes of a binary by where they come from: symbol sizes (`nm -S`) grouped by Swift module
(from the mangled name), and the C/C++ libraries linked in (BoringSSL, ICU and its data, the
Swift runtime), with the rest as "other". Prints a Markdown table, largest first.

Usage: sizes.py BINARY [--top N]
"""
import collections
import re
import subprocess
import sys

SWIFT = re.compile(r"^\$s(\d+)([A-Za-z_][A-Za-z0-9_]*)")
STDLIB_PREFIX = re.compile(r"^\$s(S[a-zA-Z]|s[0-9A-Z_]|y|Ss)")


def group(name):
    if name.startswith("icudt"):
        return "ICU data"
    if name.startswith("$s"):
        m = SWIFT.match(name)
        if m:
            length, rest = int(m.group(1)), m.group(2)
            module = rest[:length]
            if module in ("Swift", "_Concurrency", "_StringProcessing", "_RegexParser", "Synchronization", "Glibc",
                          "Dispatch", "Distributed", "Observation", "_SwiftConcurrencyShims"):
                return "Swift standard library"
            return module
        return "Swift standard library"
    if name.startswith(("CNIOBoringSSL", "_CNIOBoringSSL")) or "CNIOBoringSSL" in name:
        return "BoringSSL (swift-nio-ssl)"
    if re.search(r"_7[0-9]$", name) or "icu_7" in name:
        return "ICU code"
    if name.startswith(("swift_", "_swift", "_ZN5swift", "_ZNK5swift", "__swift")) or "swift" in name[:12].lower():
        return "Swift runtime"
    if name.startswith(("dispatch_", "_dispatch", "_Block", "_os_")):
        return "libdispatch"
    if name.startswith(("sqlite3", "avahi", "zbar", "png_", "tj", "QRcode")):
        return "C libraries (dynamic stubs)"
    if name.startswith(("CF", "__CF", "_CF", "_ZN2CF")):
        return "CoreFoundation"
    if name.startswith(("c_nio", "CNIO")):
        return "NIO C shims"
    return "other (C, libc++ and unnamed)"


def main():
    binary = sys.argv[1]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    out = subprocess.run(["nm", "-S", "--size-sort", binary], capture_output=True, text=True, check=True).stdout
    sizes = collections.Counter()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        sizes[group(parts[3])] += int(parts[1], 16)
    total = sum(sizes.values())
    print("| from | bytes | share |\n|---|---:|---:|")
    for name, size in sizes.most_common(top):
        print("| %s | %.1f MB | %.0f %% |" % (name, size / 1e6, 100 * size / total))
    print("| **all symbols** | %.1f MB | |" % (total / 1e6))


if __name__ == "__main__":
    main()
