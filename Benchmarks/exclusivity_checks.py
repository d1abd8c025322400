#!/usr/bin/env python3
"""Which stored properties an optimized build with run-time exclusivity checks still checks.

Swift checks an access to a class's stored property at run time (`swift_beginAccess`, about 70
instructions) unless the optimizer proves that no other access can overlap it: one access to a
property that spans a call it cannot see into (a `ByteBuffer` write, an array's growth, hashing a
`String`) keeps every access to that property checked. The data path moves such properties out
into locals and back; this lists what the compiler still checks, so that a change which brings a
check back shows.

The release build itself has no run-time checks (`-enforce-exclusivity=unchecked`, scripts/lib.sh),
so this is what a build without that flag pays (`swift build -c release` by hand, another
packager's): the data path stays free of checks there too.

It compiles the LMXAgent module as the release build does (`swift build -c release -v` gives the
command) but with the checks on, once more with `-emit-sil`, and counts `begin_access [dynamic]` by the property it
reaches (`#Type.property`), and for each the functions it is in (`--functions`). With
`--data-path` it lists only the data path's own types and exits 1 when any is checked.
Run after `make release`; about 20 s. Figures, not a test: `make bench` does not run it.
"""
import argparse
import collections
import os
import re
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import lmxtools  # noqa: E402

# The data path's types (Sources/LMXAgent/Gateway/DataPath): none of their properties should be
# checked at run time.
DATA_PATH = ("GatewayConnectionHandler", "ForwardedRequest", "UpstreamHandler", "UpstreamPool", "UpstreamConnection",
             "EventRelay", "ClientFront", "LoopState", "Gathered", "RouteLoad")
MODULE = "LMXAgent"


def compile_command():
    """The release build's command line for the module, as `swift build -v` prints it."""
    setup = ". scripts/lib.sh && release_build_setup && swift build \"${RELEASE_BUILD[@]}\" -v"
    out = subprocess.run(["bash", "-c", setup], cwd=lmxtools.REPO, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("the release build failed (run `make release` first):\n" + out.stderr[-2000:])
    for line in out.stdout.splitlines():
        words = shlex.split(line)
        if words and words[0].endswith("swiftc") and "-module-name" in words \
                and words[words.index("-module-name") + 1] == MODULE:
            return words
    # Up to date: nothing was compiled, so nothing printed. Touch a source and ask again.
    return None


def sil_command(words, output):
    """The module's command, emitting SIL into `output` (one thread: one output file)."""
    drop_with_value = {"-emit-module-path", "-output-file-map", "-num-threads", "-j"}
    # (And the release build's `-enforce-exclusivity=unchecked`: with it nothing is checked.)
    drop = {"-emit-dependencies", "-emit-module", "-c", "-serialize-diagnostics", "-parseable-output", "-v",
            "-incremental", "-enable-batch-mode", "-enforce-exclusivity=unchecked"}
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in drop_with_value:
            skip = True
        elif word in drop or re.fullmatch(r"-j\d+", word):
            continue
        else:
            kept.append(word)
    return kept + ["-emit-sil", "-o", output]


def dynamic_accesses(sil):
    """(property, kind) -> {function: count} for every `begin_access [...] [dynamic]`."""
    found = collections.defaultdict(collections.Counter)
    function, defined = None, {}
    with open(sil) as lines:
        for line in lines:
            start = re.match(r"^sil .*@(\S+) :", line)
            if start:
                function, defined = start.group(1), {}
                continue
            definition = re.match(r"\s*(%\d+) = (?:ref_element_addr|global_addr|ref_tail_addr)\b.*?(#[\w.]+|@\w+)", line)
            if definition:
                defined[definition.group(1)] = definition.group(2)
            access = re.search(r"begin_access \[(\w+)\] \[dynamic\][^%]*(%\d+)", line)
            if access:
                found[(defined.get(access.group(2), "?"), access.group(1))][function] += 1
    return found


def demangled(names):
    out = subprocess.run(["swift", "demangle", "--simplified"], input="\n".join(names), capture_output=True, text=True)
    return out.stdout.splitlines()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--functions", action="store_true", help="the functions each checked access is in")
    parser.add_argument("--data-path", action="store_true", help="only the data path's types; exit 1 when any is checked")
    args = parser.parse_args()
    words = compile_command()
    if words is None:
        os.utime(os.path.join(lmxtools.REPO, "Sources", MODULE, "Gateway", "DataPath", "EventRelay.swift"))
        words = compile_command()
    if words is None:
        sys.exit("the release build printed no command for %s" % MODULE)
    with tempfile.TemporaryDirectory(prefix="lmx-sil-") as directory:
        sil = os.path.join(directory, MODULE + ".sil")
        # (In the temporary directory: the compiler leaves the module's documentation files in
        # the directory it runs in.)
        out = subprocess.run(sil_command(words, sil), cwd=directory, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit("emitting SIL failed:\n" + out.stderr[-3000:])
        found = dynamic_accesses(sil)
    rows = sorted(found.items(), key=lambda item: -sum(item[1].values()))
    if args.data_path:
        rows = [row for row in rows if any("#%s." % name in row[0][0] for name in DATA_PATH)]
    print("| property | access | checked places |")
    print("|---|---|---|")
    for (prop, kind), functions in rows:
        print("| `%s` | %s | %d |" % (prop, kind, sum(functions.values())))
        if args.functions:
            for name in demangled(list(functions)):
                print("|  | | %s |" % name[:140].replace("|", "\\|"))
    if args.data_path:
        print("%d of the data path's properties checked at run time." % len(rows))
        return 1 if rows else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
