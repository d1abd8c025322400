#!/usr/bin/env python3
"""Idle-cost benchmark: what agents cost the server they watch, and themselves (figures, not
pass/fail tests).

N agents (default 20) on this machine, each with its own socket, database and gateway port,
configured with one contract test server (scripts/fixtures/lmx-test-server.py on 127.0.0.1) as
their LAN endpoint and a second one as a tunnel standby (`via: wan`, plain HTTP on loopback):

  1. idle: no client, after a settle time; for a window of W seconds: the requests per second the
     active server receives (by kind: health probes, event streams) and the standby's, the
     server's CPU (its process's utime + stime), and each agent's CPU per minute and RSS
     (anonymous and file-backed, from /proc/PID/smaps_rollup);
  2. in use: one client per gateway sending a chat completion every CLIENT_PERIOD seconds for the
     same window: the same figures, with the clients' requests counted apart.

`--schedule before` runs the agents with the probe schedule of earlier versions (the active
route checked every 0.5 s whether used or not, standbys probed in full every 60 s), for the
figures side by side. Loopback only; stops what it starts by PID.

  python3 Benchmarks/idle_cost_bench.py [--agents 20] [--window 60] [--settle 15] [--schedule now|before]
      [--idle-only] [--breakdown]  (where the first agent's memory goes: Benchmarks/memory_map.py's table)
    (LMX_BIN_DIR: the directory of lmx-agentd; default .build/release)
"""
import argparse
import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import lmxtools  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memory_map  # noqa: E402

REPO = lmxtools.REPO
BIN = os.environ.get("LMX_BIN_DIR", os.path.join(REPO, ".build", "release"))
SERVER = lmxtools.fixture("lmx-test-server.py")
CLIENT_PERIOD = 2.0
HEALTH = ("/healthz", "/readyz", "/.well-known/opta-lmx", "/v1/discovery")
TICK = os.sysconf("SC_CLK_TCK")

LIVE = []
BREAKDOWN = False


