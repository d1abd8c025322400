#!/usr/bin/env python3
"""The gateway side by side with nginx as a reverse proxy, in one run (figures, not pass/fail).

Upstream: nginx serving the LMX contract's static answers (/healthz, /readyz, the discovery
document, /v1/models) on 127.0.0.1, one worker: a fast stand-in for a server, so that what is
measured is the proxy. In front of it, on loopback: nginx as a reverse proxy in its own
processes (one worker per core, as many as the gateway's event loops; keepalive upstream
connections, as a tuned nginx would be) and lmx-agentd's gateway (the upstream configured as an
endpoint). Both proxies are measured alike: CPU time of their processes per request and per MB
(nginx's workers; the daemon), memory after the runs. wrk asks each of the three at 1, 8 and 64 connections: requests/s, and the latency
each proxy adds to the direct one at p50 and p99, on GET /v1/models (on kept connections, and on a
new connection for each request) and on POST
/v1/chat/completions with request bodies of 1 KB, 64 KB, 512 KB and 4 MB (nginx with request
buffering off, as the gateway streams a body past its read-ahead); the gateway's CPU time per
request and per MB of body (utime + stime from /proc, over the run) and its RSS after the 64-client
runs. Streaming: the LMX test server's streamed
completions (20 events, 50 ms apart) directly, through nginx (proxy_buffering off) and through
the gateway: first event and server-write → client-read delay per event; 64 and 1,024 at once.
Bursts without the test server's thread noise (burst.py: an asyncio stand-in that closes idle
connections after 5 s as uvicorn does, and an asyncio client): 1, 8 and 64 streams sent at one
moment directly, through nginx and through the gateway, on open connections in rounds about a
second apart, and 64 after 5 s of nothing on connections the client opens then; the median of the
rounds' median first events. BENCH_BURST_ONLY=1: those rows alone.
Run through `make bench` (BENCH=proxy).
"""
import http.client
import json
import os
import resource
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import lmxtools  # noqa: E402

REPO = lmxtools.REPO
BIN = os.environ.get("LMX_BIN_DIR", os.path.join(REPO, ".build", "release"))
SERVER = lmxtools.fixture("lmx-test-server.py")
CLIENT = lmxtools.fixture("gateway-client.py")
SECONDS = float(os.environ.get("BENCH_SECONDS", "3"))
# Each cell is run this many times, the peers taking turns, and its figures are the medians of the
# rounds: one run of the same cell moves by 10–40 % on this kind of machine (which core each of the
# chain's processes lands on), the median of rounds taken side by side much less.
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
STREAM_ROUNDS = 9
CLIENTS = [int(c) for c in os.environ.get("BENCH_CLIENTS", "1,8,64").split(",")]
UPSTREAM, NGINX, GATEWAY, STREAMER, NGINX_STREAM, GATEWAY_STREAM = 21700, 21701, 21702, 21703, 21704, 21705
# The burst rows: burst.py's asyncio stand-in, nginx in front of it, a gateway in front of it.
INSTANT, NGINX_INSTANT, GATEWAY_INSTANT = 21707, 21708, 21709
# A server that closes each connection after its answer (nginx with `keepalive_timeout 0`, which
# answers `Connection: close`), as one whose idle connections closed before the next request
# (uvicorn, which Opta LMX servers run on, closes them after 5 s): each request needs a new
# connection to it. Its proxies: instructions_bench.py's rows of a new server connection each.
UPSTREAM_CLOSE, NGINX_CLOSE, GATEWAY_CLOSE = 21710, 21711, 21712
BURST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "burst.py")
BURST_ROUNDS, BURST_IDLE_ROUNDS, BURST_IDLE_SECONDS = 50, 5, 5
BURST_SIZES = (1, 8, 64)
# BENCH_BURST_ONLY=1: the burst rows alone (about 2 minutes).
BURST_ONLY = os.environ.get("BENCH_BURST_ONLY") == "1"
LIVE = []


def start(argv, **kwargs):
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)
    LIVE.append(p)
    return p


def stop_all():
    for p in LIVE:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


DISCOVERY = json.dumps({
    "schema_version": "2026-03-02", "instance_id": "bench:%d" % UPSTREAM, "service": "opta-lmx", "version": "0.1.0",
    "security_profile": "lan", "ready": True, "loaded_models": ["test/model"], "loaded_model_count": 1,
    "in_flight_requests": 0, "auth": {"admin_key_required": True, "inference_key_required": False},
    "endpoints": {"preferred_base_url": "http://127.0.0.1:%d" % UPSTREAM, "base_urls": []}})
MODELS = json.dumps({"object": "list", "data": [{"id": "test/model", "object": "model", "created": 0, "owned_by": "opta-lmx"}]})


def nginx_common(directory, name, workers):
    return """
worker_processes %(workers)d;
error_log %(d)s/%(n)s-error.log;
pid %(d)s/%(n)s.pid;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %(d)s/%(n)s-body; proxy_temp_path %(d)s/%(n)s-proxy; fastcgi_temp_path %(d)s/%(n)s-fcgi;
    uwsgi_temp_path %(d)s/%(n)s-uwsgi; scgi_temp_path %(d)s/%(n)s-scgi;
    keepalive_requests 1000000;
""" % {"d": directory, "n": name, "workers": workers}


