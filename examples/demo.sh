#!/usr/bin/env bash
# lmx-agent live, on one machine, in under a minute:
#
#   1. discovery   two Opta LMX servers ("Studio" and "Office") announce themselves over mDNS and
#                  the agent picks one;
#   2. pairing     Studio's Cloudflare-style tunnel (a local HTTPS server with its own CA) is
#                  paired from a v1 code, and waits as a standby;
#   3. failover    the LAN goes away (both servers stop, their announcements are withdrawn) and the
#                  agent moves to the tunnel;
#   4. return      the servers come back and the agent returns to the LAN once they have stayed
#                  healthy for its stability window (10 s).
#
# `lmx-status --watch` prints every change as it happens. Everything runs in a private network
# namespace that has only its own loopback: a private D-Bus and avahi-daemon, the servers
# (scripts/fixtures/lmx-test-server.py), the agent. Nothing reaches the real network, and everything is
# stopped and deleted at the end, also on Ctrl-C.
#
#   sudo examples/demo.sh          (binaries: LMX_BIN_DIR, else .build/release, .build/debug, /usr/bin)
#
# Needs root (namespaces), avahi-daemon, avahi-utils, dbus, python3, openssl, iproute2.
# Exit codes: 0 the demonstration ran, 1 a step did not happen in time (the agent's log is shown),
# 69 something it needs is missing.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
die() { printf 'demo: %s\n' "$*" >&2; exit "${2:-69}"; }

if [ -z "${LMX_DEMO_INSIDE:-}" ]; then
    [ "$(id -u)" -eq 0 ] || die "it needs root for a private network namespace: sudo $0"
    for tool in avahi-daemon avahi-publish dbus-daemon python3 openssl ip unshare; do
        command -v "$tool" >/dev/null || die "$tool is missing: sudo apt-get install avahi-daemon avahi-utils dbus python3 openssl iproute2"
    done
    BIN=${LMX_BIN_DIR:-}
    if [ -z "$BIN" ]; then
        for dir in "$REPO/.build/release" "$REPO/.build/debug" /usr/bin; do
            [ -x "$dir/lmx-agentd" ] && { BIN=$dir; break; }
        done
    fi
    [ -n "$BIN" ] && [ -x "$BIN/lmx-agentd" ] || die "no lmx-agentd found: build it (make release) or install the package"
    # A new network namespace (only a loopback of its own) and mount namespace (a private
    # /run/avahi-daemon, whose path avahi-daemon hard-codes).
    exec env LMX_DEMO_INSIDE=1 LMX_BIN_DIR="$BIN" unshare --net --mount --fork -- "$0" "$@"
fi

