#!/usr/bin/env bash
# The lmx-agent test LAN: a real system D-Bus, a real avahi-daemon limited to loopback and a
# test bridge, and network-namespace hosts on that bridge, each a real LAN host.
#
#   scripts/testbed.sh up                 install what is missing, start everything (idempotent)
#   scripts/testbed.sh down               stop everything this script started, by PID
#   scripts/testbed.sh status             print the test bed's environment file
#   scripts/testbed.sh stop-avahi NAME    NAME is root, h1 or h2
#   scripts/testbed.sh start-avahi NAME
#   scripts/testbed.sh restart-avahi NAME
#   scripts/testbed.sh reload-avahi NAME  SIGHUP: re-read static service files
#   scripts/testbed.sh link hN up|down    cut or restore a namespace host's link (no goodbye)
#   scripts/testbed.sh roam away|home     move h4 off the test LAN to another subnet, or back
#   scripts/testbed.sh publish-bulk N PREFIX  publish N services "PREFIX 001".. from host h2
#   scripts/testbed.sh unpublish-bulk     withdraw them
#   scripts/testbed.sh site up|down       a routed second subnet for wide-area discovery (below)
#
# Network rule: no daemon started here ever touches eth0. Every avahi config sets
# allow-interfaces to loopback or test links only, deny-interfaces=eth0, no wide-area.
# LMX_TESTBED_OBJECTS_MAX=N (with restart-avahi root) lowers avahi-daemon's objects-per-client-max.
# LMX_TESTBED_IPV6=yes also runs mDNS over IPv6 (link-local) on the root and h2 daemons, still
# only on lo and the test links; off by default because dual-stack publishers make
# avahi-browse's own resolutions racy, which the comparison tests rely on.
# Hosts:
#   root  this machine, avahi-daemon on lo + lmxbr0 (10.254.0.1), the system bus
#   h1    namespace lmxh1, 10.254.0.11, own avahi-daemon and D-Bus bus
#   h2    namespace lmxh2, 10.254.0.12, own avahi-daemon and D-Bus bus, static services dir
#   h3    namespace lmxh3, 10.254.0.13, a D-Bus bus with no avahi-daemon, zeroconf publishers
#   h4    namespace lmxh4, a roaming client with two links: lan0 on the test LAN (10.254.0.14)
#         and wan0 (10.253.0.2) to this machine's 10.253.0.1, where the tunnel stand-ins listen;
#         own avahi-daemon (lan0 only) and D-Bus bus (where a logind stand-in may send signals)
#   site  (`site up`, made by the tests that need it and removed by `site down`): a router,
#         namespace lmxrt, on the bridge as 10.254.0.2 and on 10.252.0.1 towards namespace
#         lmxs1 (10.252.0.2), a host on another subnet: IP is routed between them, multicast is
#         not. h4 gets a route to 10.252.0.0/24 through the router and /etc/netns/lmxh4/resolv.conf
#         naming the router as its DNS server (the tests run dnsmasq there with the site's zone),
#         so nothing in h4 asks this machine's own resolvers.
set -euo pipefail

STATE=${LMX_TESTBED_DIR:-/run/lmx-testbed}
BRIDGE=lmxbr0
SUBNET=10.254.0
WAN_SUBNET=10.253.0
AWAY_SUBNET=10.77.0
REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=${LMX_TESTBED_VENV:-$REPO/.build-testbed/venv}

LOG_NAME=testbed
BLOCK_SERVICE_STARTS=1
. "$(dirname "$0")/lib.sh"

private_bus_config() { # dir
    cat > "$1/dbus.conf" <<EOF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=$1/bus</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_type="method_call"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
EOF
}

start_private_bus() { # host
    local dir="$STATE/$1"
    alive "$(cat "$dir/dbus.pid" 2>/dev/null)" && return 0
    rm -f "$dir/bus"
    private_bus_config "$dir"
    dbus-daemon --config-file="$dir/dbus.conf" --fork --print-pid > "$dir/dbus.pid"
}

avahi_config() { # host interfaces use-ipv6
    mkdir -p "$STATE/$1"
    cat > "$STATE/$1/avahi-daemon.conf" <<EOF
[server]
host-name=lmx-testbed-$1
use-ipv4=yes
use-ipv6=$3
allow-interfaces=$2
deny-interfaces=eth0
enable-dbus=yes
ratelimit-interval-usec=0
ratelimit-burst=0
${LMX_TESTBED_OBJECTS_MAX:+objects-per-client-max=$LMX_TESTBED_OBJECTS_MAX}

[wide-area]
enable-wide-area=no

[publish]
publish-hinfo=no
publish-workstation=no
publish-addresses=yes
# Without IPv6 mDNS, publish no AAAA records either (avahi's default sends them over IPv4, and a
# resolver asking for any family then gets a link-local address at random).
publish-aaaa-on-ipv4=$3

[reflector]
enable-reflector=no

[rlimits]
EOF
}