def nginx_config(directory, name="upstream"):
    """The upstream: nginx answering the LMX contract's static answers (one worker), as a server
    that keeps connections and as one that closes each (UPSTREAM_CLOSE); a chat completion after
    its whole body."""
    def answer(path, body):
        return "location = %s { default_type application/json; return 200 '%s'; }" % (path, body)

    def server(port, keep):
        return """
    server {
        listen 127.0.0.1:%(port)d;
        %(keep)s
        %(healthz)s
        %(readyz)s
        %(discovery)s
        %(models)s
        # The whole body read before the answer, as every server does (uvicorn parses the JSON
        # first): nginx's mirror module reads it, then the static module refuses POST, and the
        # refusal is answered with the completion.
        location = /v1/chat/completions {
            client_max_body_size 64m; client_body_buffer_size 8m;
            mirror /body-read; mirror_request_body on;
            error_page 405 = @completion;
            root %(root)s;
        }
        location = /body-read { internal; return 204; }
        # A large answer (a client that never reads it is one of the floods).
        location = /v1/files/big { default_type application/octet-stream; alias %(root)s/big.bin; }
        location @completion { default_type application/json; return 200 '%(completion)s'; }
    }""" % {"port": port, "keep": "" if keep else "keepalive_timeout 0;", "root": root,
            "healthz": answer("/healthz", '{"status":"ok","version":"0.1.0"}'),
            "readyz": answer("/readyz", '{"status":"ready","version":"0.1.0","models_loaded":1}'),
            "discovery": answer("/.well-known/opta-lmx", DISCOVERY.replace(str(UPSTREAM), str(port))),
            "models": answer("/v1/models", MODELS), "completion": COMPLETION}
    root = os.path.join(directory, name + "-root")
    os.makedirs(os.path.join(root, "v1", "chat"), exist_ok=True)
    with open(os.path.join(root, "v1", "chat", "completions"), "w") as f:
        f.write("{}")
    with open(os.path.join(root, "big.bin"), "wb") as f:
        f.write(b"z" * (4 << 20))
    return nginx_common(directory, name, 1) + server(UPSTREAM, True) + server(UPSTREAM_CLOSE, False) + "\n}\n"


def bench_directory(prefix):
    """A directory for the run: readable by nginx's workers, which drop root for `nobody` (in
    mkdtemp's 0700 directory the static answers to POST were 403s, not the completion)."""
    directory = tempfile.mkdtemp(prefix=prefix)
    os.chmod(directory, 0o755)
    return directory


def check_completion(port):
    """The chat completion's answer through `port` is the completion (200), not an error page."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("POST", "/v1/chat/completions", body=b'{"model": "test/model", "messages": []}',
                       headers={"Content-Type": "application/json"})
    answer = connection.getresponse()
    body = answer.read()
    connection.close()
    if answer.status != 200 or b"chatcmpl-bench" not in body:
        raise SystemExit("proxy_bench: a chat completion through port %d answered %d %r: the rows would measure"
                         " an error, not the completion" % (port, answer.status, body[:120]))


def nginx_configs(directory):
    """Writes the upstream's and the reverse proxy's configurations into `directory`; their paths."""
    paths = (directory + "/upstream.conf", directory + "/proxy.conf")
    for path, text in zip(paths, (nginx_config(directory), proxy_config(directory))):
        with open(path, "w") as f:
            f.write(text)
    return paths


def proxy_config(directory):
    """nginx as the reverse proxy, in its own processes (as in front of any real server, and as the
    gateway is): one worker per core, the gateway's number of event loops."""
    return nginx_common(directory, "proxy", os.cpu_count() or 1) + """
    upstream lmx { server 127.0.0.1:%(upstream)d; keepalive 128; }
    server {
        listen 127.0.0.1:%(proxy)d;
        client_max_body_size 64m;
        location / { proxy_pass http://lmx; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_request_buffering off; }
    }
    upstream streamer { server 127.0.0.1:%(streamer)d; keepalive 16; }
    server {
        listen 127.0.0.1:%(proxy_stream)d;
        location / { proxy_pass http://streamer; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }
    }
    upstream closing { server 127.0.0.1:%(upstream_close)d; keepalive 128; }
    server {
        listen 127.0.0.1:%(proxy_close)d;
        location / { proxy_pass http://closing; proxy_http_version 1.1; proxy_set_header Connection ""; }
    }
    upstream instant { server 127.0.0.1:%(instant)d; keepalive 128; }
    server {
        listen 127.0.0.1:%(proxy_instant)d;
        location / { proxy_pass http://instant; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }
    }
}
""" % {"upstream": UPSTREAM, "proxy": NGINX, "streamer": STREAMER, "proxy_stream": NGINX_STREAM,
       "instant": INSTANT, "proxy_instant": NGINX_INSTANT, "upstream_close": UPSTREAM_CLOSE,
       "proxy_close": NGINX_CLOSE}


