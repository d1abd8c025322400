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
# The checked-in man pages and completions must match the code; the package tests need the .deb.
scripts/gen-docs.sh --check
python3 scripts/check-docs.py
scripts/build-deb.sh
# Serial: the integration suites share one test LAN (one avahi-daemon, one bridge).
LMX_BIN_DIR="$(swift build --show-bin-path)" swift test --skip-build --no-parallel "$@"
