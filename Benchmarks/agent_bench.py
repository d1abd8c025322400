#!/usr/bin/env python3
"""Agent benchmark: lmx-agentd on the test LAN, figures in one run (not pass/fail tests).

  - time to the first active endpoint after start: a LAN server found over mDNS (fresh
    database), and a remembered last-good server (restart, no mDNS)
  - failover from a LAN server to the WAN standby: goodbye (server and publisher stopped),
    refused (server dead, mDNS still announcing), black hole (link cut, packets vanish)
  - GET /v1/active latency p50/p99 and requests per second at 1 and 50 concurrent clients
  - a LAN server killed without goodbye and restarted with no new announcement: time from its
    /healthz answering to usable (hysteresis) and to active again (stability window 10 s)
  - roaming (agent in h4, two links): leave home → tunnel, come home → LAN, wake → re-probed
  - whole-process time of `lmx-status --url`
  - the local gateway against the server directly (same run): chat completions req/s and
    p50/p99 at 1 and 8 clients, streaming first event and per-event delivery, and a client loop
    across a LAN server kill
  - daemon RSS and CPU with 1, 50 and 200 live servers announced over mDNS
Run through `make bench` (root; scripts/bench.sh brings the test LAN up and down).
"""
import atexit
import collections
import json
import os
import shutil
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
TESTBED = lmxtools.TESTBED
SERVER = lmxtools.fixture("lmx-test-server.py")
LOAD = lmxtools.fixture("watch-load.py")
ENV = lmxtools.testbed_env()
RUNS = int(os.environ.get("BENCH_RUNS", "5"))
SIZES = [int(s) for s in os.environ.get("BENCH_SIZES", "1,50,200").split(",")]


def ns(host):
    return ["ip", "netns", "exec", ENV["LMX_TESTBED_%s_NS" % host.upper()]]


LIVE = []  # every process started here, stopped by PID at exit even when a step fails


@atexit.register
def stop_all():
    for p in LIVE:
        if p.poll() is None:
            p.kill()
            p.wait()


class Proc:
    def __init__(self, argv, env=None, stdin=True):
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                  env={**os.environ, **(env or {})})
        LIVE.append(self.p)
        # Read its output all the time: a test server logs every request, and a full pipe
        # would stall it in the middle of a load step.
        self.lines = []
        self.cond = threading.Condition()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.p.stdout:
            with self.cond:
                self.lines.append(line)
                if len(self.lines) > 10000:
                    del self.lines[:5000]
                self.cond.notify_all()
        with self.cond:
            self.lines.append(None)
            self.cond.notify_all()

    def wait_line(self, text, timeout=15):
        deadline = time.monotonic() + timeout
        with self.cond:
            while time.monotonic() < deadline:
                for i, line in enumerate(self.lines):
                    if line is None:
                        return False
                    if text in line:
                        del self.lines[:i + 1]
                        return True
                self.cond.wait(max(0.0, deadline - time.monotonic()))
        return False

    def send(self, command):
        self.p.stdin.write(command + "\n")
        self.p.stdin.flush()
        self.wait_line("ok " + command, 5)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def lmx_server(host, port, count=1, tls=False, bind=None, extra=()):
    addr = bind or ("127.0.0.1" if host == "root" else ENV["LMX_TESTBED_%s_ADDR" % host.upper()])
    argv = ["python3", SERVER, "--bind", addr, "--port", str(port), "--count", str(count), *extra]
    if tls:
        argv += ["--tls", ENV["LMX_TESTBED_TLS"] + "/tunnel.pem", ENV["LMX_TESTBED_TLS"] + "/tunnel.key"]
    p = Proc(argv if host == "root" else ns(host) + argv)
    assert p.wait_line("listening"), "test server did not start"
    return p


def publish(host, name, port):
    p = Proc(["avahi-publish", "-s", name, "_opta-lmx._tcp", str(port), "path=/.well-known/opta-lmx",
              "service=opta-lmx"], env={"DBUS_SYSTEM_BUS_ADDRESS": ENV["LMX_TESTBED_%s_BUS" % host.upper()]})
    time.sleep(1.2)  # probing and announcing take about a second
    return p


def request(sock, path):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    try:
        s.connect(sock)
        s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path).encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        return None, None
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split()[1]) if head else 0
    return status, body


