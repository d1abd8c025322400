#!/usr/bin/env bash
# `make run`: install what is missing, build, make sure avahi-daemon is reachable, then run the
# agent, `lmx-agentd`, in the foreground until Ctrl-C. Ask it from another terminal with
# `lmx-status` (the binaries are in the path this script prints). Extra arguments go to lmx-agentd,
# e.g. `make run ARGS="--endpoint https://my-tunnel.example.com"`.
#
# With systemd, a stopped avahi-daemon is started with systemctl (it then serves your real LAN).
# Without systemd (containers, CI machines) a D-Bus and an avahi-daemon are started for this run
# and stopped at its end; that daemon uses the interfaces in LMX_AVAHI_INTERFACES (default: lo,
# so nothing leaves the machine; set e.g. LMX_AVAHI_INTERFACES=eth0 to see your LAN).
set -euo pipefail
cd "$(dirname "$0")/.."
LOG_NAME=make-run
STATE=/run/lmx-run
. scripts/lib.sh
command -v swift >/dev/null || export PATH="/opt/swift/usr/bin:$PATH"

if [ "$(id -u)" -eq 0 ]; then
    install_packages "${BUILD_PACKAGES[@]}"
else
    for p in "${BUILD_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
            die "package $p is missing: run 'sudo make run' once, or 'sudo apt-get install ${BUILD_PACKAGES[*]}'"
    done
fi

release_build_setup
swift build "${RELEASE_BUILD[@]}"
BIN="$(swift build "${RELEASE_BUILD[@]}" --show-bin-path)"
link_commands "$BIN"

started=""
cleanup() {
    if [ -n "$started" ]; then
        kill "$(cat "$STATE/avahi.pid")" 2>/dev/null || true
        [ -f "$STATE/dbus.pid" ] && kill "$(cat "$STATE/dbus.pid")" 2>/dev/null && rm -f /run/dbus/pid /run/dbus/system_bus_socket
        rm -rf "$STATE" /run/avahi-daemon/pid
    fi
}
trap cleanup EXIT

status=0
"$BIN/lmx-discover" --timeout 0.2 >/dev/null 2>&1 || status=$?
if [ "$status" -eq 69 ]; then
    [ "$(id -u)" -eq 0 ] || die "avahi-daemon is not running: start it with 'sudo systemctl start avahi-daemon', or run 'sudo make run'"
    if [ -d /run/systemd/system ]; then
        log "starting avahi-daemon with systemctl"
        systemctl start avahi-daemon
    else
        interfaces=${LMX_AVAHI_INTERFACES:-lo}
        mkdir -p "$STATE" /run/avahi-daemon
        start_system_bus
        [ -f "$STATE/dbus-system.pid" ] && mv "$STATE/dbus-system.pid" "$STATE/dbus.pid"
        deny=""
        [ "$interfaces" = lo ] && deny="deny-interfaces=eth0"
        printf '[server]\nuse-ipv6=no\nallow-interfaces=%s\n%s\nratelimit-interval-usec=0\n[wide-area]\nenable-wide-area=no\n[publish]\npublish-workstation=no\npublish-hinfo=no\n' \
            "$interfaces" "$deny" > "$STATE/avahi-daemon.conf"
        rm -f /run/avahi-daemon/pid
        avahi-daemon --no-drop-root --no-chroot -f "$STATE/avahi-daemon.conf" > "$STATE/avahi.log" 2>&1 &
        echo $! > "$STATE/avahi.pid"
        started=yes
        wait_for_log "$STATE/avahi.log" "Server startup complete" 10 || { cat "$STATE/avahi.log" >&2; die "avahi-daemon did not start"; }
        log "no systemd here: started avahi-daemon on '$interfaces' for this run (pid $(cat "$STATE/avahi.pid")); set LMX_AVAHI_INTERFACES to use others"
    fi
fi

log "starting lmx-agentd (Ctrl-C to stop); in another terminal: $BIN/lmx-status"
"$BIN/lmx-agentd" "$@" || true