COMPLETION = json.dumps({"id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "test/model",
                         "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
                         "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
BODIES = [("1 KB", 1024), ("64 KB", 64 * 1024), ("512 KB", 512 * 1024), ("4 MB", 4 * 1024 * 1024)]
# BENCH_QUICK=1: GET and 1 KB bodies only, no streams (while working on the data path).
QUICK = os.environ.get("BENCH_QUICK") == "1"
# BENCH_HEAP_ONLY=1: the gateway alone with the request bodies at 1, 8 and 64 clients, its RSS after
# each size's runs and after QUIET_SECONDS of nothing (about a minute).
HEAP_ONLY = os.environ.get("BENCH_HEAP_ONLY") == "1"
QUIET_SECONDS = 12
# BENCH_REQUESTS_ONLY=1: the request rows (GET, a new connection each, every body size at each
# client count), the gateway's RSS through the busiest runs and the floods; no LiteLLM, no streams
# (about 10 minutes). BENCH_FLOODS_ONLY=1: the floods alone (about a minute).
REQUESTS_ONLY = os.environ.get("BENCH_REQUESTS_ONLY") == "1"
FLOODS_ONLY = os.environ.get("BENCH_FLOODS_ONLY") == "1"
if QUICK:
    BODIES = BODIES[:1]


def post_script(directory, size):
    """A wrk script that POSTs a chat completion whose body is `size` bytes (a long conversation)."""
    head = '{"model": "test/model", "messages": [{"role": "user", "content": "'
    tail = '"}]}'
    body = head + "x" * max(0, size - len(head) - len(tail)) + tail
    path = "%s/post-%d.lua" % (directory, size)
    with open("%s/body-%d.json" % (directory, size), "w") as f:
        f.write(body)
    with open(path, "w") as f:
        f.write('local f = io.open("%s/body-%d.json", "rb")\nwrk.body = f:read("*a")\nf:close()\n'
                'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n' % (directory, size))
    return path


def cpu_seconds(pid):
    """utime + stime of a process so far, seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")




def wrk(url, connections, script=None, pids=(), prefix=(), headers=(), sample=None):
    """wrk's figures, and the CPU time of `pids` (the proxy's processes) per request over the run.
    `prefix`: what wrk runs under (`ip netns exec …` for LiteLLM); `headers`: added to each request;
    `sample`: a process whose RSS is read every 50 ms during the run (its peak in "rss_peak_kib")."""
    before = sum(cpu_seconds(p) for p in pids)
    peak, done = [0], threading.Event()
    if sample:
        def sampler():
            while not done.wait(0.05):
                peak[0] = max(peak[0], lmxtools.memory_kib(sample)["rss"])
        sampling = threading.Thread(target=sampler)
        sampling.start()
    out = subprocess.run([*prefix, "wrk", "-t", str(min(connections, 2)), "-c", str(connections), "-d", "%gs" % SECONDS, "--latency",
                          *(["-s", script] if script else []), *[a for h in headers for a in ("-H", h)], url],
                         capture_output=True, text=True, check=True).stdout
    if sample:
        done.set()
        sampling.join()
    cpu = sum(cpu_seconds(p) for p in pids) - before if pids else None
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))

    def pct(p):
        found = re.search(r"\s%s%%\s+([\d.]+)(us|ms|s)" % p, out)
        if not found:  # no request completed
            return float("nan")
        value, unit = found.groups()
        return float(value) * {"us": 0.001, "ms": 1, "s": 1000}[unit]
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    return {"rps": rps, "p50": pct(50), "p99": pct(99), "requests": requests,
            "cpu_us_per_request": cpu / max(requests, 1) * 1e6 if cpu is not None else None,
            "rss_peak_kib": peak[0]}


def start_gateway(directory, name, upstream, port):
    """lmx-agentd with the upstream on `upstream` as its one endpoint and its gateway on `port`."""
    with open("%s/%s.json" % (directory, name), "w") as f:
        json.dump({"discovery": False, "endpoints": [{"url": "http://127.0.0.1:%d" % upstream, "name": name}],
                   "gateway": {"max_connections_per_route": 2048}}, f)
    return start([BIN + "/lmx-agentd", "--socket", "%s/%s.sock" % (directory, name), "--db", "%s/%s.db" % (directory, name),
                  "--config", "%s/%s.json" % (directory, name), "--no-discovery", "--gateway", "127.0.0.1:%d" % port,
                  "--gateway-socket", "%s/%s-gateway.sock" % (directory, name), "--log-level", "warning"])


def taking_turns(cells, rounds):
    """Runs every (key, run) cell `rounds` times, the cells of one round one after the other, each
    round starting with another cell (none always runs right after the same one); each key's
    results in a list."""
    runs = {}
    for round_number in range(rounds):
        turn = round_number % len(cells)
        for key, run in cells[turn:] + cells[:turn]:
            runs.setdefault(key, []).append(run())
    return runs


def in_rounds(cells):
    """Runs every cell ROUNDS times, taking turns; each cell's result is the median of its rounds'
    figures, with the rounds' req/s kept in "rounds"."""
    runs = taking_turns(cells, ROUNDS)
    results = {}
    for key, rs in runs.items():
        merged = {field: statistics.median(r[field] for r in rs) for field in ("rps", "p50", "p99", "requests")}
        cpus = [r["cpu_us_per_request"] for r in rs if r["cpu_us_per_request"] is not None]
        merged["cpu_us_per_request"] = statistics.median(cpus) if cpus else None
        merged["rounds"] = [r["rps"] for r in rs]
        merged["rss_peak_kib"] = max(r["rss_peak_kib"] for r in rs)
        results[key] = merged
    return results


def ratio(g, n):
    """The gateway's req/s over nginx's: of the medians, and the lowest and highest of the rounds."""
    each = [a / max(b, 1) for a, b in zip(g["rounds"], n["rounds"])]
    return "%.2f× (%.2f–%.2f)" % (g["rps"] / max(n["rps"], 1), min(each), max(each))


def stream(url, runs=10, model="test/model", prefix=()):
    """A streamed completion, ten times one after the other: the medians of the first event and of
    the delay from the server's write to the client's read (None through a proxy that rewrites events)."""
    firsts, deliveries = [], []
    for _ in range(runs):
        r = json.loads(subprocess.run([*prefix, "python3", CLIENT, "stream", url, "--model", model], capture_output=True,
                                      text=True, check=True).stdout.splitlines()[-1])
        firsts.append(r["first_event_ms"])
        if r["delivery_p50_ms"] is not None:
            deliveries.append(r["delivery_p50_ms"])
    return statistics.median(firsts), statistics.median(deliveries) if deliveries else None


def streams(url, concurrency, model="test/model", prefix=()):
    """Streamed completions at once: how many completed, the median and slowest first event."""
    out = subprocess.run([*prefix, "python3", CLIENT, "streams", url, "--concurrency", str(concurrency), "--model", model],
                         capture_output=True, text=True, check=True).stdout.splitlines()[-1]
    return json.loads(out)


def burst(port, concurrency=64, idle=0):
    """burst.py's streams at once through `port`; after `idle` seconds of nothing, on connections
    the client opens then (as its own idle ones would have closed)."""
    time.sleep(idle)
    out = subprocess.run(["python3", BURST, "streams", str(port), str(concurrency)] + (["--connect-late"] if idle else []),
                         capture_output=True, text=True, check=True).stdout.splitlines()[-1]
    return json.loads(out)


def burst_rounds(rounds, concurrency, idle):
    """Direct, nginx and the gateway taking turns: the median of the rounds' median first events,
    the slowest of all, and the fewest completed."""
    runs = taking_turns([(name, lambda port=port: burst(port, concurrency, idle)) for name, port in
                         (("direct", INSTANT), ("nginx", NGINX_INSTANT), ("gateway", GATEWAY_INSTANT))], rounds)
    results = {name: {"completed": min(r["completed"] for r in rs),
                      "first_event_p50_ms": statistics.median(r["first_event_p50_ms"] for r in rs),
                      "first_event_max_ms": max(r["first_event_max_ms"] for r in rs),
                      "rounds": [r["first_event_p50_ms"] for r in rs]} for name, rs in runs.items()}
    for name in ("nginx", "gateway"):
        results[name]["behind_direct_ms"] = paired(results[name]["rounds"], results["direct"]["rounds"])
    return results


def paired(rounds, direct):
    """How far behind direct, round by round: the median of each round's own difference (a round's
    peers run one right after the other, so what slows the machine for a while slows them alike;
    the difference of the medians over all rounds carries that noise)."""
    return statistics.median(r - d for r, d in zip(rounds, direct))


def bursts():
    """From burst.py's asyncio client to its asyncio stand-in: what each proxy adds to streams
    sent at one moment, with the pools warm (a round every second or so), then after 5 s of
    nothing (every connection, the client's and the proxies' to the stand-in, opened anew)."""
    results = {"burst_%d" % n: burst_rounds(BURST_ROUNDS, n, 0) for n in BURST_SIZES}
    results["burst_idle_64"] = burst_rounds(BURST_IDLE_ROUNDS, 64, BURST_IDLE_SECONDS)
    return results


def burst_rows(results, columns):
    """The burst rows of the streams table (`columns` after direct, nginx and the gateway: —)."""
    rows = []
    labels = [("burst_%d" % n, "%s at once, asyncio server and client (%d rounds)" % (
        "one stream" if n == 1 else "%d streams" % n, BURST_ROUNDS)) for n in BURST_SIZES]
    labels.append(("burst_idle_64", "64 streams after %d s idle (%d rounds)" % (BURST_IDLE_SECONDS, BURST_IDLE_ROUNDS)))
    for key, label in labels:
        r = results[key]
        rows.append("| %s: completed; first event p50 / slowest | %s |%s" % (label, " | ".join(
            "%d, %.2f / %.1f ms" % (r[name]["completed"], r[name]["first_event_p50_ms"], r[name]["first_event_max_ms"])
            for name in ("direct", "nginx", "gateway")), " — |" * columns))
        rows.append("| %s: behind direct, median of the rounds' own differences | — | %+.2f ms | %+.2f ms |%s" % (
            label.split(" (")[0], r["nginx"]["behind_direct_ms"], r["gateway"]["behind_direct_ms"], " — |" * columns))
    return rows


def burst_rounds_line(results):
    return "Burst rounds' median first events (ms), in order: %s." % "; ".join(
        "%s %s: %s" % (key.replace("_", " "), name, ", ".join("%.2f" % x for x in results[key][name]["rounds"]))
        for key in ["burst_%d" % n for n in BURST_SIZES] + ["burst_idle_64"] for name in ("direct", "nginx", "gateway"))


# The LiteLLM proxy beside them (BENCH_LITELLM=0: not). Pinned, installed only in the benchmark's own
# virtual environment, and run in a network namespace of its own that has nothing but a loopback
# (with its own stand-in upstream and wrk there too): whatever it might try to reach beyond, it cannot.
LITELLM_VERSION = "1.74.0"
LITELLM = os.environ.get("BENCH_LITELLM", "1") != "0" and not QUICK and not REQUESTS_ONLY
LITELLM_VENV = os.path.join(REPO, ".build-bench", "litellm-%s" % LITELLM_VERSION)
LITELLM_PORT = 21706
NETNS = "lmx-bench-litellm"
IN_NETNS = ("ip", "netns", "exec", NETNS)


def litellm_start(directory):
    """Installs LiteLLM's proxy if needed, makes the namespace and starts the stand-in and LiteLLM
    in it; returns LiteLLM's process."""
    if not os.path.exists(LITELLM_VENV + "/bin/litellm"):
        subprocess.run([sys.executable, "-m", "venv", LITELLM_VENV], check=True)
        subprocess.run([LITELLM_VENV + "/bin/pip", "install", "-q", "litellm[proxy]==" + LITELLM_VERSION], check=True)
    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    subprocess.run(["ip", "-n", NETNS, "link", "set", "lo", "up"], check=True)
    with open(directory + "/ns-upstream.conf", "w") as f:
        f.write(nginx_config(directory, "ns-upstream"))
    start([*IN_NETNS, "nginx", "-c", directory + "/ns-upstream.conf", "-p", directory, "-g", "daemon off;"])
    # The LMX test server's streamed completions there too, as the model test/stream.
    start([*IN_NETNS, "python3", SERVER, "--bind", "127.0.0.1", "--port", str(STREAMER)], stdin=subprocess.PIPE)
    with open(directory + "/litellm.yaml", "w") as f:
        f.write("model_list:\n")
        for name, port in (("test/model", UPSTREAM), ("test/stream", STREAMER)):
            f.write("  - model_name: %s\n    litellm_params:\n      model: openai/test/model\n"
                    "      api_base: http://127.0.0.1:%d/v1\n      api_key: bench\n" % (name, port))
        f.write("litellm_settings:\n  telemetry: false\n")
    # The model price list is read from the package, not fetched.
    proxy = start([*IN_NETNS, "env", "LITELLM_LOCAL_MODEL_COST_MAP=True", LITELLM_VENV + "/bin/litellm", "--config",
                   directory + "/litellm.yaml", "--host", "127.0.0.1", "--port", str(LITELLM_PORT)])
    deadline = time.time() + 90
    while time.time() < deadline:
        ok = subprocess.run([*IN_NETNS, "curl", "-sf", "-o", "/dev/null", "http://127.0.0.1:%d/v1/models" % LITELLM_PORT])
        if ok.returncode == 0:
            return proxy
        time.sleep(1)
    raise RuntimeError("LiteLLM did not answer within 90 s (log: none kept; run it by hand in %s)" % NETNS)


def litellm_stop():
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)