class Agent:
    def __init__(self, config, args=(), directory=None, host="root"):
        self.dir = directory or tempfile.mkdtemp(prefix="lmx-bench-")
        self.sock = self.dir + "/agent.sock"
        with open(self.dir + "/agent.json", "w") as f:
            json.dump(config, f)
        self.started = time.perf_counter()
        self.p = subprocess.Popen(
            (ns(host) if host != "root" else []) + [
                BIN + "/lmx-agentd", "--socket", self.sock, "--db", self.dir + "/agent.db", "--config",
                self.dir + "/agent.json", *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": ENV["LMX_TESTBED_%s_BUS" % host.upper()]})
        LIVE.append(self.p)

    def active(self):
        status, body = request(self.sock, "/v1/active")
        return json.loads(body) if status == 200 else None

    def wait_active(self, predicate, timeout=30):
        start = time.perf_counter()
        while time.perf_counter() - start < timeout:
            a = self.active()
            if predicate(a):
                return time.perf_counter() - start
            time.sleep(0.005)
        return None

    def stop(self, keep=False):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(10)
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


def cfg(window=10, endpoints=()):
    return {"interfaces": ["lmxbr0"], "health": {"stability_window": window}, "endpoints": list(endpoints),
            "extra_ca_file": ENV["LMX_TESTBED_TLS"] + "/ca.pem"}


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def ms(x):
    return "%.0f ms" % (x * 1000) if x == x else "n/a"


def bench_first_active(results):
    port = 21000
    server = lmx_server("h1", port)
    pub = publish("h1", "bench first", port)
    fresh, restored = [], []
    for _ in range(RUNS):
        agent = Agent(cfg())
        fresh.append(agent.wait_active(lambda a: a is not None))
        agent.stop(keep=True)
        again = Agent(cfg(), ["--no-discovery"], directory=agent.dir)
        restored.append(again.wait_active(lambda a: a is not None))
        again.stop()
    pub.stop()
    server.stop()
    results["first_active_mdns"] = median(fresh)
    results["first_active_restored"] = median(restored)


def bench_failover(results):
    tunnel = lmx_server("root", 21443, tls=True)
    wan = {"url": "https://127.0.0.1:21443", "via": "wan", "name": "tunnel"}
    figures = {"goodbye": [], "refused": [], "black hole": []}
    for run in range(RUNS):
        for kind in figures:
            port = 21100 + run * 10 + list(figures).index(kind)
            server = lmx_server("h1", port)
            pub = publish("h1", "bench failover %d %s" % (run, kind), port)
            agent = Agent(cfg(endpoints=[wan]))
            lan = "http://%s:%d" % (ENV["LMX_TESTBED_H1_ADDR"], port)
            if agent.wait_active(lambda a: a and a["base_url"] == lan, 10) is None:
                figures[kind].append(None)
            else:
                time.sleep(1)
                if kind == "goodbye":
                    server.stop()
                    pub.stop()
                elif kind == "refused":
                    server.send("dead")
                else:
                    subprocess.run([TESTBED, "link", "h1", "down"], check=True)
                figures[kind].append(agent.wait_active(lambda a: a and a["via"] == "wan", 15))
                if kind == "black hole":
                    subprocess.run([TESTBED, "link", "h1", "up"], check=True)
            agent.stop()
            pub.stop()
            server.stop()
    tunnel.stop()
    for kind, xs in figures.items():
        results["failover_" + kind] = median(xs)
        results["failover_" + kind + "_max"] = max([x for x in xs if x is not None] or [float("nan")])


def bench_restart(results):
    tunnel = lmx_server("root", 21444, tls=True)
    wan = {"url": "https://127.0.0.1:21444", "via": "wan", "name": "tunnel"}
    usable, back = [], []
    for run in range(min(RUNS, 3)):
        port = 21300 + run
        lan = "http://%s:%d" % (ENV["LMX_TESTBED_H1_ADDR"], port)
        route = "lan/%s:%d" % (ENV["LMX_TESTBED_H1_ADDR"], port)
        server = lmx_server("h1", port)
        pub = publish("h1", "bench restart %d" % run, port)  # stays: no goodbye, no new announcement
        agent = Agent(cfg(endpoints=[wan]))
        if agent.wait_active(lambda a: a and a["base_url"] == lan, 10) is None:
            usable.append(None)
            back.append(None)
        else:
            server.stop()
            agent.wait_active(lambda a: a and a["via"] == "wan", 10)
            time.sleep(25)  # down long enough for a plain backoff to have grown to 16-32 s
            server = lmx_server("h1", port)  # returns once it prints "listening": /healthz answers
            answering = time.perf_counter()
            up = None
            while time.perf_counter() - answering < 30 and up is None:
                status, body = request(agent.sock, "/v1/status")
                if status == 200:
                    routes = [r for c in json.loads(body)["candidates"] for r in c["routes"]]
                    if any(r["id"] == route and r["health"] == "up" for r in routes):
                        up = time.perf_counter() - answering
                time.sleep(0.01)
            usable.append(up)
            agent.wait_active(lambda a: a and a["base_url"] == lan, 30)
            back.append(time.perf_counter() - answering)
        agent.stop()
        pub.stop()
        server.stop()
    tunnel.stop()
    results["restart_usable"] = median(usable)
    results["restart_usable_max"] = max([x for x in usable if x is not None] or [float("nan")])
    results["restart_back"] = median(back)
    results["restart_back_max"] = max([x for x in back if x is not None] or [float("nan")])


def bench_roam(results):
    """The agent in h4 (two links): leave home (h4 moves to another subnet, default route to a
    router that never answers) → active via the tunnel; home again → active on the LAN; a
    PrepareForSleep(false) from a logind stand-in on h4's bus → every route probed again."""
    tunnel_addr = ENV["LMX_TESTBED_H4_TUNNEL_ADDR"]
    leave, home, wake = [], [], []
    for run in range(RUNS):
        port, tport = 21700 + run, 21750 + run
        lan = "http://%s:%d" % (ENV["LMX_TESTBED_H1_ADDR"], port)
        server = lmx_server("h1", port, extra=["--instance", "roam-%d" % run])
        tunnel = lmx_server("root", tport, tls=True, bind=tunnel_addr,
                            extra=["--instance", "roam-%d" % run, "--base-urls", lan])
        pub = publish("h1", "bench roam %d" % run, port)
        wan = {"url": "https://%s:%d" % (tunnel_addr, tport), "via": "wan", "name": "tunnel"}
        config = {"interfaces": ["lan0"], "endpoints": [wan], "extra_ca_file": ENV["LMX_TESTBED_TLS"] + "/ca.pem"}
        agent = Agent(config, ["--gateway", "off"], host="h4")
        try:
            if agent.wait_active(lambda a: a and a["base_url"] == lan, 15) is None:
                continue
            time.sleep(2)
            start = time.perf_counter()
            subprocess.run([TESTBED, "roam", "away"], check=True)
            leave.append(agent.wait_active(lambda a: a and a["via"] == "wan", 15) and time.perf_counter() - start)
            time.sleep(8)  # the LAN route's probes fail and back off meanwhile
            start = time.perf_counter()
            subprocess.run([TESTBED, "roam", "home"], check=True)
            home.append(agent.wait_active(lambda a: a and a["base_url"] == lan, 60) and time.perf_counter() - start)
            time.sleep(2)
            _, body = request(agent.sock, "/v1/status")
            before = {r["id"]: r["probes"] for c in json.loads(body)["candidates"] for r in c["routes"]}
            start = time.perf_counter()
            subprocess.run(["/usr/bin/python3", lmxtools.fixture("login1-standin.py"), "--bus",
                            ENV["LMX_TESTBED_H4_BUS"], "wake"], check=True, stdout=subprocess.DEVNULL)
            took = None
            while time.perf_counter() - start < 10 and took is None:
                _, body = request(agent.sock, "/v1/status")
                now = {r["id"]: r["probes"] for c in json.loads(body)["candidates"] for r in c["routes"]}
                if all(now.get(k, 0) > v for k, v in before.items()):
                    took = time.perf_counter() - start
                time.sleep(0.005)
            wake.append(took)
        finally:
            subprocess.run([TESTBED, "roam", "home"], check=False)
            agent.stop()
            pub.stop()
            tunnel.stop()
            server.stop()
    for name, xs in (("leave", leave), ("home", home), ("wake", wake)):
        results["roam_" + name] = median(xs)
        results["roam_" + name + "_max"] = max([x for x in xs if x] or [float("nan")])


def bench_api(results):
    server = lmx_server("h1", 21500)
    agent = Agent(cfg(endpoints=[{"url": "http://%s:21500" % ENV["LMX_TESTBED_H1_ADDR"]}]), ["--no-discovery"])
    agent.wait_active(lambda a: a is not None)
    for clients in (1, 50):
        # Two load processes share the clients, so Python is less of a bottleneck.
        procs = [subprocess.Popen(["python3", LOAD, "--socket", agent.sock, "--rate", "5", "--concurrency",
                                   str(max(1, clients // 2))], stdout=subprocess.PIPE, text=True)
                 for _ in range(1 if clients == 1 else 2)]
        outs = [json.loads(p.communicate()[0]) for p in procs]
        results["api_%d_rps" % clients] = sum(o["rps"] for o in outs)
        results["api_%d_p50_ms" % clients] = max(o["p50_ms"] for o in outs)
        results["api_%d_p99_ms" % clients] = max(o["p99_ms"] for o in outs)
    # Whole-process time of the CLI, measured by hyperfine (warm-up, 30 runs, shell-free).
    out = os.path.join(agent.dir, "hyperfine.json")
    subprocess.run(["hyperfine", "--shell=none", "--warmup", "3", "--runs", "30", "--export-json", out,
                    "%s/lmx-status --url --socket %s" % (BIN, agent.sock)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    run = json.load(open(out))["results"][0]
    results["lmx_status_url"] = run["median"]
    results["lmx_status_url_min"] = run["min"]
    agent.stop()
    server.stop()


CLIENT = lmxtools.fixture("gateway-client.py")


def client(*args):
    done = subprocess.run(["python3", CLIENT, *args], capture_output=True, text=True, timeout=120)
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError("gateway-client %s: %s" % (" ".join(args), done.stderr.strip()[-400:]))
    return json.loads(lines[-1])


def bench_gateway(results):
    """The local gateway against the server directly, in the same run: added latency, throughput,
    streaming delivery, and a client loop across a LAN server kill (failover to the tunnel)."""
    lan_addr = ENV["LMX_TESTBED_H1_ADDR"]
    lan = lmx_server("h1", 21600)
    wan = lmx_server("root", 21601, tls=True)
    config = cfg(window=3, endpoints=[{"url": "https://127.0.0.1:21601", "via": "wan", "name": "tunnel"},
                                      {"url": "http://%s:21600" % lan_addr, "name": "Studio"}])
    agent = Agent(config, ["--no-discovery", "--gateway", "127.0.0.1:21602"])
    agent.wait_active(lambda a: a is not None and a["via"] == "lan")
    time.sleep(2)  # the tunnel is probed good too
    direct, gateway = "http://%s:21600/v1" % lan_addr, "http://127.0.0.1:21602/v1"
    for concurrency in (1, 8):
        for name, url in (("direct", direct), ("gateway", gateway)):
            r = client("loop", url, "--seconds", "5", "--concurrency", str(concurrency))
            results["gw_%s_%d_rps" % (name, concurrency)] = r["requests_per_second"]
            results["gw_%s_%d_p50_ms" % (name, concurrency)] = r["p50_ms"]
            results["gw_%s_%d_p99_ms" % (name, concurrency)] = r["p99_ms"]
    firsts = {"direct": [], "gateway": []}
    deliveries = {"direct": [], "gateway": []}
    for _ in range(RUNS):
        for name, url in (("direct", direct), ("gateway", gateway)):
            r = client("stream", url)
            firsts[name].append(r["first_event_ms"])
            deliveries[name].append(r["delivery_p50_ms"])
    for name in ("direct", "gateway"):
        results["gw_stream_first_%s_ms" % name] = median(firsts[name])
        results["gw_stream_delivery_%s_ms" % name] = median(deliveries[name])
    oks, errors = [], []
    for _ in range(3):
        lan.send("alive")
        agent.wait_active(lambda a: a is not None and a["via"] == "lan", timeout=30)
        loop = subprocess.Popen(["python3", CLIENT, "loop", gateway, "--seconds", "10", "--concurrency", "4",
                                 "--pause", "5"], stdout=subprocess.PIPE, text=True)
        time.sleep(4)
        lan.send("dead")
        r = json.loads(loop.communicate()[0].strip().splitlines()[-1])
        oks.append(r["ok"])
        errors.append(sum(r["errors"].values()))
    results["gw_failover_ok"] = sum(oks)
    results["gw_failover_errors"] = sum(errors)
    results["gw_failover_errors_max"] = max(errors)
    agent.stop()
    lan.stop()
    wan.stop()


def proc_stats(pid):
    with open("/proc/%d/status" % pid) as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    with open("/proc/%d/stat" % pid) as f:
        parts = f.read().rsplit(")", 1)[1].split()
    ticks = int(parts[11]) + int(parts[12])
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0]), ticks


def bench_scale(results):
    hz = os.sysconf("SC_CLK_TCK")
    for n in SIZES:
        server = lmx_server("h2", 10001, count=n)
        subprocess.run([TESTBED, "publish-bulk", str(n), "Bench"], check=True)
        agent = Agent(cfg())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status, body = request(agent.sock, "/v1/status")
            if status == 200:
                routes = [r for c in json.loads(body)["candidates"] for r in c["routes"]
                          if r["base_url"].startswith("http://%s:" % ENV["LMX_TESTBED_H2_ADDR"])]
                if len([r for r in routes if r.get("verdict") == "ready"]) >= n:
                    break
            time.sleep(0.2)
        results["scale_%d_all_ready_s" % n] = time.monotonic() - (deadline - 60)
        time.sleep(5)
        _, _, t0 = proc_stats(agent.p.pid)
        w0 = time.monotonic()
        time.sleep(30)
        rss, hwm, t1 = proc_stats(agent.p.pid)
        results["scale_%d_cpu_pct" % n] = 100.0 * (t1 - t0) / hz / (time.monotonic() - w0)
        results["scale_%d_rss_mib" % n] = rss / 1024
        results["scale_%d_peak_rss_mib" % n] = hwm / 1024
        agent.stop()
        subprocess.run([TESTBED, "unpublish-bulk"], check=True)
        server.stop()
        time.sleep(2)


def db_bytes(directory):
    return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory) if f.startswith("agent.db"))


def write_services(cycle, count):
    """`count` announcements from h2 on ports no earlier cycle used (new routes each time)."""
    directory = "/run/lmx-testbed/h2/services"
    for f in os.listdir(directory):
        if f.startswith("churn-"):
            os.remove(os.path.join(directory, f))
    for i in range(count):
        port = 20000 + (cycle * count + i) % 40000
        with open(os.path.join(directory, "churn-%d.service" % i), "w") as f:
            f.write("""<?xml version="1.0" standalone='no'?>
<!DOCTYPE service-group SYSTEM "avahi-service.dtd">
<service-group><name>Churn %d-%d</name><service><type>_opta-lmx._tcp</type><port>%d</port>
<txt-record>path=/.well-known/opta-lmx</txt-record><txt-record>service=opta-lmx</txt-record></service></service-group>
""" % (cycle, i, port))
    os.kill(int(open("/run/lmx-testbed/h2/avahi.pid").read()), signal.SIGHUP)


def routes_of(agent):
    status, body = request(agent.sock, "/v1/status")
    if status != 200:
        return []
    return [r for c in json.loads(body)["candidates"] for r in c["routes"]]


def bench_churn(results):
    """10,000 announce/withdraw cycles (20 rounds of 500 new announcers, then their goodbye):
    the daemon's RSS and database before and after; then /v1/status with 500 live servers."""
    rounds, per_round = int(os.environ.get("BENCH_CHURN_ROUNDS", "20")), 500
    agent = Agent(cfg())
    h2 = "http://%s:" % ENV["LMX_TESTBED_H2_ADDR"]
    rss_after_first = db_after_first = None
    for cycle in range(rounds):
        write_services(cycle, per_round)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            announced = [r for r in routes_of(agent) if r["base_url"].startswith(h2) and r["announced"]]
            if len(announced) >= per_round:
                break
            time.sleep(0.5)
        write_services(cycle, 0)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not [r for r in routes_of(agent) if r["base_url"].startswith(h2) and r["announced"]]:
                break
            time.sleep(0.5)
        known = len(routes_of(agent))
        rss_now, _, _ = proc_stats(agent.p.pid)
        if rss_after_first is None and known >= 1900:
            # The bound is reached: from here on, memory and the database must stay flat.
            time.sleep(2)
            rss_after_first, _, _ = proc_stats(agent.p.pid)
            db_after_first = db_bytes(agent.dir)
            results["churn_bound_reached_cycles"] = (cycle + 1) * per_round
        print("bench: churn round %d: %d routes known, RSS %.1f MiB, database %.0f KiB" % (
            cycle + 1, known, rss_now / 1024, db_bytes(agent.dir) / 1024), file=sys.stderr, flush=True)
    time.sleep(2)
    rss, hwm, _ = proc_stats(agent.p.pid)
    results["churn_cycles"] = rounds * per_round
    results["churn_routes_kept"] = len(routes_of(agent))
    results["churn_rss_first_mib"] = rss_after_first / 1024
    results["churn_rss_last_mib"] = rss / 1024
    results["churn_peak_rss_mib"] = hwm / 1024
    results["churn_db_first_kib"] = db_after_first / 1024
    results["churn_db_last_kib"] = db_bytes(agent.dir) / 1024
    agent.stop()

    # /v1/status with 500 live servers (real discovery documents, models listed).
    server = lmx_server("h2", 10001, count=500)
    subprocess.run([TESTBED, "publish-bulk", "500", "Status"], check=True)
    agent = Agent(cfg())
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if len([r for r in routes_of(agent) if r.get("verdict") == "ready"]) >= 500:
            break
        time.sleep(0.5)
    sizes, times = [], []
    for _ in range(20):
        t = time.perf_counter()
        status, body = request(agent.sock, "/v1/status")
        times.append(time.perf_counter() - t)
        sizes.append(len(body or b""))
    results["status500_routes"] = len(routes_of(agent))
    results["status500_bytes"] = statistics.median(sizes)
    results["status500_p50_ms"] = statistics.median(times) * 1000
    results["status500_max_ms"] = max(times) * 1000
    agent.stop()
    subprocess.run([TESTBED, "unpublish-bulk"], check=True)
    server.stop()


def main():
    results = {}
    steps = (bench_first_active, bench_failover, bench_restart, bench_roam, bench_api, bench_gateway, bench_scale, bench_churn)
    only = os.environ.get("BENCH_STEPS")
    if only:
        steps = [step for step in steps if step.__name__.replace("bench_", "") in only.split(",")]
    for step in steps:
        print("bench: %s" % step.__name__, file=sys.stderr, flush=True)
        step(results)
        print("bench: %s" % json.dumps(results, sort_keys=True), file=sys.stderr, flush=True)
    results = collections.defaultdict(lambda: float("nan"), results)
    rows = [
        ("first active endpoint after start, LAN server over mDNS (fresh database)", ms(results["first_active_mdns"]), "≤ 1 s"),
        ("first active endpoint after restart, remembered last-good", ms(results["first_active_restored"]), "≤ 1 s"),
        ("failover to WAN, goodbye (median / max)", "%s / %s" % (ms(results["failover_goodbye"]), ms(results["failover_goodbye_max"])), "≤ 1 s"),
        ("failover to WAN, refused (median / max)", "%s / %s" % (ms(results["failover_refused"]), ms(results["failover_refused_max"])), "≤ 1 s"),
        ("failover to WAN, black hole (median / max)", "%s / %s" % (ms(results["failover_black hole"]), ms(results["failover_black hole_max"])), "≤ 5 s"),
        ("restart without announcement: /healthz answers → usable (median / max)", "%s / %s" % (ms(results["restart_usable"]), ms(results["restart_usable_max"])), "≤ 3 s"),
        ("restart without announcement: /healthz answers → active again, window 10 s (median / max)", "%s / %s" % (ms(results["restart_back"]), ms(results["restart_back_max"])), "≤ 13 s"),
        ("roaming: leave home → active via the tunnel (median / max)", "%s / %s" % (ms(results["roam_leave"]), ms(results["roam_leave_max"])), "≤ 500 ms"),
        ("roaming: come home → active on the LAN (median / max)", "%s / %s" % (ms(results["roam_home"]), ms(results["roam_home_max"])), "≤ 1 s"),
        ("roaming: PrepareForSleep(false) → every route probed again (median / max)", "%s / %s" % (ms(results["roam_wake"]), ms(results["roam_wake_max"])), "≤ 1 s"),
        ("GET /v1/active, 1 client: req/s, p50, p99", "%.0f, %.2f ms, %.2f ms" % (results["api_1_rps"], results["api_1_p50_ms"], results["api_1_p99_ms"]), "p99 ≤ 1 ms"),
        ("GET /v1/active, 50 clients: req/s, p50, p99", "%.0f, %.2f ms, %.2f ms" % (results["api_50_rps"], results["api_50_p50_ms"], results["api_50_p99_ms"]), "≥ 10,000 req/s"),
        ("lmx-status --url, whole process (hyperfine, median of 30)", ms(results["lmx_status_url"]), "≤ 30 ms"),
    ]
    for c in (1, 8):
        rows.append(("gateway vs direct, chat completions, %d client(s): req/s, p50, p99" % c,
                     "%.0f vs %.0f, %.2f vs %.2f ms, %.2f vs %.2f ms" % (
                         results["gw_gateway_%d_rps" % c], results["gw_direct_%d_rps" % c],
                         results["gw_gateway_%d_p50_ms" % c], results["gw_direct_%d_p50_ms" % c],
                         results["gw_gateway_%d_p99_ms" % c], results["gw_direct_%d_p99_ms" % c]),
                     "added p50 ≤ 1 ms"))
    rows.append(("gateway vs direct, streaming: first event; server write → client read (p50)",
                 "%.2f vs %.2f ms; %.2f vs %.2f ms" % (results["gw_stream_first_gateway_ms"], results["gw_stream_first_direct_ms"],
                                                      results["gw_stream_delivery_gateway_ms"], results["gw_stream_delivery_direct_ms"]),
                 "added ≤ 1 ms"))
    rows.append(("gateway client loop across a LAN server kill (3 runs, 4 clients): answered, failed (max per run)",
                 "%.0f, %.0f (%.0f)" % (results["gw_failover_ok"], results["gw_failover_errors"], results["gw_failover_errors_max"]),
                 "failed ≤ requests in flight at the kill"))
    for n in SIZES:
        rows.append(("daemon with %d live servers: RSS (peak), idle CPU" % n,
                     "%.1f MiB (%.1f), %.2f %%" % (results["scale_%d_rss_mib" % n], results["scale_%d_peak_rss_mib" % n],
                                                  results["scale_%d_cpu_pct" % n]),
                     "RSS ≤ 30 MB at 200; CPU ≤ 1 % at 50"))
    rows.append(("announcer churn, %.0f announce/withdraw cycles: routes kept; RSS once the bound is reached (%.0f cycles) → after all (peak); database" % (
        results["churn_cycles"], results["churn_bound_reached_cycles"]),
                 "%.0f; %.1f → %.1f MiB (%.1f); %.0f → %.0f KiB" % (
                     results["churn_routes_kept"], results["churn_rss_first_mib"], results["churn_rss_last_mib"], results["churn_peak_rss_mib"],
                     results["churn_db_first_kib"], results["churn_db_last_kib"]),
                 "flat: routes ≤ 2048"))
    rows.append(("GET /v1/status with %.0f routes (500 live servers): size, p50, max" % results["status500_routes"],
                 "%.0f KiB, %.1f ms, %.1f ms" % (results["status500_bytes"] / 1024, results["status500_p50_ms"], results["status500_max_ms"]),
                 "bounded"))
    table = "| measure | lmx-agentd | target |\n|---|---|---|\n" + "\n".join("| %s | %s | %s |" % r for r in rows)
    print(table)
    out = os.environ.get("BENCH_RESULTS", os.path.join(REPO, "Benchmarks", "results-agent.md"))
    with open(out, "w") as f:
        f.write(table + "\n\n```json\n" + json.dumps(results, indent=1, sort_keys=True) + "\n```\n")


if __name__ == "__main__":
    main()
