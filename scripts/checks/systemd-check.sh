#!/usr/bin/env bash
# Checks the Debian package under a real systemd: boots this machine's own OS in a container
# (systemd-nspawn, on a throw-away overlay of /, with a private network that has only loopback),
# installs the package there with dpkg, and reports how the service ran: started by the
# maintainer scripts, Type=notify ready with a STATUS= line, sandboxed (seccomp, no
# capabilities, NoNewPrivileges), reachable by another user, reloaded, stopped cleanly, and no
# error in its journal, and it finds a server announced over mDNS inside the container (its own
# avahi-daemon, on its own loopback). Each finding is a line "CHECK <name> ok|FAIL <detail>".
#
#   sudo scripts/checks/systemd-check.sh lmx-agent_<version>_<arch>.deb [PREVIOUS.deb]
#
# With PREVIOUS.deb, that package is installed first and the checked one over it (an upgrade).
# Either way the checked package is also installed a second time over itself while the service
# runs, as dpkg does for an upgrade: the service must come back restarted and still enabled.
#
# Exit codes: 0 every check passed, 1 a check failed, 69 it cannot run here (no root, no
# systemd-nspawn, no overlayfs). Needs the package systemd-container; no systemd on the host.
set -euo pipefail
LOG_NAME=systemd-check
. "$(dirname "$0")/../lib.sh"
[ "$(id -u)" -eq 0 ] || { log "needs root"; exit 69; }
deb=$(realpath "${1:?usage: systemd-check.sh PACKAGE.deb}")
command -v systemd-nspawn >/dev/null || { log "systemd-nspawn is missing: apt-get install systemd-container"; exit 69; }