def litellm_table(results):
    if "litellm_%d" % CLIENTS[0] not in results:
        return []
    rows = ["| LiteLLM proxy %s | clients | req/s (× nginx) | added p50 | CPU per request |" % LITELLM_VERSION,
            "|---|---|---|---|---|"]
    for label, key, nkey in [("GET /v1/models", "litellm_%d", "nginx_%d")] + [
            ("POST %s" % label, "post_%d_litellm_%%d" % size, "post_%d_nginx_%%d" % size) for label, size in BODIES]:
        for c in CLIENTS:
            r, n = results[key % c], results[nkey % c]
            d = results[(nkey % c).replace("nginx", "direct")]
            rows.append("| %s | %d | %.0f (%.3f×) | %.3f ms | %.0f µs |" % (
                label, c, r["rps"], r["rps"] / max(n["rps"], 1), r["p50"] - d["p50"], r["cpu_us_per_request"] or 0))
    rows.append("")
    return rows


def request_tables(results):
    """The GET and POST tables: req/s, the latency each proxy adds, CPU per request and per MB."""
    rows = ["Each figure is the median of %d rounds of %g s, the peers taking turns; beside the gateway's ratio to nginx, "
            "the lowest and highest of the rounds' ratios." % (ROUNDS, SECONDS), "",
            "| GET /v1/models, clients | direct req/s | nginx req/s | gateway req/s (× nginx) | added p50 nginx / gateway "
            "| added p99 nginx / gateway | CPU per request nginx / gateway |",
            "|---|---|---|---|---|---|---|"]
    for c in CLIENTS:
        d, n, g = results["direct_%d" % c], results["nginx_%d" % c], results["gateway_%d" % c]
        rows.append("| %d | %.0f | %.0f | %.0f (%s) | %.3f / %.3f ms | %.3f / %.3f ms | %.0f / %.0f µs |" % (
            c, d["rps"], n["rps"], g["rps"], ratio(g, n), n["p50"] - d["p50"], g["p50"] - d["p50"],
            n["p99"] - d["p99"], g["p99"] - d["p99"], n["cpu_us_per_request"], g["cpu_us_per_request"]))
    rows.append("")
    rows.append("| GET /v1/models, a new connection each (`Connection: close`), clients | direct req/s | nginx req/s "
                "| gateway req/s (× nginx) | added p50 nginx / gateway | CPU per request nginx / gateway |")
    rows.append("|---|---|---|---|---|---|")
    for c in CLIENTS:
        d, n, g = (results["close_%s_%d" % (name, c)] for name in ("direct", "nginx", "gateway"))
        rows.append("| %d | %.0f | %.0f | %.0f (%s) | %.3f / %.3f ms | %.0f / %.0f µs |" % (
            c, d["rps"], n["rps"], g["rps"], ratio(g, n), n["p50"] - d["p50"], g["p50"] - d["p50"],
            n["cpu_us_per_request"], g["cpu_us_per_request"]))
    rows.append("")
    rows.append("| POST chat completion body | clients | direct req/s | nginx req/s | gateway req/s (× nginx) "
                "| added p50 nginx / gateway | CPU per request nginx / gateway | CPU per MB nginx / gateway |")
    rows.append("|---|---|---|---|---|---|---|---|")
    for label, size in BODIES:
        for c in CLIENTS:
            d, n, g = (results["post_%d_%s_%d" % (size, name, c)] for name in ("direct", "nginx", "gateway"))
            rows.append("| %s | %d | %.0f | %.0f | %.0f (%s) | %.3f / %.3f ms | %.0f / %.0f µs | %.0f / %.0f µs |" % (
                label, c, d["rps"], n["rps"], g["rps"], ratio(g, n), n["p50"] - d["p50"],
                g["p50"] - d["p50"], n["cpu_us_per_request"], g["cpu_us_per_request"],
                n["cpu_us_per_request"] / (size / 1e6), g["cpu_us_per_request"] / (size / 1e6)))
    rows.append("")
    rows.append("Memory after the runs: the gateway's RSS %.1f MiB (%.1f MiB after %d s of nothing: the daemon gives back "
                "what the traffic freed once it is quiet); nginx's master and workers, PSS summed, %.1f MiB." % (
                    results["gateway_rss_mib"], results["gateway_rss_quiet_mib"], QUIET_SECONDS, results["nginx_pss_mib"]))
    rows.append("")
    rows.append("The gateway's RSS during its runs at %d clients (sampled every 50 ms): at most %.1f MiB (%s)." % (
        CLIENTS[-1], results["gateway_rss_busy_peak_mib"], "; ".join(
            "%s %.1f" % (key.replace("_gateway_%d" % CLIENTS[-1], "").replace("_", " "), r["rss_peak_kib"] / 1024)
            for key, r in results.items() if key.endswith("gateway_%d" % CLIENTS[-1]))))
    rows.append("")
    rows.append("The gateway's RSS right after each kind's runs (the last at %d clients): GET %.1f MiB; %s." % (
        CLIENTS[-1], results["rss_get"], "; ".join("%s bodies %.1f MiB" % (label, results["rss_post_%d" % size])
                                                  for label, size in BODIES)))
    rows.append("")
    return rows