start_avahi() { # host
    local h=$1 dir="$STATE/$1"
    alive "$(cat "$dir/avahi.pid" 2>/dev/null)" && return 0
    mkdir -p "$dir"; : > "$dir/avahi.log"
    case "$h" in
    root)
        if [ -f /run/avahi-daemon/pid ] && alive "$(cat /run/avahi-daemon/pid)"; then
            die "an avahi-daemon not started by this test bed is running (pid $(cat /run/avahi-daemon/pid)); stop it first: the tests need one limited to lo and $BRIDGE"
        fi
        mkdir -p /run/avahi-daemon
        rm -f /run/avahi-daemon/pid
        avahi_config root "lo,$BRIDGE" "${LMX_TESTBED_IPV6:-no}"
        avahi-daemon --no-drop-root --no-chroot --no-rlimits -f "$dir/avahi-daemon.conf" \
            >> "$dir/avahi.log" 2>&1 &
        echo $! > "$dir/avahi.pid"
        ;;
    h1 | h2 | h4)
        avahi_config "$h" lan0 "$([ "$h" = h2 ] && echo "${LMX_TESTBED_IPV6:-no}" || echo no)"
        mkdir -p "$dir/services"
        # ip netns exec gives the daemon a mount namespace of its own: a private
        # /run/avahi-daemon (its pid file is hard-coded) and a private static services dir.
        DBUS_SYSTEM_BUS_ADDRESS="unix:path=$dir/bus" ip netns exec "lmx$h" sh -c \
            "mount -t tmpfs tmpfs /run/avahi-daemon && mount --bind '$dir/services' /etc/avahi/services && exec avahi-daemon --no-drop-root --no-chroot --no-rlimits -f '$dir/avahi-daemon.conf'" \
            >> "$dir/avahi.log" 2>&1 &
        echo $! > "$dir/avahi.pid"
        ;;
    *) die "unknown host '$h' (root, h1, h2 or h4)" ;;
    esac
    wait_for_log "$dir/avahi.log" "Server startup complete" 10 ||
        { cat "$dir/avahi.log" >&2; die "avahi-daemon for $h did not start"; }
}

stop_pidfile() { # file
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 0
    if alive "$pid"; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 40); do alive "$pid" || break; sleep 0.05; done
        alive "$pid" && kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$1"
}

stop_avahi() { # host
    stop_pidfile "$STATE/$1/avahi.pid"
    [ "$1" = root ] && rm -f /run/avahi-daemon/pid
    return 0
}

make_network() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        ip addr add "$SUBNET.1/24" dev "$BRIDGE"
        echo 0 > "/sys/class/net/$BRIDGE/bridge/multicast_snooping" 2>/dev/null || true
        ip link set "$BRIDGE" up
    fi
    local i
    for i in 1 2 3 4; do
        if [ -e "/run/netns/lmxh$i" ]; then
            # Half torn down (its veth pair gone): made again whole, its avahi-daemon with it.
            ip link show "lmxv$i" >/dev/null 2>&1 && continue
            [ "$i" = 3 ] || stop_avahi "h$i"
            ip netns delete "lmxh$i"
        fi
        ip netns add "lmxh$i"
        ip link add "lmxv$i" type veth peer name lan0 netns "lmxh$i"
        ip link set "lmxv$i" master "$BRIDGE" up
        ip -n "lmxh$i" addr add "$SUBNET.1$i/24" dev lan0
        ip -n "lmxh$i" link set lo up
        ip -n "lmxh$i" link set lan0 up
        ip -n "lmxh$i" route add 224.0.0.0/4 dev lan0 2>/dev/null || true
        mkdir -p "$STATE/h$i"
    done
    # h4's second link: the way to the tunnels, whatever happens to the LAN.
    if ! ip link show lmxw4 >/dev/null 2>&1 || ! ip -n lmxh4 link show wan0 >/dev/null 2>&1; then
        ip link delete lmxw4 2>/dev/null || true
        ip link add lmxw4 type veth peer name wan0 netns lmxh4
        ip addr add "$WAN_SUBNET.1/24" dev lmxw4
        ip link set lmxw4 up
        ip -n lmxh4 addr add "$WAN_SUBNET.2/24" dev wan0
        ip -n lmxh4 link set wan0 up
    fi
    # A run stopped midway (a killed CI job, a test cut off between `link h1 down` and `up`, or
    # between `roam away` and `home`) leaves namespaces that `up` reuses: put every host back on
    # the bridge with its link up and its own address, h4 home.
    local addresses
    for i in 1 2 3; do
        ip link set "lmxv$i" master "$BRIDGE" up
        ip -n "lmxh$i" link set lan0 up
        addresses=$(ip -n "lmxh$i" -o -4 addr show dev lan0)
        [[ $addresses == *"inet $SUBNET.1$i/"* ]] || ip -n "lmxh$i" addr add "$SUBNET.1$i/24" dev lan0
    done
    ip link set lmxv4 up
    ip -n lmxh4 link set lan0 up
    roam home
}

