#!/usr/bin/env python3
"""Instructions per request: the gateway and nginx as a reverse proxy, counted by callgrind.

Time per request on a shared two-core machine moves by 10-30 % from one run to the next (which
core each process lands on, the machine's own speed); instructions executed do not. Each proxy
runs under valgrind's callgrind (user-space instructions only; the kernel's work is not counted)
in front of the same static nginx upstream as the proxy benchmark; one client on one kept
connection sends `WARMUP` requests, the counters are zeroed, then it sends `REQUESTS` more and the
count is read. nginx runs as one process (`master_process off`), the gateway as lmx-agentd with
the upstream as its one endpoint. Rows: GET /v1/models, POST /v1/chat/completions with 1 KB and
64 KB bodies, and GET /v1/models on a new connection for each request; then a streamed chat
completion (its head, one event, `data: [DONE]`, chunked) from burst.py's stand-in, through nginx's
proxy of it and a second gateway with the stand-in as its endpoint; and GET /v1/models through a
server that closes each connection after its answer (a new connection to it for every request, as
to a server whose idle connections closed), through nginx's proxy of it and a third gateway.

valgrind 3.19 cannot read the DWARF 5 debug information Swift writes, so the daemon runs from a
copy with its debug sections stripped (the code is the release build's, byte for byte).
Run through `make bench` (BENCH=instructions); figures, not pass/fail.
"""
import glob
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import proxy_bench as pb  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import lmxtools  # noqa: E402

WARMUP = int(os.environ.get("BENCH_WARMUP", "300"))
REQUESTS = int(os.environ.get("BENCH_REQUESTS", "2000"))
IDLE_SECONDS = float(os.environ.get("BENCH_IDLE_SECONDS", "10"))
ROWS = [("GET /v1/models", "GET", 0, True), ("POST, 1 KB body", "POST", 1024, True),
        ("POST, 64 KB body", "POST", 64 * 1024, True), ("GET /v1/models, a new connection each", "GET", 0, False)]