def heap_only(directory, pid):
    """The gateway's memory through the body rows (BENCH_HEAP_ONLY=1): RSS and anonymous memory."""
    def figures():
        memory = lmxtools.memory_kib(pid)
        return "RSS %.1f MiB (anonymous %.1f)" % (memory["rss"] / 1024, memory["anon"] / 1024)
    lines = ["The gateway's memory: at the start %s" % figures()]
    for label, size in BODIES[1:]:
        script = post_script(directory, size)
        for c in CLIENTS:
            wrk("http://127.0.0.1:%d/v1/chat/completions" % GATEWAY, c, script=script)
        lines.append("after the %s bodies at %s clients %s" % (label, "/".join(map(str, CLIENTS)), figures()))
    time.sleep(QUIET_SECONDS)
    lines.append("%d s later %s" % (QUIET_SECONDS, figures()))
    print("; ".join(lines) + ".")


# The floods of issue 63 item 5 (GatewayWireTests reproduces them against the debug daemon):
# (name, connections, what each connection sends). The gateway's RSS is read before, while the
# connections are open (their bytes sent and held), and FLOOD_SETTLE seconds after they closed
# (the daemon gives freed memory back at its first look, every 5 s, that finds no new answer).
FLOOD_SETTLE = 12
LONG_HEAD = "GET /v1/models HTTP/1.1\r\nHost: x\r\n" + "".join("X-H%d: v\r\n" % i for i in range(101)) + "\r\n"
FLOODS = [
    # A head of 101 header lines (more than the data path's reader takes: llhttp reads it) with
    # 400 requests pipelined behind it.
    ("400 requests pipelined behind a 101-line head", 64,
     [(LONG_HEAD + "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" * 400).encode()]),
    # A 32,000-byte body, its first 16,001 bytes sent one byte per send.
    ("a body sent one byte per send (Content-Length 32000, 16,000 bytes sent)", 16,
     [b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 32000\r\n\r\n{"] + [b" "] * 16000),
    # The same in 1-byte chunks of a chunked body (each chunk 6 bytes on the wire).
    ("a chunked body in 1-byte chunks (16,000 chunks sent)", 16,
     [b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n"]
     + [b"1\r\n \r\n"] * 16000),
    # A 4 MB answer asked for and never read (the server's connection is read only while the
    # client's can take more: what waits is the kernel's, and what SwiftNIO holds for the client).
    ("a 4 MB answer never read", 64, [b"GET /v1/files/big HTTP/1.1\r\nHost: localhost\r\n\r\n"]),
    # A head that never ends: refused at 32 KiB (431 head_too_large) and closed.
    ("an unfinished head of 79 KiB", 64, [b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * (79 << 10)]),
]


def still_open(s):
    """Whether the gateway kept a connection open (it may have answered on it)."""
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def floods(pid):
    """Each flood against the gateway on GATEWAY: its RSS and anonymous memory before, held and
    after, KiB; and whether the connections were still open (not answered) when it was read.
    Requests of each kind go first, so that the code the floods run is mapped before (its pages
    would otherwise count as memory the flood holds)."""
    warm = [LONG_HEAD.encode(), b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
            b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"]
    for request in warm * 3:
        with socket.create_connection(("127.0.0.1", GATEWAY), timeout=10) as s:
            s.sendall(request)
            s.recv(65536)
    results = []
    for name, count, parts in FLOODS:
        time.sleep(FLOOD_SETTLE)
        before = {**lmxtools.memory_kib(pid), "fds": len(os.listdir("/proc/%d/fd" % pid))}
        conns = []
        try:
            for _ in range(count):
                s = socket.create_connection(("127.0.0.1", GATEWAY), timeout=10)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conns.append(s)
            # Part by part across the connections, as many clients at once.
            for part in parts:
                for s in conns:
                    try:
                        s.sendall(part)
                    except OSError:
                        pass  # (a head the gateway refused and closed on)
            time.sleep(1)
            held = {**lmxtools.memory_kib(pid), "fds": len(os.listdir("/proc/%d/fd" % pid))}
            open_count = sum(1 for s in conns if still_open(s))
        finally:
            for s in conns:
                s.close()
        time.sleep(FLOOD_SETTLE)
        after = {**lmxtools.memory_kib(pid), "fds": len(os.listdir("/proc/%d/fd" % pid))}
        results.append({"flood": name, "connections": count, "open": open_count,
                        "before_kib": before["rss"], "held_kib": held["rss"], "after_kib": after["rss"],
                        "anon_before_kib": before["anon"], "anon_held_kib": held["anon"], "anon_after_kib": after["anon"],
                        "fds": (before["fds"], held["fds"], after["fds"]),
                        "per_connection_kib": (held["rss"] - before["rss"]) / count})
    return results


def floods_line(results):
    return ("Floods (the gateway's RSS, anonymous memory in brackets, before → while the connections are open → "
            "%d s after they closed): %s." % (FLOOD_SETTLE, "; ".join(
                "%s, %d connections (%d kept open by the gateway): %.1f (%.1f) → %.1f (%.1f) → %.1f (%.1f) MiB, "
                "%.1f KiB per connection; its descriptors %d → %d → %d" % (
                    r["flood"], r["connections"], r["open"], r["before_kib"] / 1024, r["anon_before_kib"] / 1024,
                    r["held_kib"] / 1024, r["anon_held_kib"] / 1024, r["after_kib"] / 1024, r["anon_after_kib"] / 1024,
                    r["per_connection_kib"], *r["fds"]) for r in results)))


def print_quick(results):
    print("\n".join(request_tables(results)))


def main():
    # 1,024 streams need 1,024 sockets in the client and twice that in the gateway.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    directory = bench_directory("lmx-proxy-bench-")
    results = {}
    agents = {}
    try:
        upstream_conf, proxy_conf = nginx_configs(directory)
        start(["nginx", "-c", upstream_conf, "-p", directory, "-g", "daemon off;"])
        proxy = start(["nginx", "-c", proxy_conf, "-p", directory, "-g", "daemon off;"])
        start(["python3", SERVER, "--bind", "127.0.0.1", "--port", str(STREAMER)], stdin=subprocess.PIPE)
        start(["python3", BURST, "serve", str(INSTANT)])
        # One agent in front of each upstream, as nginx has one upstream per server block.
        for name, upstream, gateway in (("static", UPSTREAM, GATEWAY), ("stream", STREAMER, GATEWAY_STREAM),
                                        ("instant", INSTANT, GATEWAY_INSTANT)):
            agents[name] = start_gateway(directory, name, upstream, gateway)
        for url in ("http://127.0.0.1:%d/healthz" % UPSTREAM, "http://127.0.0.1:%d/healthz" % NGINX,
                    "http://127.0.0.1:%d/v1/models" % GATEWAY, "http://127.0.0.1:%d/v1/models" % GATEWAY_STREAM,
                    "http://127.0.0.1:%d/v1/models" % GATEWAY_INSTANT, "http://127.0.0.1:%d/healthz" % NGINX_INSTANT):
            assert lmxtools.wait_http(url), "not answering: " + url
        for port in (UPSTREAM, NGINX, GATEWAY):
            check_completion(port)
        time.sleep(1)
        gateway_pid = agents["static"].pid
        # nginx's CPU is its workers' (the master only starts them).
        workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(proxy.pid)], capture_output=True, text=True).stdout.split()]
        assert workers, "the proxy nginx has no workers"
        pids = {"direct": (), "nginx": workers, "gateway": (gateway_pid,)}
        if BURST_ONLY:
            results = bursts()
            print("\n".join(["| streams at once | direct | nginx | gateway |", "|---|---|---|---|"]
                            + burst_rows(results, 0) + ["", burst_rounds_line(results)]))
            return
        if HEAP_ONLY:
            return heap_only(directory, gateway_pid)
        if FLOODS_ONLY:
            return print(floods_line(floods(gateway_pid)))
        peers = (("direct", UPSTREAM), ("nginx", NGINX), ("gateway", GATEWAY))

        def busy(name, c):
            """The gateway's RSS is sampled through its runs at the most clients."""
            return gateway_pid if name == "gateway" and c == CLIENTS[-1] else None
        for c in CLIENTS:
            results.update(in_rounds([("%s_%d" % (name, c), lambda port=port, name=name, c=c: wrk(
                "http://127.0.0.1:%d/v1/models" % port, c, pids=pids[name], sample=busy(name, c))) for name, port in peers]))
        results["rss_get"] = lmxtools.memory_kib(gateway_pid)["rss"] / 1024
        # A new connection for every request (clients that do not keep connections: scripts,
        # one-shot tools, 64 streams started at once): what accepting and closing cost.
        for c in CLIENTS:
            results.update(in_rounds([("close_%s_%d" % (name, c), lambda port=port, name=name, c=c: wrk(
                "http://127.0.0.1:%d/v1/models" % port, c, pids=pids[name], headers=("Connection: close",),
                sample=busy(name, c)))
                for name, port in peers]))
        for label, size in BODIES:
            script = post_script(directory, size)
            for c in CLIENTS:
                results.update(in_rounds([("post_%d_%s_%d" % (size, name, c), lambda port=port, name=name, c=c: wrk(
                    "http://127.0.0.1:%d/v1/chat/completions" % port, c, script=script, pids=pids[name],
                    sample=busy(name, c)))
                    for name, port in peers]))
            # The daemon's RSS right after the runs of this body size (the last at 64 clients).
            results["rss_post_%d" % size] = lmxtools.memory_kib(gateway_pid)["rss"] / 1024
        results["gateway_rss_mib"] = lmxtools.memory_kib(gateway_pid)["rss"] / 1024
        # The daemon looks every 5 s and gives freed memory back at the first look with no new answer.
        time.sleep(QUIET_SECONDS)
        results["gateway_rss_quiet_mib"] = lmxtools.memory_kib(gateway_pid)["rss"] / 1024
        # nginx is several processes sharing pages: the sum of their proportional shares.
        results["nginx_pss_mib"] = sum(lmxtools.memory_kib(p)["pss"] for p in [proxy.pid] + workers) / 1024
        results["gateway_rss_busy_peak_mib"] = max(
            r["rss_peak_kib"] for key, r in results.items() if key.endswith("gateway_%d" % CLIENTS[-1])) / 1024
        if QUICK:
            return print_quick(results)
        if REQUESTS_ONLY:
            results["floods"] = floods(gateway_pid)
            text = "\n".join(request_tables(results) + [floods_line(results["floods"])])
            print(text)
            if os.environ.get("BENCH_RESULTS"):
                with open(os.environ["BENCH_RESULTS"], "w") as f:
                    f.write(text + "\n")
            return
        if LITELLM:
            litellm = litellm_start(directory)
            litellm_pids = [litellm.pid] + [int(p) for p in subprocess.run(
                ["pgrep", "-P", str(litellm.pid)], capture_output=True, text=True).stdout.split()]
            for c in CLIENTS:
                results["litellm_%d" % c] = wrk("http://127.0.0.1:%d/v1/models" % LITELLM_PORT, c, pids=litellm_pids,
                                                prefix=IN_NETNS)
            for label, size in BODIES:
                script = post_script(directory, size)
                for c in CLIENTS:
                    results["post_%d_litellm_%d" % (size, c)] = wrk(
                        "http://127.0.0.1:%d/v1/chat/completions" % LITELLM_PORT, c, script=script, pids=litellm_pids,
                        prefix=IN_NETNS)
            litellm_url = "http://127.0.0.1:%d/v1" % LITELLM_PORT
            results["stream_litellm"] = stream(litellm_url, model="test/stream", prefix=IN_NETNS)
            results["streams64_litellm"] = streams(litellm_url, 64, model="test/stream", prefix=IN_NETNS)
        results["stream_direct"] = stream("http://127.0.0.1:%d/v1" % STREAMER)
        results["stream_nginx"] = stream("http://127.0.0.1:%d/v1" % NGINX_STREAM)
        results["stream_gateway"] = stream("http://127.0.0.1:%d/v1" % GATEWAY_STREAM)
        # 64 at once, STREAM_ROUNDS rounds taking turns, each round starting with another peer (one
        # round's median first event moves by several ms with the Python server and client's
        # scheduling): the median of the rounds' medians, the slowest first event of all, and every
        # round's streams completed.
        rounds = taking_turns([(name, lambda port=port: streams("http://127.0.0.1:%d/v1" % port, 64)) for name, port in
                               (("direct", STREAMER), ("nginx", NGINX_STREAM), ("gateway", GATEWAY_STREAM))], STREAM_ROUNDS)
        for name, runs in rounds.items():
            results["streams64_" + name] = {
                "completed": min(r["completed"] for r in runs),
                "first_event_p50_ms": statistics.median(r["first_event_p50_ms"] for r in runs),
                "first_event_max_ms": max(r["first_event_max_ms"] for r in runs)}
        results.update(bursts())
        # 1,024 streams at once through one route: all served; the daemon's memory per stream
        # (its peak RSS during the run, sampled every 50 ms, over its RSS before).
        stream_pid = agents["stream"].pid
        for name, port in (("direct", STREAMER), ("gateway", GATEWAY_STREAM)):
            before = lmxtools.memory_kib(stream_pid)["rss"]
            peak = [before]
            done = threading.Event()

            def sample():
                while not done.wait(0.05):
                    peak[0] = max(peak[0], lmxtools.memory_kib(stream_pid)["rss"])

            sampler = threading.Thread(target=sample)
            sampler.start()
            results["streams1024_" + name] = streams("http://127.0.0.1:%d/v1" % port, 1024)
            done.set()
            sampler.join()
            results["streams1024_" + name]["rss_kib"] = (before, peak[0])
    finally:
        stop_all()
        litellm_stop()
    rows = request_tables(results) + litellm_table(results)
    peers = ("direct", "nginx", "gateway") + (("litellm",) if "stream_litellm" in results else ())
    rows.append("| streamed completion (20 events, 50 ms apart) | %s |" % " | ".join(
        "LiteLLM %s" % LITELLM_VERSION if name == "litellm" else name for name in peers))
    rows.append("|---|" + "---|" * len(peers))
    rows.append("| first event (median of 10) | %s |" % " | ".join(
        "%.2f ms" % results["stream_" + name][0] for name in peers))
    # LiteLLM writes events of its own (without the server's time stamp): no delivery figure.
    rows.append("| server write → client read, p50 | %s |" % " | ".join(
        "—" if results["stream_" + name][1] is None else "%.3f ms" % results["stream_" + name][1] for name in peers))
    r = {name: results["streams64_" + name] for name in peers}
    rows.append("| 64 streams at once (%d rounds): completed; first event p50 / slowest | %s |" % (STREAM_ROUNDS, " | ".join(
        "%d, %.1f / %.1f ms" % (r[name]["completed"], r[name]["first_event_p50_ms"], r[name]["first_event_max_ms"])
        for name in peers)))
    rows += burst_rows(results, 1 if "litellm" in peers else 0)
    r = {name: results["streams1024_" + name] for name in ("direct", "gateway")}
    before, peak = r["gateway"]["rss_kib"]
    rows.append("| 1,024 streams at once: completed; slowest first event | %d, %.1f ms | — | %d, %.1f ms |%s" % (
        r["direct"]["completed"], r["direct"]["first_event_max_ms"], r["gateway"]["completed"],
        r["gateway"]["first_event_max_ms"], " — |" if "litellm" in peers else ""))
    rows.append("")
    rows.append("1,024 streams: the daemon's RSS %.1f MiB before, %.1f MiB at its peak: %.1f KiB per stream." % (
        before / 1024, peak / 1024, (peak - before) / 1024))
    rows.append("")
    rows.append(burst_rounds_line(results))
    text = "\n".join(rows)
    print(text)
    out = os.environ.get("BENCH_RESULTS")
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        stop_all()
        sys.exit(130)
