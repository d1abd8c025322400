#!/bin/sh
# Prints the Opta LMX endpoint to use right now, asking lmx-agentd over its Unix socket with
# nothing but curl. Output: "<openai base url> <lan|wan> <server name>", e.g.
#   http://192.168.188.11:1234/v1 lan Mono512
# Exit codes: 0 an endpoint is active, 1 none is (the agent's reason on stderr), 69 no agent.
#
#   examples/active-endpoint.sh                       # the system agent, or yours if it runs
#   LMX_SOCKET=/path/to/agent.sock examples/active-endpoint.sh
set -eu

# The same socket lmx-status would use: LMX_SOCKET, else your own agent's, else the system one.
socket=${LMX_SOCKET:-}
if [ -z "$socket" ]; then
    socket=/run/lmx/agent.sock
    own="${XDG_RUNTIME_DIR:-/tmp/lmx-$(id -u)}/lmx/agent.sock"
    [ "$(id -u)" -ne 0 ] && [ -S "$own" ] && socket=$own
fi
if [ ! -S "$socket" ]; then
    echo "active-endpoint: no lmx-agentd socket at $socket; start it with 'sudo systemctl start lmx-agentd'" >&2
    exit 69
fi

# One request; the last line of the output is the HTTP status.
answer=$(curl -sS --max-time 5 --unix-socket "$socket" -w '\n%{http_code}' http://lmx/v1/active) || {
    echo "active-endpoint: lmx-agentd does not answer on $socket" >&2
    exit 69
}
status=$(printf '%s\n' "$answer" | tail -n 1)
body=$(printf '%s\n' "$answer" | sed '$d')

# The answer is one line of flat JSON; jq reads it properly when it is installed.
field() {
    if command -v jq >/dev/null 2>&1; then
        printf '%s' "$body" | jq -r --arg k "$1" '.[$k] // empty'
    else
        printf '%s' "$body" | sed -n "s/.*\"$1\" *: *\"\([^\"]*\)\".*/\1/p"
    fi
}

case "$status" in
200)
    echo "$(field openai_base_url) $(field via) $(field name)"
    ;;
503)
    echo "active-endpoint: no active endpoint: $(field reason)" >&2
    exit 1
    ;;
*)
    echo "active-endpoint: unexpected answer from lmx-agentd (HTTP $status)" >&2
    exit 69
    ;;
esac