work=$(mktemp -d /tmp/lmx-systemd-check.XXXXXX)
root="$work/root"
cleanup() {
    umount "$root" 2>/dev/null || true
    umount "$work/layers" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/layers" "$root" "$work/share/out"
# The overlay's writable layer lives on a tmpfs of its own (overlayfs refuses layers that overlap).
mount -t tmpfs -o size=2G tmpfs "$work/layers"
mkdir -p "$work/layers/upper" "$work/layers/work"
mount -t overlay overlay -o "lowerdir=/,upperdir=$work/layers/upper,workdir=$work/layers/work" "$root" ||
    { log "cannot mount an overlay of /"; exit 69; }

cp "$deb" "$work/share/lmx-agent.deb"
if [ -n "${2:-}" ]; then cp "$(realpath "$2")" "$work/share/previous.deb"; fi
cp "$(dirname "$0")/../fixtures/lmx-test-server.py" "$work/share/"
cat > "$work/share/check.sh" <<'INSIDE'
#!/bin/sh
# Inside the container, started by systemd at boot.
exec > /lmx/out/log 2>&1
check() { if [ "$2" = ok ]; then echo "CHECK $1 ok"; else echo "CHECK $1 FAIL $3"; fi; }
# Images built for containers forbid service starts while installing; a real system does not.
rm -f /usr/sbin/policy-rc.d
# The container's avahi-daemon on its loopback (the only link it has), and a short watchdog so
# that a daemon that stopped sending WATCHDOG=1 would be killed while we look.
printf '[server]\nallow-interfaces=lo\ndeny-interfaces=eth0\nuse-ipv6=no\n[wide-area]\nenable-wide-area=no\n[publish]\npublish-workstation=no\n' \
    > /etc/avahi/avahi-daemon.conf
systemctl restart avahi-daemon
mkdir -p /etc/systemd/system/lmx-agentd.service.d
printf '[Service]\nWatchdogSec=2s\n' > /etc/systemd/system/lmx-agentd.service.d/watchdog.conf
if [ -f /lmx/previous.deb ]; then
    dpkg -i /lmx/previous.deb > /lmx/out/previous.log 2>&1 && echo "PREVIOUS $(dpkg-query -W -f '${Version}' lmx-agent)"
fi
dpkg -i /lmx/lmx-agent.deb
state=""
for _ in $(seq 1 100); do
    state=$(systemctl is-active lmx-agentd)
    [ "$state" = active ] && break
    sleep 0.1
done
[ "$state" = active ] && check started ok || check started FAIL "the service is $state"
systemctl is-enabled lmx-agentd | grep -qx enabled && check enabled ok || check enabled FAIL "not enabled"
pid=$(systemctl show -p MainPID --value lmx-agentd)
status=$(systemctl show -p StatusText --value lmx-agentd)
[ -n "$status" ] && check status-text ok || check status-text FAIL "no STATUS= line"
echo "STATUS $status"
[ "$(stat -c %U "/proc/$pid")" = lmx ] && check user ok || check user FAIL "runs as $(stat -c %U "/proc/$pid")"
grep -q '^Seccomp:[[:space:]]*2' "/proc/$pid/status" && check seccomp ok || check seccomp FAIL "no seccomp filter"
grep -q '^NoNewPrivs:[[:space:]]*1' "/proc/$pid/status" && check no-new-privileges ok || check no-new-privileges FAIL ""
grep -q '^CapEff:[[:space:]]*0000000000000000' "/proc/$pid/status" && check no-capabilities ok || check no-capabilities FAIL ""
# An Opta LMX server announced over mDNS: the service finds it and makes it active.
# (the test server stops at the end of its standard input: give it one that stays open)
sleep 600 | python3 /lmx/lmx-test-server.py --bind 127.0.0.1 --port 18081 --instance boot-check > /lmx/out/server.log 2>&1 &
avahi-publish -s "Boot check" _opta-lmx._tcp 18081 path=/.well-known/opta-lmx service=opta-lmx > /dev/null 2>&1 &
url=""
for _ in $(seq 1 100); do
    url=$(runuser -u nobody -- lmx-status --url 2>/dev/null) && [ "$url" = http://127.0.0.1:18081 ] && break
    sleep 0.1
done
[ "$url" = http://127.0.0.1:18081 ] && check finds-server ok || check finds-server FAIL "active: '$url'"
# The gateway: one fixed local URL that reaches the active server, for any local user.
models=$(runuser -u nobody -- curl -s --max-time 5 http://127.0.0.1:1235/v1/models)
echo "$models" | grep -q '"test/model"' && check gateway ok || check gateway FAIL "127.0.0.1:1235 answered '$models'"
models=$(runuser -u nobody -- curl -s --max-time 5 --unix-socket /run/lmx/gateway.sock http://localhost/v1/models)
echo "$models" | grep -q '"test/model"' && check gateway-socket ok || check gateway-socket FAIL "gateway.sock answered '$models'"
env_url=$(. /run/lmx/endpoint.env && echo "$LMX_BASE_URL $LMX_GATEWAY_URL")
[ "$env_url" = "http://127.0.0.1:18081 http://127.0.0.1:1235/v1" ] && check endpoint-env ok || check endpoint-env FAIL "'$env_url'"
# journald: the lines carry sd-daemon priorities (so -p filters them) and no timestamp of their own.
sleep 0.5
notices=$(journalctl -u lmx-agentd -p notice --no-pager -o cat)
if echo "$notices" | grep -q 'Requests now go on the LAN to .* url=http://127.0.0.1:18081' && ! echo "$notices" | grep -q '^starting' &&
    ! journalctl -u lmx-agentd --no-pager -o cat | grep -Eq '^[0-9]{4}-[0-9]{2}-[0-9]{2}T'; then
    check journal-priorities ok
else
    check journal-priorities FAIL "$(echo "$notices" | head -n 3 | tr '\n' ' ')"
fi
sleep 5
[ "$(systemctl show -p NRestarts --value lmx-agentd)" = 0 ] && [ "$(systemctl show -p MainPID --value lmx-agentd)" = "$pid" ] &&
    check watchdog ok || check watchdog FAIL "restarted within 5 s under WatchdogSec=2s"
json=$(runuser -u nobody -- lmx-status --json)
echo "$json" | grep -q '"avahi":"running"' && check nobody-reads-status ok || check nobody-reads-status FAIL "$json"
[ "$(stat -c '%U %a' /var/lib/lmx/agent.db)" = "lmx 600" ] && check database ok || check database FAIL "$(stat -c '%U %a' /var/lib/lmx/agent.db)"
systemctl reload lmx-agentd && sleep 1
[ "$(systemctl is-active lmx-agentd)" = active ] && [ "$(systemctl show -p MainPID --value lmx-agentd)" = "$pid" ] &&
    check reload ok || check reload FAIL "not active with the same PID after reload"
# An upgrade: dpkg runs the maintainer scripts with the old version as $2; the service is
# restarted on the new files, stays enabled, keeps its user, its database and the config's mode.
uid=$(id -u lmx)
if dpkg -i /lmx/lmx-agent.deb > /lmx/out/upgrade.log 2>&1; then
    for _ in $(seq 1 100); do
        [ "$(systemctl is-active lmx-agentd)" = active ] && [ "$(systemctl show -p MainPID --value lmx-agentd)" != "$pid" ] && break
        sleep 0.1
    done
    after="$(systemctl is-active lmx-agentd) $(systemctl is-enabled lmx-agentd) uid=$(id -u lmx) db=$(stat -c '%U:%a' /var/lib/lmx/agent.db) config=$(stat -c '%U:%G:%a' /etc/lmx/agent.json)"
    newpid=$(systemctl show -p MainPID --value lmx-agentd)
    url=$(runuser -u nobody -- lmx-status --url --wait=5 2>/dev/null || true)
    [ "$after" = "active enabled uid=$uid db=lmx:600 config=root:lmx:640" ] && [ "$newpid" != "$pid" ] && [ "$url" = http://127.0.0.1:18081 ] &&
        check upgrade ok || check upgrade FAIL "$after, pid $pid → $newpid, active '$url'"
else
    check upgrade FAIL "dpkg -i over itself failed: $(tail -n 3 /lmx/out/upgrade.log | tr '\n' ' ')"
fi
systemctl stop lmx-agentd
[ "$(systemctl show -p Result --value lmx-agentd)" = success ] && [ ! -e /run/lmx/agent.sock ] &&
    check stop ok || check stop FAIL "result $(systemctl show -p Result --value lmx-agentd)"
journalctl -u lmx-agentd --no-pager -o cat > /lmx/out/journal
# One line is expected: libdispatch may not raise a worker thread's priority (EACCES) in an
# unprivileged process; it logs that once and carries on.
benign='Failed to set thread priority for worker thread: .* errno=13$'
if grep -Ev "$benign" /lmx/out/journal | grep -Eiq 'error|fail|denied'; then
    check journal FAIL "$(grep -Ev "$benign" /lmx/out/journal | grep -Ei 'error|fail|denied' | head -n 3 | tr '\n' ' ')"
else
    check journal ok
fi
echo DONE
systemctl poweroff
INSIDE
chmod 755 "$work/share/check.sh"
printf '[Unit]\nDescription=lmx-agent package check\nAfter=multi-user.target\n[Service]\nExecStart=/lmx/check.sh\n' \
    > "$work/share/lmx-check.service"
mkdir -p "$work/share/wants"
printf '[Unit]\nWants=lmx-check.service\n' > "$work/share/wants/lmx-check.conf"

log "booting $(. /etc/os-release && echo "$PRETTY_NAME") under systemd-nspawn (private network: loopback only)"
status=0
timeout 180 systemd-nspawn --quiet --keep-unit --register=no --link-journal=no --private-network \
    --machine="lmxcheck$$" --directory="$root" \
    --bind="$work/share:/lmx" \
    --bind-ro="$work/share/lmx-check.service:/etc/systemd/system/lmx-check.service" \
    --bind-ro="$work/share/wants:/etc/systemd/system/multi-user.target.d" \
    --boot > "$work/console.log" 2>&1 || status=$?
if ! grep -q '^DONE' "$work/share/out/log" 2>/dev/null; then
    tail -n 20 "$work/console.log" >&2
    cat "$work/share/out/log" >&2 2>/dev/null || true
    log "the container did not finish its checks (systemd-nspawn exit $status)"
    exit 1
fi
grep -E '^(CHECK|STATUS|PREVIOUS) ' "$work/share/out/log"
if grep -q '^CHECK .* FAIL' "$work/share/out/log"; then
    sed -n '/^+/!p' "$work/share/out/journal" | tail -n 20 >&2
    exit 1
fi
log "every check passed"