SITE_SUBNET=10.252.0

site() { # up|down
    case "$1" in
    up)
        if [ ! -e /run/netns/lmxrt ] || ! ip link show lmxvr >/dev/null 2>&1 || [ ! -e /run/netns/lmxs1 ]; then
            site down
            ip netns add lmxrt
            ip netns add lmxs1
            ip link add lmxvr type veth peer name lan0 netns lmxrt
            ip link set lmxvr master "$BRIDGE" up
            # One fixed hardware address for the router on every `site up`: a new random one
            # behind the same IPv4 address leaves h4's neighbour entry pointing at a link that
            # is gone (REACHABLE while TCP confirms it), and h4's DNS questions vanish for the
            # ~30 s the kernel takes to notice.
            ip -n lmxrt link set lan0 address 02:6c:6d:78:72:02
            ip -n lmxrt addr add "$SUBNET.2/24" dev lan0
            ip -n lmxrt link set lo up
            ip -n lmxrt link set lan0 up
            ip -n lmxrt link add far0 type veth peer name lan0 netns lmxs1
            ip -n lmxrt addr add "$SITE_SUBNET.1/24" dev far0
            ip -n lmxrt link set far0 up
            ip -n lmxs1 addr add "$SITE_SUBNET.2/24" dev lan0
            ip -n lmxs1 link set lo up
            ip -n lmxs1 link set lan0 up
            ip -n lmxs1 route add default via "$SITE_SUBNET.1"
            # Forwarding in the router's namespace only; no multicast routing at all.
            ip netns exec lmxrt sysctl -qw net.ipv4.ip_forward=1
        fi
        ip -n lmxh4 route replace "$SITE_SUBNET.0/24" via "$SUBNET.2" dev lan0
        ip -n lmxh4 neigh flush to "$SUBNET.2" 2>/dev/null || true
        mkdir -p /etc/netns/lmxh4
        printf 'nameserver %s\nsearch site.test\noptions timeout:1 attempts:2\n' "$SUBNET.2" > /etc/netns/lmxh4/resolv.conf
        ;;
    down)
        [ -e /run/netns/lmxh4 ] && ip -n lmxh4 route del "$SITE_SUBNET.0/24" 2>/dev/null || true
        rm -rf /etc/netns/lmxh4
        [ -e /run/netns/lmxs1 ] && ip netns delete lmxs1
        [ -e /run/netns/lmxrt ] && ip netns delete lmxrt
        ip link show lmxvr >/dev/null 2>&1 && { ip link delete lmxvr 2>/dev/null || ! ip link show lmxvr >/dev/null 2>&1; }
        true
        ;;
    *) die "usage: $0 site up|down" ;;
    esac
}