BIN=$LMX_BIN_DIR
WORK=$(mktemp -d /tmp/lmx-demo.XXXXXX)
PIDS=()
START=$(date +%s.%N)
elapsed() { awk -v s="$START" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f s", n - s }'; }

cleanup() {
    local pid left
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    # Whatever does not stop within 3 s (a process started with SIGTERM blocked) is killed.
    for _ in $(seq 1 30); do
        left=""
        for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && left="$left $pid"; done
        [ -z "$left" ] && break
        sleep 0.1
    done
    for pid in $left; do kill -KILL "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    umount /run/avahi-daemon 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() {
    printf '\ndemo: %s\n--- the agent'"'"'s log ---\n' "$1" >&2
    tail -n 30 "$WORK/agent.log" >&2 || true
    exit 1
}

mount --make-rprivate /
ip link set lo up
mkdir -p /run/avahi-daemon
mount -t tmpfs tmpfs /run/avahi-daemon

# A private system bus and an avahi-daemon on this namespace's loopback.
cat > "$WORK/bus.conf" <<CONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=$WORK/bus</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/><allow own="*"/><allow send_type="method_call"/>
    <allow send_destination="*"/><allow receive_sender="*"/>
  </policy>
</busconfig>
CONF
export DBUS_SYSTEM_BUS_ADDRESS="unix:path=$WORK/bus"
dbus-daemon --config-file="$WORK/bus.conf" --nofork --nopidfile > "$WORK/dbus.log" 2>&1 &
PIDS+=($!)
printf '[server]\nhost-name=lmx-demo\nuse-ipv6=no\nallow-interfaces=lo\ndeny-interfaces=eth0\nratelimit-interval-usec=0\n[wide-area]\nenable-wide-area=no\n[publish]\npublish-hinfo=no\npublish-workstation=no\n' \
    > "$WORK/avahi.conf"
for _ in $(seq 1 50); do [ -S "$WORK/bus" ] && break; sleep 0.1; done
avahi-daemon --no-drop-root --no-chroot --no-rlimits -f "$WORK/avahi.conf" > "$WORK/avahi.log" 2>&1 &
PIDS+=($!)

# A certificate authority and a certificate for localhost: the tunnel's public certificate.
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=lmx demo CA" \
    -keyout "$WORK/ca.key" -out "$WORK/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout "$WORK/tunnel.key" -out "$WORK/tunnel.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$WORK/ext.cnf"
openssl x509 -req -in "$WORK/tunnel.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" -CAcreateserial \
    -days 1 -extfile "$WORK/ext.cnf" -out "$WORK/tunnel.pem" 2>/dev/null

# The servers: each reads commands (dead, alive, ...) from a FIFO held open on a descriptor.
server() { # name fd port instance [extra args]
    local name=$1 fd=$2 port=$3 instance=$4
    shift 4
    mkfifo "$WORK/$name.in"
    python3 "$REPO/scripts/fixtures/lmx-test-server.py" --bind 127.0.0.1 --port "$port" --instance "$instance" "$@" \
        < "$WORK/$name.in" > "$WORK/$name.log" 2>&1 &
    PIDS+=($!)
    eval "exec $fd>\"$WORK/$name.in\""
}
server studio 5 18081 studio-demo
server office 6 18082 office-demo
server tunnel 7 18443 studio-demo --tls "$WORK/tunnel.pem" "$WORK/tunnel.key"

publish() { # name port
    avahi-publish -s "$1" _opta-lmx._tcp "$2" path=/.well-known/opta-lmx service=opta-lmx > /dev/null 2>&1 &
    PIDS+=($!)
    eval "PUBLISH_$1=$!"
}
for _ in $(seq 1 100); do grep -q "Server startup complete" "$WORK/avahi.log" && break; sleep 0.1; done
grep -q "Server startup complete" "$WORK/avahi.log" || fail "avahi-daemon did not start"

# The agent: its own socket, database and config.
printf '{"log_level": "notice"}\n' > "$WORK/agent.json"
SOCK="$WORK/agent.sock"
"$BIN/lmx-agentd" --socket "$SOCK" --db "$WORK/agent.db" --config "$WORK/agent.json" \
    --extra-ca-file "$WORK/ca.pem" > "$WORK/agent.log" 2>&1 &
PIDS+=($!)
export LMX_SOCKET=$SOCK

active_url() { "$BIN/lmx-status" --url 2>/dev/null || true; }
wait_for() { # seconds description test-command...
    local seconds=$1 what=$2
    shift 2
    local deadline=$(( $(date +%s) + seconds ))
    until "$@"; do
        [ "$(date +%s)" -lt "$deadline" ] || fail "$what did not happen within $seconds s"
        sleep 0.1
    done
}
on_lan() { case "$(active_url)" in http://*) return 0 ;; *) return 1 ;; esac; }
on_wan() { case "$(active_url)" in https://*) return 0 ;; *) return 1 ;; esac; }

wait_for 10 "the agent's start" test -S "$SOCK"
say "lmx-status --watch follows the agent: one line per change"
"$BIN/lmx-status" --watch &
PIDS+=($!)

say "1. Discovery: Studio and Office announce themselves over mDNS"
publish Studio 18081
publish Office 18082
wait_for 15 "discovery" on_lan
echo "discovered: the agent uses $(active_url) ($(elapsed) after the start)"
"$BIN/lmx-status" | sed 's/^/    /' || true

say "2. Pairing: import Studio's tunnel from its code"
# The code names Studio's LAN address (lan=): from now on only what the user or Studio's tunnel
# vouches for is used, so Office, a mere announcer, is listed but no longer chosen.
code='opta-lmx://pair?v=1&name=Studio&url=https%3A%2F%2Flocalhost%3A18443&instance=studio-demo&lan=127.0.0.1%3A18081&key=demo-admin-key'
echo "$ echo '${code%%&key=*}&key=…' | lmx-pair -"
echo "$code" | "$BIN/lmx-pair" --socket "$SOCK" --db "$WORK/agent.db" --probe --probe-timeout 10 - | sed 's/^/    /'

say "3. The LAN goes away: both servers stop and their announcements are withdrawn"
t0=$(date +%s.%N)
echo dead >&5
echo dead >&6
kill "$PUBLISH_Studio" "$PUBLISH_Office"
wait_for 15 "failover to the tunnel" on_wan
t1=$(date +%s.%N)
echo "failover to WAN: $(active_url) after $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f s", b - a }')"

say "4. Back on the LAN: the servers return; the agent waits for its stability window (10 s)"
t0=$(date +%s.%N)
echo alive >&5
echo alive >&6
publish Studio 18081
publish Office 18082
wait_for 30 "the return to the LAN" on_lan
t1=$(date +%s.%N)
echo "back on the LAN: $(active_url) after $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f s", b - a }')"
"$BIN/lmx-status" | sed 's/^/    /' || true

say "Done in $(elapsed): discovery, failover to WAN and return to LAN. Cleaning up."
