#!/usr/bin/env python3
"""The gateway beside nginx and beside the ceiling of any proxy on SwiftNIO: a relay that parses
nothing (Sources/lmx-relay-ceiling, one upstream connection per client, bytes passed as read),
and the same relay with an HTTP/1 codec of its own (Sources/lmx-codec-ceiling: every head read
from the bytes and written anew as the gateway writes it, bodies passed as read, Content-Length
framing only): what a codec of the data path's own would reach, without the gateway's rules.
Then the floor of any server on SwiftNIO's channels (Sources/lmx-http-floor: a fixed JSON answer
from memory for each head read, no codec, on the gateway's listeners) beside nginx answering the
same from its configuration, and the two proxies beside each other, on kept connections and on a
new connection per request, at 1 and 8 clients (CEILING_FLOOR_ONLY=1: that table alone).
Last, 64 streams sent at one moment (burst.py, as proxy_bench.py's burst rows) through nginx, the
gateway and the relay: how far behind direct each one's first events come when nothing but
relaying is done (CEILING_BURST_ONLY=1: that table alone, about 3 minutes).

The same stand-in upstream, nginx as reverse proxy and gateway as Benchmarks/proxy_bench.py;
GET /v1/models and 1 KB POSTs at 1 and 64 clients, in rounds taking turns as there (medians): req/s,
the ratio to nginx, CPU per request. Builds the relay (its own package, not part of lmx-agent) in
.build-ceiling/. Run after `make release`: python3 Benchmarks/ceiling/ceiling.py
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts"))
import lmxtools  # noqa: E402
import proxy_bench as pb  # noqa: E402

RELAY_PORT = 21720
FLOOR_PORT = 21721
CODEC_PORT = 21722
ANSWERING_PORT = 21724
BURST_RELAY_PORT = 21723
BURST_ONLY = os.environ.get("CEILING_BURST_ONLY") == "1"
# CEILING_FLOOR_ONLY=1: the floor's table alone (about 4 minutes).
FLOOR_ONLY = os.environ.get("CEILING_FLOOR_ONLY") == "1"


def main():
    scratch = os.path.join(lmxtools.REPO, ".build-ceiling")
    # (With the gateway's release flags that change its code: no exclusivity checks at run time,
    # the Swift runtime linked in.)
    subprocess.run(["swift", "build", "-c", "release", "--package-path", HERE, "--scratch-path", scratch,
                    "-Xswiftc", "-enforce-exclusivity=unchecked", "--static-swift-stdlib"], check=True)
    relay_binary = os.path.join(scratch, "release", "lmx-relay-ceiling")
    floor_binary = os.path.join(scratch, "release", "lmx-http-floor")
    codec_binary = os.path.join(scratch, "release", "lmx-codec-ceiling")
    directory = tempfile.mkdtemp(prefix="lmx-ceiling-")
    try:
        upstream_conf, proxy_conf = pb.nginx_configs(directory)
        pb.start(["nginx", "-c", upstream_conf, "-p", directory, "-g", "daemon off;"])
        proxy = pb.start(["nginx", "-c", proxy_conf, "-p", directory, "-g", "daemon off;"])
        agent = pb.start_gateway(directory, "static", pb.UPSTREAM, pb.GATEWAY)
        relay = pb.start([relay_binary, str(RELAY_PORT), str(pb.UPSTREAM)])
        floor = pb.start([floor_binary, str(FLOOR_PORT)])
        codec = pb.start([codec_binary, str(CODEC_PORT), str(pb.UPSTREAM)])
        for port in (pb.NGINX, pb.GATEWAY, RELAY_PORT, FLOOR_PORT, CODEC_PORT):
            assert lmxtools.wait_http("http://127.0.0.1:%d/v1/models" % port), "not answering: %d" % port
        time.sleep(1)
        workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(proxy.pid)], capture_output=True,
                                                  text=True).stdout.split()]
        if BURST_ONLY:
            bursts(directory, workers)
            return
        if FLOOR_ONLY:
            floor_table(directory, floor, agent, workers)
            return
        peers = [("nginx", pb.NGINX, workers), ("gateway", pb.GATEWAY, [agent.pid]), ("relay", RELAY_PORT, [relay.pid]),
                 ("codec", CODEC_PORT, [codec.pid])]
        print("| request | clients | nginx req/s, CPU | gateway req/s (× nginx), CPU | relay req/s (× nginx), CPU "
              "| relay with its own codec req/s (× nginx), CPU |")
        print("|---|---|---|---|---|---|")
        for label, size in (("GET /v1/models", 0), ("POST 1 KB", 1024)):
            script = pb.post_script(directory, size) if size else None
            for clients in (1, 64):
                cells = pb.in_rounds([(name, lambda port=port, pids=pids: pb.wrk(
                    "http://127.0.0.1:%d%s" % (port, "/v1/chat/completions" if size else "/v1/models"), clients,
                    script=script, pids=pids)) for name, port, pids in peers])
                rps = {name: cell["rps"] for name, cell in cells.items()}
                cpu = {name: cell["cpu_us_per_request"] for name, cell in cells.items()}
                print("| %s | %d | %.0f, %.0f µs | %s |" % (
                    label, clients, rps["nginx"], cpu["nginx"], " | ".join(
                        "%.0f (%.2f×), %.0f µs" % (rps[name], rps[name] / rps["nginx"], cpu[name])
                        for name in ("gateway", "relay", "codec"))), flush=True)
        floor_table(directory, floor, agent, workers)
        bursts(directory, workers)
    finally:
        pb.stop_all()


def floor_table(directory, floor, agent, workers):
    """The floor: servers, not proxies, beside the two proxies. nginx answering from its
    configuration, with as many workers as the floor has event loops (one per core);
    SwiftNIO's floor, raw channels answering from memory. What a proxy on SwiftNIO can reach
    beside nginx is bounded by the floor's ratio (× nginx answering), less what its upstream leg
    costs more than nginx's."""
    path = os.path.join(directory, "answering.conf")
    with open(path, "w") as f:
        f.write(pb.nginx_common(directory, "answering", os.cpu_count() or 1) + """
    server {
        listen 127.0.0.1:%d;
        location = /v1/models { default_type application/json; return 200 '%s'; }
    }
}
""" % (ANSWERING_PORT, pb.MODELS))
    answering = pb.start(["nginx", "-c", path, "-p", directory, "-g", "daemon off;"])
    assert lmxtools.wait_http("http://127.0.0.1:%d/v1/models" % ANSWERING_PORT), "nginx answering did not start"
    time.sleep(0.5)
    answering_workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(answering.pid)], capture_output=True,
                                                        text=True).stdout.split()]
    servers = [("nginx", ANSWERING_PORT, answering_workers), ("floor", FLOOR_PORT, [floor.pid]),
               ("nginx proxy", pb.NGINX, workers), ("gateway", pb.GATEWAY, [agent.pid])]
    print()
    print("| GET /v1/models | clients | nginx answering req/s, CPU | SwiftNIO floor req/s (× nginx), CPU "
          "| nginx as proxy req/s, CPU | gateway as proxy req/s (× nginx as proxy), CPU |")
    print("|---|---|---|---|---|---|")
    for label, headers in (("kept connection", ()), ("new connection each", ("Connection: close",))):
        for clients in (1, 8):
            cells = pb.in_rounds([(name, lambda port=port, pids=pids: pb.wrk(
                "http://127.0.0.1:%d/v1/models" % port, clients, pids=pids, headers=headers))
                for name, port, pids in servers])
            rps = {name: cell["rps"] for name, cell in cells.items()}
            cpu = {name: cell["cpu_us_per_request"] for name, cell in cells.items()}
            print("| %s | %d | %.0f, %.0f µs | %.0f (%.2f×), %.0f µs | %.0f, %.0f µs | %.0f (%.2f×), %.0f µs |" % (
                label, clients, rps["nginx"], cpu["nginx"], rps["floor"], rps["floor"] / rps["nginx"],
                cpu["floor"], rps["nginx proxy"], cpu["nginx proxy"], rps["gateway"],
                rps["gateway"] / rps["nginx proxy"], cpu["gateway"]), flush=True)