# A server that closes each connection after its answer (proxy_bench's UPSTREAM_CLOSE): every
# request through the proxy opens a new connection to it (a kept connection from the client).
CLOSE_ROW = "GET /v1/models, a new server connection each"
STREAM_ROW = "POST, a streamed completion (one event)"
STREAM_BODY = json.dumps({"model": "test/model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()


def streams(port, count):
    """`count` streamed completions on one kept connection, each read to its last chunk."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as connection:
        request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (len(STREAM_BODY), STREAM_BODY))
        for _ in range(count):
            connection.sendall(request)
            seen = b""
            while not seen.endswith(b"\r\n0\r\n\r\n"):
                chunk = connection.recv(65536)
                if not chunk:
                    raise SystemExit("a stream through port %d ended early: %r" % (port, seen[-200:]))
                seen += chunk
            if not seen.startswith(b"HTTP/1.1 200") or b"data: [DONE]" not in seen:
                raise SystemExit("a stream through port %d: %r" % (port, seen[:300]))


def measure_streams(pid, port, out, windows):
    streams(port, WARMUP)
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    started = time.monotonic()
    streams(port, REQUESTS)
    windows[STREAM_ROW] = time.monotonic() - started
    figure = counted(pid, out) / REQUESTS
    print("  %s: %.0f instructions per request" % (STREAM_ROW, figure), flush=True)
    return figure


def idle_rate(pid, out, seconds=IDLE_SECONDS):
    """Instructions per second of the process with no request (its own timers: the agent's health
    checks of its route, every `active_interval`): what a row's window holds besides requests."""
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    started = time.monotonic()
    time.sleep(seconds)
    return counted(pid, out) / (time.monotonic() - started)


def callgrind(argv, out):
    """Starts `argv` under callgrind, its profile written to `out`.<pid>[.<dump>]."""
    extra = os.environ.get("BENCH_CALLGRIND_ARGS", "").split()
    return pb.start(["valgrind", "--tool=callgrind", "--callgrind-out-file=%s.%%p" % out] + extra + argv)


# Requests sent again on a new connection after a proxy closed one unanswered (see `send`).
RESENT = {}


def send(port, method, size, kept, count):
    """`count` requests on one kept connection (or a new one each). The static upstream answers a
    POST without reading its body; under valgrind's slowness nginx then sometimes closes the
    client's connection unanswered: such a request is sent again on a new connection, and counted."""
    body = b'{"model": "test/model", "messages": [{"role": "user", "content": "' + b"x" * max(size - 80, 0) + b'"}]}'
    connection = None
    sent = 0
    while sent < count:
        if connection is None:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            if method == "GET":
                connection.request("GET", "/v1/models", headers={} if kept else {"Connection": "close"})
            else:
                connection.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
            answer = connection.getresponse()
            answer.read()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            RESENT[port] = RESENT.get(port, 0) + 1
            if RESENT[port] > count // 4 + 10:
                raise
            connection.close()
            connection = None
            continue
        if answer.status != 200:
            raise SystemExit("%s %s through port %d: status %d" % (method, size, port, answer.status))
        sent += 1
        if not kept:
            connection.close()
            connection = None
    if connection is not None:
        connection.close()


def counted(pid, out):
    """The instructions since the last zeroing: a dump, read from its `summary:` line."""
    before = set(glob.glob(out + ".*"))
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for path in set(glob.glob(out + ".*")) - before:
            text = open(path).read()
            found = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
            if found:
                return int(found.group(1))
        time.sleep(0.2)
    raise SystemExit("callgrind wrote no dump for pid %d" % pid)


def measure(pid, port, out, windows, rows=ROWS):
    figures = {}
    for label, method, size, kept in rows:
        send(port, method, size, kept, WARMUP)
        subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
        started = time.monotonic()
        send(port, method, size, kept, REQUESTS)
        windows[label] = time.monotonic() - started
        figures[label] = counted(pid, out) / REQUESTS
        print("  %s: %.0f instructions per request" % (label, figures[label]), flush=True)
    return figures


def main():
    for tool in ("valgrind", "callgrind_control", "nginx", "strip"):
        if shutil.which(tool) is None:
            raise SystemExit("instructions_bench: %s is missing (make bench installs valgrind and nginx)" % tool)
    directory = pb.bench_directory("lmx-instructions-")
    try:
        upstream_conf, proxy_conf = pb.nginx_configs(directory)
        pb.start(["nginx", "-c", upstream_conf, "-p", directory, "-g", "daemon off;"])
        if not lmxtools.wait_http("http://127.0.0.1:%d/v1/models" % pb.UPSTREAM):
            raise SystemExit("the upstream nginx did not answer")
        bindir = directory + "/bin"
        os.mkdir(bindir)
        subprocess.run(["strip", "--strip-debug", "-o", bindir + "/lmx-agent",
                        os.path.realpath(os.path.join(pb.BIN, "lmx-agentd"))], check=True)
        os.symlink("lmx-agent", bindir + "/lmx-agentd")
        with open(directory + "/gateway.json", "w") as f:
            json.dump({"discovery": False, "endpoints": [{"url": "http://127.0.0.1:%d" % pb.UPSTREAM, "name": "bench"}]}, f)
        with open(directory + "/gateway-close.json", "w") as f:
            json.dump({"discovery": False, "endpoints": [{"url": "http://127.0.0.1:%d" % pb.UPSTREAM_CLOSE,
                                                          "name": "closing"}]}, f)
        with open(directory + "/gateway-streams.json", "w") as f:
            json.dump({"discovery": False, "endpoints": [{"url": "http://127.0.0.1:%d" % pb.INSTANT, "name": "streams"}]}, f)
        pb.start(["python3", pb.BURST, "serve", str(pb.INSTANT), "--events", "0"])
        results = {"gateway": {}, "nginx": {}}
        # Per row, the instructions the process spends anyway over the row's window (its timers),
        # from its rate when idle, per request.
        background = {"gateway": {}, "nginx": {}}

        def gateway(name, config, port):
            return [bindir + "/lmx-agentd", "--socket", "%s/%s.sock" % (directory, name), "--db",
                    "%s/%s.db" % (directory, name), "--config", config, "--no-discovery", "--gateway",
                    "127.0.0.1:%d" % port, "--gateway-socket", "%s/%s-gateway.sock" % (directory, name),
                    "--log-level", "warning"]
        for name, argv, port, stream_port, close_port in (
            ("gateway", gateway("agent", directory + "/gateway.json", pb.GATEWAY), pb.GATEWAY, None, None),
            ("gateway", gateway("streams", directory + "/gateway-streams.json", pb.GATEWAY_INSTANT), None,
             pb.GATEWAY_INSTANT, None),
            ("gateway", gateway("closing", directory + "/gateway-close.json", pb.GATEWAY_CLOSE), None, None,
             pb.GATEWAY_CLOSE),
            ("nginx", ["nginx", "-c", proxy_conf, "-p", directory, "-g", "daemon off; master_process off;"],
             pb.NGINX, pb.NGINX_INSTANT, pb.NGINX_CLOSE),
        ):
            first = port or stream_port or close_port
            out = "%s/callgrind-%s-%d" % (directory, name, first)
            process = callgrind(argv, out)
            if not lmxtools.wait_http("http://127.0.0.1:%d/v1/models" % first, timeout=180):
                raise SystemExit("%s under callgrind did not answer" % name)
            print("%s:" % name, flush=True)
            windows = {}
            if port:
                results[name].update(measure(process.pid, port, out, windows))
            if stream_port:
                results[name][STREAM_ROW] = measure_streams(process.pid, stream_port, out, windows)
            if close_port:
                results[name].update(measure(process.pid, close_port, out, windows, [(CLOSE_ROW, "GET", 0, True)]))
            rate = idle_rate(process.pid, out)
            print("  idle: %.0f instructions per second" % rate, flush=True)
            for label, seconds in windows.items():
                background[name][label] = rate * seconds / REQUESTS
            process.terminate()
            process.wait()
        rows = ["| request (one client, %d requests after %d) | gateway | of which idle work | nginx | gateway ÷ nginx |"
                % (REQUESTS, WARMUP), "|---|---|---|---|---|"]
        for label in [row[0] for row in ROWS] + [STREAM_ROW, CLOSE_ROW]:
            g, n = results["gateway"][label], results["nginx"][label]
            rows.append("| %s | %s | %s | %s | %.1f× |" % (
                label, format(round(g), ","), format(round(background["gateway"][label]), ","), format(round(n), ","),
                g / n))
        resent = {name: RESENT.get(port, 0) for name, port in (("gateway", pb.GATEWAY), ("nginx", pb.NGINX))}
        table = "\n".join(rows) + (
            "\n\nIdle work: what the daemon does over the row's time without any request (its health checks of the"
            " route, every active_interval; under valgrind a row takes seconds), counted in the row; nginx's: at most %s."
            "\nRequests sent again after a connection closed unanswered: gateway %d, nginx %d.") % (
            format(round(max(background["nginx"].values())), ","), resent["gateway"], resent["nginx"])
        print(table)
        if os.environ.get("BENCH_RESULTS"):
            with open(os.environ["BENCH_RESULTS"], "w") as f:
                f.write("Instructions per request in user space (callgrind), `make bench` BENCH=instructions:\n\n"
                        + table + "\n")
    finally:
        pb.stop_all()
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