@atexit.register
def stop_all():
    for p in LIVE:
        if p.poll() is None:
            p.kill()
            p.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A contract test server whose request log is counted as it comes."""

    def __init__(self, instance):
        self.port = free_port()
        self.p = subprocess.Popen(
            ["python3", SERVER, "--bind", "127.0.0.1", "--port", str(self.port), "--instance", instance],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        LIVE.append(self.p)
        self.counts = {}
        self.lock = threading.Lock()
        self.ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()
        assert self.ready.wait(10), "test server did not start"

    def _drain(self):
        for line in self.p.stdout:
            if line.startswith("listening"):
                self.ready.set()
            if not line.startswith("REQ "):
                continue
            parts = line.split()
            path = parts[2] if parts[1] == "POST" else parts[1]
            kind = ("health" if path.split("?")[0] in HEALTH else "events" if path.startswith("/admin/events")
                    else "client")
            with self.lock:
                self.counts[kind] = self.counts.get(kind, 0) + 1

    def snapshot(self):
        with self.lock:
            return dict(self.counts)

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


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
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


class Agent:
    def __init__(self, index, lan, standby, schedule):
        self.dir = tempfile.mkdtemp(prefix="lmx-idle-%d-" % index)
        self.sock = self.dir + "/agent.sock"
        self.gateway_port = free_port()
        health = {"stability_window": 10}
        if schedule == "before":
            health.update({"idle_interval": 0.5, "wan_standby_interval": 60})
        config = {
            "health": health,
            "endpoints": [
                {"url": lan, "name": "Studio", "allow_insecure": True},
                {"url": standby, "via": "wan", "name": "tunnel", "allow_insecure": True},
            ],
        }
        with open(self.dir + "/agent.json", "w") as f:
            json.dump(config, f)
        self.p = subprocess.Popen(
            [BIN + "/lmx-agentd", "--socket", self.sock, "--db", self.dir + "/agent.db", "--config",
             self.dir + "/agent.json", "--no-discovery", "--gateway", "127.0.0.1:%d" % self.gateway_port],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        LIVE.append(self.p)

    def active(self):
        try:
            status, body = request(self.sock, "/v1/active")
        except OSError:
            return None
        return json.loads(body) if status == 200 else None

    def memory(self):
        fields = {}
        with open("/proc/%d/smaps_rollup" % self.p.pid) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                    fields[parts[0][:-1]] = int(parts[1])
        return fields.get("Rss", 0) / 1024, fields.get("Anonymous", 0) / 1024, fields.get("Pss", 0) / 1024

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def client_loop(port, stop, sent):
    body = json.dumps({"model": "test/model", "messages": [{"role": "user", "content": "Hi"}]}).encode()
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                          b"Content-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                          % (port, len(body), body))
                while s.recv(65536):
                    pass
            sent[0] += 1
        except OSError:
            pass
        stop.wait(CLIENT_PERIOD)


def measure(label, lan, standby, agents, window):
    before_lan, before_standby = lan.snapshot(), standby.snapshot()
    cpu_lan = cpu_seconds(lan.p.pid)
    cpu_agents = [cpu_seconds(a.p.pid) for a in agents]
    start = time.monotonic()
    time.sleep(window)
    took = time.monotonic() - start
    after_lan, after_standby = lan.snapshot(), standby.snapshot()

    def rate(after, before, kind):
        return (after.get(kind, 0) - before.get(kind, 0)) / took

    per_agent_cpu = [(cpu_seconds(a.p.pid) - c) / took * 60 * 1000 for a, c in zip(agents, cpu_agents)]
    memory = [a.memory() for a in agents]
    n = len(agents)
    figures = {
        "phase": label,
        "agents": n,
        "window_s": round(took, 1),
        "server_health_req_per_s": round(rate(after_lan, before_lan, "health"), 3),
        "server_events_req_per_s": round(rate(after_lan, before_lan, "events"), 3),
        "server_client_req_per_s": round(rate(after_lan, before_lan, "client"), 3),
        "server_probe_req_per_min_per_agent": round(
            (rate(after_lan, before_lan, "health") + rate(after_lan, before_lan, "events")) * 60 / n, 2),
        "standby_req_per_min_per_agent": round(
            sum(rate(after_standby, before_standby, k) for k in ("health", "events", "client")) * 60 / n, 2),
        "server_cpu_percent": round((cpu_seconds(lan.p.pid) - cpu_lan) / took * 100, 2),
        "agent_cpu_ms_per_min_median": round(sorted(per_agent_cpu)[n // 2], 1),
        "agent_cpu_ms_per_min_max": round(max(per_agent_cpu), 1),
        "agent_rss_mib_median": round(sorted(m[0] for m in memory)[n // 2], 1),
        "agent_anon_mib_median": round(sorted(m[1] for m in memory)[n // 2], 1),
        # The binary's pages are shared by the agents: PSS divides them among them.
        "agent_pss_mib_median": round(sorted(m[2] for m in memory)[n // 2], 1),
    }
    print(json.dumps(figures), flush=True)
    if BREAKDOWN:
        # Where the first agent's memory goes: smaps by kind of mapping, threads by name.
        print(memory_map.table(memory_map.breakdown(agents[0].p.pid)), flush=True)
    return figures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--window", type=float, default=60)
    parser.add_argument("--settle", type=float, default=15)
    parser.add_argument("--schedule", choices=["now", "before"], default="now")
    parser.add_argument("--label", default=None, help="what the figures are of (default: the schedule)")
    parser.add_argument("--idle-only", action="store_true", help="the idle phase alone")
    parser.add_argument("--breakdown", action="store_true", help="where the first agent's memory goes, per phase")
    args = parser.parse_args()
    global BREAKDOWN
    BREAKDOWN = args.breakdown
    label = args.label or "%s schedule" % args.schedule

    lan = Server("idle-bench-lan")
    standby = Server("idle-bench-lan")  # the same instance behind its "tunnel"
    agents = [Agent(i, lan.url, standby.url, args.schedule) for i in range(args.agents)]
    try:
        deadline = time.monotonic() + 60
        for agent in agents:
            while time.monotonic() < deadline:
                active = agent.active()
                if active and active.get("baseURL") == lan.url:
                    break
                time.sleep(0.1)
        time.sleep(args.settle)
        measure("idle (%s)" % label, lan, standby, agents, args.window)
        if args.idle_only:
            return
        stop = threading.Event()
        sent = [0]
        clients = [threading.Thread(target=client_loop, args=(a.gateway_port, stop, sent), daemon=True)
                   for a in agents]
        for c in clients:
            c.start()
        time.sleep(2)
        measure("in use: a chat completion every %g s per gateway (%s)" % (CLIENT_PERIOD, label),
                lan, standby, agents, args.window)
        stop.set()
        for c in clients:
            c.join(10)
    finally:
        for agent in agents:
            agent.stop()
        for server in (lan, standby):
            server.p.stdin.close()
            server.p.terminate()
            server.p.wait(5)


if __name__ == "__main__":
    main()