def bursts(directory, workers):
    """64 streams at once from burst.py's asyncio client to its asyncio stand-in: direct, through
    nginx, the gateway and the relay, taking turns (the rounds' medians); each proxy's CPU per stream
    (its request, its answer's head and four events, its client's connection opened and closed)."""
    relay_binary = os.path.join(lmxtools.REPO, ".build-ceiling", "release", "lmx-relay-ceiling")
    pb.start(["python3", pb.BURST, "serve", str(pb.INSTANT)])
    agent = pb.start_gateway(directory, "instant", pb.INSTANT, pb.GATEWAY_INSTANT)
    relay = pb.start([relay_binary, str(BURST_RELAY_PORT), str(pb.INSTANT)])
    for port in (pb.GATEWAY_INSTANT, pb.NGINX_INSTANT):
        assert lmxtools.wait_http("http://127.0.0.1:%d/v1/models" % port), "not answering: %d" % port
    time.sleep(1)
    peers = [("direct", pb.INSTANT, []), ("nginx", pb.NGINX_INSTANT, workers),
             ("gateway", pb.GATEWAY_INSTANT, [agent.pid]), ("relay", BURST_RELAY_PORT, [relay.pid])]
    for _, port, _ in peers:
        pb.burst(port)  # the proxies' connections to the stand-in opened once before the rounds
    cpu = {name: 0.0 for name, _, _ in peers}

    def run(name, port, pids):
        before = sum(pb.cpu_seconds(p) for p in pids)
        result = pb.burst(port)
        cpu[name] += sum(pb.cpu_seconds(p) for p in pids) - before
        return result

    runs = pb.taking_turns([(name, lambda name=name, port=port, pids=pids: run(name, port, pids))
                            for name, port, pids in peers], pb.BURST_ROUNDS)
    medians = {name: statistics.median(r["first_event_p50_ms"] for r in rs) for name, rs in runs.items()}
    print()
    print("| 64 streams at once (%d rounds) | direct | nginx | gateway | relay |" % pb.BURST_ROUNDS)
    print("|---|---|---|---|---|")
    print("| first event, median of the rounds' medians | %s |" % " | ".join(
        "%.2f ms" % medians[name] for name, _, _ in peers))
    print("| behind direct (difference of the medians) | — | %s |" % " | ".join(
        "%+.2f ms" % (medians[name] - medians["direct"]) for name, _, _ in peers[1:]))
    direct = [r["first_event_p50_ms"] for r in runs["direct"]]
    print("| behind direct (median of the rounds' own differences) | — | %s |" % " | ".join(
        "%+.2f ms" % pb.paired([r["first_event_p50_ms"] for r in runs[name]], direct) for name, _, _ in peers[1:]))
    print("| completed, fewest of a round | %s |" % " | ".join(
        str(min(r["completed"] for r in runs[name])) for name, _, _ in peers))
    print("| CPU per stream | — | %s |" % " | ".join(
        "%.0f µs" % (cpu[name] / (64 * pb.BURST_ROUNDS) * 1e6) for name, _, _ in peers[1:]))
    print()
    print("Rounds' medians (ms): %s." % "; ".join(
        "%s %s" % (name, ", ".join("%.2f" % r["first_event_p50_ms"] for r in runs[name])) for name, _, _ in peers))


if __name__ == "__main__":
    main()
