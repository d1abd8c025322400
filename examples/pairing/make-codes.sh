#!/usr/bin/env bash
# Makes the sample pairing codes in this folder, one per payload format lmx-pair accepts
# (CONTRACT §4). Every key and token in them is a made-up example.
#
#   examples/pairing/make-codes.sh [BIN_DIR [OUT_DIR]]   (needs qrencode; BIN_DIR holds lmx-pair;
#                                                         OUT_DIR defaults to this folder)
#
# v1-token.png is made by lmx-pair itself (import into a scratch database, then export); the
# links by qrencode, the way other generators make them (byte mode, error correction M).
set -euo pipefail
BIN=$(cd "${1:-${LMX_BIN_DIR:-$(dirname "$0")/../../.build/debug}}" && pwd)
mkdir -p "${2:-$(dirname "$0")}"
cd "${2:-$(dirname "$0")}"
command -v qrencode >/dev/null || { echo "make-codes: qrencode is missing: sudo apt-get install qrencode" >&2; exit 69; }

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# 1. The v1 token: everything in one code, through lmx-pair export.
v1='opta-lmx://pair?v=1&name=Studio&url=https%3A%2F%2Fquiet-river-1234.trycloudflare.com&key=example-admin-key&api_key=example-api-key&cf_id=0123456789abcdef.access&cf_secret=example-access-secret&instance=Mono512%3A1234&lan=192.168.188.11%3A1234'
echo "$v1" | "$BIN/lmx-pair" --db "$scratch/agent.db" --socket "$scratch/none.sock" - >/dev/null
"$BIN/lmx-pair" export Studio --db "$scratch/agent.db" --png "$scratch/v1-token.png" >/dev/null
cp "$scratch/v1-token.png" v1-token.png
chmod 0644 v1-token.png

# 2. A bare tunnel URL with the admin key.
qrencode -l M -s 6 -o tunnel-url.png 'https://quiet-river-1234.trycloudflare.com?key=example-admin-key'
# 3. The dashboard's connect link: a LAN address and the tunnel, no secrets.
qrencode -l M -s 6 -o connect-link.png \
    'https://lmx.optalocal.com/connect?host=192.168.188.11&port=1234&via=lan&tunnel=https%3A%2F%2Fquiet-river-1234.trycloudflare.com'
# 4. The account pairing link: the LAN address (the session is ignored).
qrencode -l M -s 6 -o account-link.png \
    'https://lmx.optalocal.com/pair?session=example-session&deviceId=example-device&host=192.168.188.11&port=1234'
echo "made v1-token.png tunnel-url.png connect-link.png account-link.png"