# h4 leaves home for another network (its LAN port off the bridge, its address on another
# subnet, a default route to a router that never answers), or comes back. Each side is one
# batch, so the change reaches the kernel as it does when a laptop changes Wi-Fi networks.
roam() { # away|home|home-address|home-address-first|cut|link-back
    case "$1" in
    away)
        ip link set lmxv4 nomaster
        printf 'addr del %s.14/24 dev lan0\naddr add %s.14/24 dev lan0\nroute add default via %s.1 dev lan0\n' \
            "$SUBNET" "$AWAY_SUBNET" "$AWAY_SUBNET" | ip -n lmxh4 -batch -
        ;;
    home-address)
        # Undone in reverse, the link still off the bridge (`roam link-back` attaches it): the
        # route, then the address.
        printf 'route del default\naddr del %s.14/24 dev lan0\naddr add %s.14/24 dev lan0\n' \
            "$AWAY_SUBNET" "$SUBNET" | ip -n lmxh4 -batch -
        ;;
    home-address-first)
        # Its mirror: the address first, then the route, the link still off the bridge.
        printf 'addr del %s.14/24 dev lan0\naddr add %s.14/24 dev lan0\n' "$AWAY_SUBNET" "$SUBNET" |
            ip -n lmxh4 -batch -
        ip -n lmxh4 route del default 2>/dev/null || true
        ;;
    cut)
        # A black hole: h4's LAN port off the bridge, nothing else changed (no carrier lost, no
        # address or route gone): packets to the LAN vanish (`roam link-back` ends it).
        ip link set lmxv4 nomaster
        ;;
    link-back)
        ip link set lmxv4 master "$BRIDGE"
        ;;
    home)
        ip link set lmxv4 master "$BRIDGE"
        # Also when already home (tests bring h4 home whatever happened): errors are expected.
        printf 'route del default\naddr del %s.14/24 dev lan0\naddr add %s.14/24 dev lan0\n' \
            "$AWAY_SUBNET" "$SUBNET" | ip -n lmxh4 -force -batch - 2>/dev/null || true
        # Read whole, then matched: with pipefail, `ip … | grep -q` fails when grep stops reading
        # before ip has written its last line (ip dies of SIGPIPE).
        local addresses
        addresses=$(ip -n lmxh4 -o -4 addr show dev lan0)
        [[ $addresses == *"inet $SUBNET.14/"* ]] || die "h4 did not get $SUBNET.14 back (lan0: ${addresses:-no IPv4 address})"
        ;;
    *) die "roam away|home|home-address|home-address-first|cut|link-back" ;;
    esac
}

# A test certificate authority and a server certificate for 127.0.0.1 / localhost / tunnel.lmx.test
# (the stand-in for a Cloudflare tunnel's public certificate) and for host h1's address (an HTTPS
# LAN endpoint), trusted only through --extra-ca-file.
make_tls() {
    local dir="$STATE/tls"
    [ -s "$dir/tunnel.pem" ] && grep -q 'h4' "$dir/ext.cnf" 2>/dev/null && return 0
    mkdir -p "$dir"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=lmx test CA" \
        -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=tunnel.lmx.test" \
        -keyout "$dir/tunnel.key" -out "$dir/tunnel.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:tunnel.lmx.test,IP:%s.11,IP:%s.1\n# h1, the tunnels seen from h4\n' \
        "$SUBNET" "$WAN_SUBNET" > "$dir/ext.cnf"
    openssl x509 -req -in "$dir/tunnel.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
        -days 2 -extfile "$dir/ext.cnf" -out "$dir/tunnel.pem" 2>/dev/null
    # A second, untrusted certificate: what a man in the middle would present.
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=tunnel.lmx.test" \
        -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
        -keyout "$dir/rogue.key" -out "$dir/rogue.pem" 2>/dev/null
}

