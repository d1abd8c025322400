#!/usr/bin/env bash
# `make bench`: release build, test LAN up, discovery benchmark, test LAN down.
# Writes the table to Benchmarks/results-discovery.md (copy it into Benchmarks/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
LOG_NAME=make-bench
. scripts/lib.sh
require_root "make bench"
command -v swift >/dev/null || export PATH="/opt/swift/usr/bin:$PATH"
trap 'scripts/testbed.sh down' EXIT
install_packages time
scripts/testbed.sh up
swift build -c release --static-swift-stdlib --product lmx-discover
BENCH_RESULTS="${BENCH_RESULTS:-Benchmarks/results-discovery.md}" python3 Benchmarks/discovery_bench.py
