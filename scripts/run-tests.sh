#!/usr/bin/env bash
# `make test`: bring up the test LAN (packages, D-Bus, avahi-daemons, namespace hosts), build,
# run every test, and tear the LAN down by PID whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
LOG_NAME=make-test
. scripts/lib.sh
require_root "make test"
command -v swift >/dev/null || export PATH="/opt/swift/usr/bin:$PATH"

trap 'scripts/testbed.sh down' EXIT
scripts/testbed.sh up
swift build --build-tests
# The tests run the multi-call binary through its links, as the package installs it.
link_commands "$(swift build --show-bin-path)"
# The checked-in man pages and completions must match the code; the package tests need the .deb.
scripts/gen-docs.sh --check
python3 scripts/checks/check-docs.py
# The Swift, formatted and linted by .swift-format's rules (swift-format from the toolchain).
swift format lint --strict --recursive --parallel Sources Tests Package.swift
# The project's Python (test fixtures, checks, benchmarks, examples), by ruff.toml's rules.
"${LMX_TESTBED_VENV:-.build-testbed/venv}/bin/ruff" check scripts Benchmarks examples
scripts/build-deb.sh
# Serial: the integration suites share one test LAN (one avahi-daemon, one bridge).
log=".build/test-output.log"
status=0
LMX_BIN_DIR="$(swift build --show-bin-path)" swift test --skip-build --no-parallel "$@" 2>&1 | tee "$log" || status=$?
if [ "$status" -ne 0 ]; then
    # The end of a long log is what a CI page shows: say there what failed, and if the test
    # process crashed, in which test and where.
    {
        echo "---- make test: summary of the failure (full log: $log) ----"
        grep -E '^✘ Test .* (recorded an issue|failed)' "$log" | cut -c1-300 | tail -8 || true
        # (Cases of parameterized tests report only as a whole: left out.)
        started=$(grep -E '^◇ Test .* started\.$' "$log" | grep -v '^◇ Test case ' | sed -E 's/^◇ Test (.*) started\.$/\1/' || true)
        while IFS= read -r name; do
            [ -n "$name" ] || continue
            grep -qF "Test $name passed" "$log" || grep -qF "Test $name failed" "$log" || echo "unfinished (running when the process ended): $name"
        done <<<"$started" | tail -4
        grep -E 'Fatal error|Program crashed|Thread [0-9]+ crashed' "$log" | cut -c1-200 | head -3 || true
        # The crashed thread's frames in our own code (file:line).
        grep -E '^[0-9]+ .*(Sources|Tests)/[A-Za-z/_-]+\.swift:[0-9]+' "$log" | sed -E 's/^([0-9]+) .* in (.*) at .*\/((Sources|Tests)\/.*)$/\1 \2 at \3/' | cut -c1-200 | head -6 || true
    } >&2
    exit "$status"
fi
