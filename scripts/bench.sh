#!/usr/bin/env bash
# `make bench`: release build, test LAN up, discovery and agent benchmarks, test LAN down.
# Writes the tables to Benchmarks/results-discovery.md, results-agent.md, results-pair.md and
# results-proxy.md, results-instructions.md and results-footprint.md (copied into Benchmarks/README.md
# by hand). BENCH=agent, discovery, pair, proxy, idle, instructions or footprint runs only one of them.
set -euo pipefail
cd "$(dirname "$0")/.."
LOG_NAME=make-bench
. scripts/lib.sh
require_root "make bench"
command -v swift >/dev/null || export PATH="/opt/swift/usr/bin:$PATH"
trap 'scripts/testbed.sh down' EXIT
install_packages time hyperfine
# nginx (the reverse proxy the gateway is compared with) and wrk (its load); nginx's own service
# is never started: the benchmark runs its own on loopback and stops it by PID.
BLOCK_SERVICE_STARTS=1 install_packages nginx wrk
# valgrind: the instructions each proxy runs per request (callgrind), steadier than time.
install_packages valgrind
scripts/testbed.sh up
release_build_setup
swift build "${RELEASE_BUILD[@]}"
link_commands .build/release
case "${BENCH:-all}" in
all | discovery) BENCH_RESULTS=Benchmarks/results-discovery.md python3 Benchmarks/discovery_bench.py ;;
esac
case "${BENCH:-all}" in
all | pair) BENCH_RESULTS=Benchmarks/results-pair.md LMX_BIN_DIR=.build/release python3 Benchmarks/pair_bench.py ;;
esac
case "${BENCH:-all}" in
all | agent) BENCH_RESULTS=Benchmarks/results-agent.md python3 Benchmarks/agent_bench.py ;;
esac
case "${BENCH:-all}" in
all | footprint) scripts/build-deb.sh && BENCH_RESULTS=Benchmarks/results-footprint.md python3 Benchmarks/footprint_bench.py ;;
esac
case "${BENCH:-all}" in
all | proxy) BENCH_RESULTS=Benchmarks/results-proxy.md python3 Benchmarks/proxy_bench.py ;;
esac
case "${BENCH:-all}" in
all | idle) LMX_BIN_DIR=.build/release python3 Benchmarks/idle_cost_bench.py | tee Benchmarks/results-idle.jsonl ;;
esac
case "${BENCH:-all}" in
all | instructions) BENCH_RESULTS=Benchmarks/results-instructions.md python3 Benchmarks/instructions_bench.py ;;
esac