# Cut or restore host hN's link on the bridge: packets vanish, nobody says goodbye.
link() { # h1|h2|h3 up|down
    local i=${1#h}
    ip link set "lmxv$i" "$2"
}

make_venv() {
    # zeroconf publishes arbitrary records; PyYAML and jsonschema check the daemon's answers
    # against docs/openapi.yaml; prometheus-client's parser checks /metrics; the official openai
    # SDK is the real client the gateway is tried with; ruff checks the project's own Python.
    [ -x "$VENV/bin/python" ] && [ -x "$VENV/bin/ruff" ] &&
        "$VENV/bin/python" -c 'import zeroconf, yaml, jsonschema, prometheus_client, openai, anthropic' 2>/dev/null && return 0
    log "creating the test venv at $VENV (zeroconf, PyYAML, jsonschema, prometheus-client, openai, anthropic, ruff)"
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q 'zeroconf>=0.131' 'PyYAML>=6' 'jsonschema>=4.18' 'prometheus-client>=0.17' 'openai==2.8.1' 'anthropic==0.75.0' 'ruff==0.14.14'
}

write_env() {
    cat > "$STATE/env" <<EOF
LMX_TESTBED_DIR=$STATE
LMX_TESTBED_REPO=$REPO
LMX_TESTBED_BRIDGE=$BRIDGE
LMX_TESTBED_ROOT_ADDR=$SUBNET.1
LMX_TESTBED_ROOT_BUS=unix:path=/run/dbus/system_bus_socket
LMX_TESTBED_H1_NS=lmxh1
LMX_TESTBED_H1_ADDR=$SUBNET.11
LMX_TESTBED_H1_BUS=unix:path=$STATE/h1/bus
LMX_TESTBED_H2_NS=lmxh2
LMX_TESTBED_H2_ADDR=$SUBNET.12
LMX_TESTBED_H2_BUS=unix:path=$STATE/h2/bus
LMX_TESTBED_H2_SERVICES=$STATE/h2/services
LMX_TESTBED_H3_NS=lmxh3
LMX_TESTBED_H3_ADDR=$SUBNET.13
LMX_TESTBED_H4_NS=lmxh4
LMX_TESTBED_H4_ADDR=$SUBNET.14
LMX_TESTBED_H4_BUS=unix:path=$STATE/h4/bus
LMX_TESTBED_H4_TUNNEL_ADDR=$WAN_SUBNET.1
LMX_TESTBED_NO_AVAHI_BUS=unix:path=$STATE/h3/bus
LMX_TESTBED_PYTHON=$VENV/bin/python
LMX_TESTBED_SCRIPT=$REPO/scripts/testbed.sh
LMX_TESTBED_TLS=$STATE/tls
EOF
}

up() {
    require_root "the test LAN"
    install_packages "${TEST_PACKAGES[@]}"
    mkdir -p "$STATE"
    start_system_bus
    make_network
    start_private_bus h1
    start_private_bus h2
    start_private_bus h3
    start_private_bus h4
    start_avahi root
    start_avahi h1
    start_avahi h2
    start_avahi h4
    make_venv
    make_tls
    write_env
    log "up: root avahi on lo,$BRIDGE; hosts lmxh1 $SUBNET.11, lmxh2 $SUBNET.12, lmxh3 $SUBNET.13, lmxh4 $SUBNET.14 + $WAN_SUBNET.2 ($STATE/env)"
}

down() {
    require_root
    [ -d "$STATE" ] || return 0
    # Publishers the tests left behind (they record their PIDs here).
    local f
    for f in "$STATE"/publishers/*.pid; do [ -e "$f" ] && stop_pidfile "$f"; done
    for h in h1 h2 h4 root; do stop_avahi "$h"; done
    site down
    for h in h1 h2 h3 h4; do stop_pidfile "$STATE/$h/dbus.pid"; done
    if [ -f "$STATE/dbus-system.pid" ]; then
        stop_pidfile "$STATE/dbus-system.pid"
        rm -f /run/dbus/pid /run/dbus/system_bus_socket
    fi
    # A namespace deleted takes its veth pairs with it, in the kernel's own time: a link seen a
    # moment ago may be gone when it is deleted (not an error).
    ip link show lmxw4 >/dev/null 2>&1 && { ip link delete lmxw4 2>/dev/null || ! ip link show lmxw4 >/dev/null 2>&1; }
    for i in 1 2 3 4; do
        [ -e "/run/netns/lmxh$i" ] && ip netns delete "lmxh$i"
        ip link show "lmxv$i" >/dev/null 2>&1 && { ip link delete "lmxv$i" 2>/dev/null || ! ip link show "lmxv$i" >/dev/null 2>&1; }
    done
    ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE"
    rm -rf "$STATE"
    log "down"
}

publish_bulk() { # count prefix
    local dir="$STATE/h2/services" i
    rm -f "$dir"/bulk-*.service
    for i in $(seq -w 1 "$1"); do
        cat > "$dir/bulk-$i.service" <<EOF
<?xml version="1.0" standalone='no'?>
<!DOCTYPE service-group SYSTEM "avahi-service.dtd">
<service-group>
  <name>$2 $i</name>
  <service>
    <type>_opta-lmx._tcp</type>
    <port>$((10000 + 10#$i))</port>
    <txt-record>path=/.well-known/opta-lmx</txt-record>
    <txt-record>service=opta-lmx</txt-record>
  </service>
</service-group>
EOF
    done
    kill -HUP "$(cat "$STATE/h2/avahi.pid")"
}

unpublish_bulk() {
    rm -f "$STATE/h2/services"/bulk-*.service
    kill -HUP "$(cat "$STATE/h2/avahi.pid")"
}

cmd=${1:-}
case "$cmd" in
up) up ;;
down) down ;;
status) cat "$STATE/env" ;;
stop-avahi) stop_avahi "${2:?host}" ;;
link) link "${2:?host}" "${3:?up or down}" ;;
roam) roam "${2:?away or home}" ;;
start-avahi) start_avahi "${2:?host}" ;;
restart-avahi) stop_avahi "${2:?host}"; start_avahi "$2" ;;
reload-avahi) kill -HUP "$(cat "$STATE/${2:?host}/avahi.pid")" ;;
publish-bulk) publish_bulk "${2:?count}" "${3:-Bulk}" ;;
unpublish-bulk) unpublish_bulk ;;
site) require_root; site "${2:?up or down}" ;;
*) die "usage: $0 up|down|status|stop-avahi H|start-avahi H|restart-avahi H|reload-avahi H|link hN up|down|roam away|home|publish-bulk N PREFIX|unpublish-bulk|site up|down" ;;
esac
