# Shell helpers shared by the project's scripts. Sourced, not run.

# The release build every script makes (and `make release`): the Swift runtime linked statically,
# linked by lld with packed relative relocations (DT_RELR, glibc 2.36) and no exported symbols;
# every function in a section of its own, so the link drops the unused ones and places the ones
# lmx-agentd runs side by side (the linker script Packaging/lmx-agent-hot.ld, made by
# scripts/release/order-file.py): the kernel maps code 64 KB around each page touched, and packed code
# is fewer windows.
# Without the run-time exclusivity checks (-enforce-exclusivity=unchecked, as the standard library
# itself is built): each access to a class's stored property asked the runtime to search a
# thread-local list of the accesses in progress, 14 % of the gateway's instructions per request,
# most of them in SwiftNIO's own code (Benchmarks/README.md). Debug builds, which `make test` runs,
# keep them, so an overlapping access still traps there; the compile-time checks are unchanged.
# LMX_STATIC_STATUS=1 links lmx-status as a static PIE (Package.swift), which needs the local
# run path off (a static PIE cannot have one). `make release` builds with this list too.
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RELEASE_BUILD=(-c release --static-swift-stdlib --disable-local-rpath -Xswiftc -use-ld=lld
    -Xswiftc -enforce-exclusivity=unchecked
    -Xswiftc -Xfrontend -Xswiftc -function-sections -Xcc -ffunction-sections -Xcc -fdata-sections
    -Xlinker --no-export-dynamic -Xlinker -z -Xlinker pack-relative-relocs)
export LMX_STATIC_STATUS=1

# The commands of the multi-call binary, as links to it in the build folder $1 (the package and
# `make install` make the same links): lmx-agentd, lmx-discover, lmx-pair, lmx-notify.
MULTICALL_COMMANDS=(lmx-agentd lmx-discover lmx-pair lmx-notify)
link_commands() {
    local cmd
    for cmd in "${MULTICALL_COMMANDS[@]}"; do ln -sfn lmx-agent "$1/$cmd"; done
}

# The dependencies as resolved: "identity version" lines, sorted (resolving first if needed).
resolved_versions() {
    [ -f "$REPO_ROOT/Package.resolved" ] || (cd "$REPO_ROOT" && swift package resolve >/dev/null)
    python3 -c 'import json, sys
for p in sorted(json.load(open(sys.argv[1]))["pins"], key=lambda p: p["identity"]):
    print(p["identity"], p["state"].get("version") or p["state"].get("revision"))' "$REPO_ROOT/Package.resolved"
}

# Adds the hot-code linker script to RELEASE_BUILD when the dependencies resolved are the ones it
# was made with (Packaging/lmx-agent-hot.versions, written beside it by scripts/release/order-file.py):
# it names functions of exact dependency code. Otherwise the release links without it (the same
# program, its hot code not packed together: more resident memory, nothing else) and says so;
# `make test` fails on a stale script (PackagingTests), so it is remade before a release.
# Call after swift is on PATH, before building.
release_build_setup() {
    if [ "$(resolved_versions)" = "$(cat "$REPO_ROOT/Packaging/lmx-agent-hot.versions" 2>/dev/null)" ]; then
        RELEASE_BUILD+=(-Xlinker "$REPO_ROOT/Packaging/lmx-agent-hot.ld")
    else
        log "the dependencies resolved differ from those Packaging/lmx-agent-hot.ld was made with: linking without it (remake it: sudo python3 scripts/release/order-file.py)"
    fi
}

# What building and running need, and what the test LAN adds.
BUILD_PACKAGES=(avahi-daemon avahi-utils libavahi-client-dev libdbus-1-dev libsqlite3-dev dbus pkg-config
    libzbar-dev libpng-dev libturbojpeg0-dev libqrencode-dev)
TEST_PACKAGES=("${BUILD_PACKAGES[@]}" iproute2 python3-venv python3-dbus openssl curl zbar-tools qrencode imagemagick)
# The dashboard in a real browser (Chromium driven by chromedriver), and a recording notification
# server on a session bus for lmx-notify (python3-gi: the GLib main loop python3-dbus serves with).
TEST_PACKAGES+=(chromium chromium-driver python3-gi)
# Watching many agents: promtool checks examples/prometheus, and a real Prometheus scrapes agents
# on the test LAN (started by the tests on loopback, never as a service).
TEST_PACKAGES+=(prometheus)
# The package tests: building (dpkg-dev, debhelper, binutils' strip), checking (lintian, systemd-analyze from
# systemd; no running systemd is needed) and the man pages systemd-analyze verify looks up.
TEST_PACKAGES+=(dpkg-dev debhelper binutils lintian systemd man-db util-linux)
# ... and systemd-nspawn, which boots this machine's OS under a real systemd for the service test.
TEST_PACKAGES+=(systemd-container)
# Discovery on real networks: a site's DNS server with DNS-SD records (dnsmasq, and NSD for the zone file
# of docs/wide-area-discovery.md; both run by the tests in a namespace, never as a service), and nftables
# for the scripted failures (UDP 5353 dropped, multicast filtered on the bridge).
TEST_PACKAGES+=(dnsmasq-base nsd nftables)

log() { printf '%s: %s\n' "${LOG_NAME:-lmx}" "$*" >&2; }
die() { printf '%s: error: %s\n' "${LOG_NAME:-lmx}" "$*" >&2; exit 1; }

require_root() {
    [ "$(id -u)" -eq 0 ] || die "${1:-this} needs root (packages, D-Bus, avahi-daemon, network namespaces): run it with sudo"
}

alive() { [ -n "${1:-}" ] && [ -d "/proc/$1" ] && [ "$(ps -o stat= -p "$1" 2>/dev/null | cut -c1)" != "Z" ]; }

# Installs what is missing. With BLOCK_SERVICE_STARTS=1 (the test bed), maintainer scripts may
# not start services while installing, so a stock avahi-daemon never comes up on the real network.
install_packages() { # package...
    local missing=() blocker=""
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing: ${missing[*]}"
    if [ "${BLOCK_SERVICE_STARTS:-0}" = 1 ] && [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        blocker=/usr/sbin/policy-rc.d
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    [ -n "$blocker" ] && rm -f "$blocker"
    return 0
}

wait_for_log() { # file pattern seconds
    local i
    for ((i = 0; i < $3 * 20; i++)); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.05
    done
    return 1
}

start_system_bus() {
    if [ -S /run/dbus/system_bus_socket ] && dbus-send --system --dest=org.freedesktop.DBus \
        --type=method_call --print-reply / org.freedesktop.DBus.GetId >/dev/null 2>&1; then
        return 0
    fi
    mkdir -p /run/dbus
    rm -f /run/dbus/pid /run/dbus/system_bus_socket
    dbus-daemon --system --fork --print-pid > "$STATE/dbus-system.pid"
    log "started the system D-Bus (pid $(cat "$STATE/dbus-system.pid"))"
}

