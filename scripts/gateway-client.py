#!/usr/bin/env python3
"""A client of the agent's local gateway (or of a server directly), for tests and benchmarks.

  gateway-client.py loop URL --seconds S [--concurrency C] [--stream] [--unix PATH]
      requests POST URL/chat/completions in a loop for S seconds (C at once) and prints one JSON
      line: ok, errors (by kind), latency percentiles, instances that answered, in order.
  gateway-client.py fetch URL [--unix PATH]
      GETs URL and prints JSON: status, length, sha256, seconds to the first body byte.
  gateway-client.py stream URL [--unix PATH]
      POSTs a streaming chat completion and prints JSON: events, [DONE] seen, first-event delay,
      and an `event: error` the gateway sent when the stream was cut.
  gateway-client.py streams URL --concurrency C [--unix PATH]
      C streaming chat completions at once; prints JSON: how many completed with [DONE], the
      statuses, the slowest and median first-event delays.
Standard library only, so that it runs wherever the tests do.
"""
import argparse
import hashlib
import http.client
import json
import socket
import sys
import threading
import time
import urllib.parse


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def connection(url, unix, timeout=30):
    parts = urllib.parse.urlsplit(url)
    if unix:
        return UnixConnection(unix, timeout), parts
    return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout), parts


def path_of(parts, suffix=""):
    return (parts.path.rstrip("/") + suffix) + (("?" + parts.query) if parts.query else "")


def chat_body(stream):
    return json.dumps({"model": "test/model", "stream": stream,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()


def loop(args):
    deadline = time.monotonic() + args.seconds
    lock = threading.Lock()
    results = {"ok": 0, "errors": {}, "latencies": [], "instances": []}

    def worker():
        conn, parts = connection(args.url, args.unix, timeout=10)
        while time.monotonic() < deadline:
            start = time.monotonic()
            kind = None
            instance = None
            try:
                conn.request("POST", path_of(parts, "/chat/completions"), body=chat_body(False),
                             headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                data = response.read()
                if response.status != 200:
                    kind = "http %d" % response.status
                else:
                    text = json.loads(data)["choices"][0]["message"]["content"]
                    instance = text.replace("Hello from ", "").rstrip(".")
            except Exception as error:  # noqa: BLE001 - every failure is counted by kind
                kind = type(error).__name__
                conn.close()
                conn, parts = connection(args.url, args.unix, timeout=10)
            elapsed = time.monotonic() - start
            with lock:
                if kind is None:
                    results["ok"] += 1
                    results["latencies"].append(elapsed)
                    if not results["instances"] or results["instances"][-1] != instance:
                        results["instances"].append(instance)
                else:
                    results["errors"][kind] = results["errors"].get(kind, 0) + 1
            if args.pause:
                time.sleep(args.pause / 1000.0)

    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lat = sorted(results.pop("latencies"))

    def pct(p):
        return round(lat[min(len(lat) - 1, int(len(lat) * p))] * 1000, 3) if lat else None

    results.update({"p50_ms": pct(0.50), "p99_ms": pct(0.99), "seconds": args.seconds,
                    "requests_per_second": round(results["ok"] / args.seconds, 1)})
    print(json.dumps(results))


def fetch(args):
    conn, parts = connection(args.url, args.unix)
    start = time.monotonic()
    conn.request("GET", path_of(parts))
    response = conn.getresponse()
    first = response.read(1)
    first_at = time.monotonic() - start
    rest = response.read()
    data = first + rest
    print(json.dumps({"status": response.status, "length": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                      "first_byte_ms": round(first_at * 1000, 3)}))


def stream(args):
    conn, parts = connection(args.url, args.unix)
    start = time.monotonic()
    conn.request("POST", path_of(parts, "/chat/completions"), body=chat_body(True),
                 headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
    response = conn.getresponse()
    events, done, first, gaps, last, error_event = 0, False, None, [], None, None
    buffer = b""
    try:
        while True:
            chunk = response.read1(65536)
            if not chunk:
                break
            buffer += chunk
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                now = time.monotonic()
                if first is None:
                    first = now - start
                if event.strip() == b"data: [DONE]":
                    done = True
                    continue
                if event.startswith(b"event: error\n"):
                    error_event = json.loads(event.split(b"\ndata: ", 1)[1])
                    continue
                events += 1
                payload = json.loads(event[len(b"data: "):])
                # How long after the server wrote the event this client read it.
                gaps.append(time.time_ns() - payload["lmx_sent_ns"])
                last = payload.get("lmx_instance")
    except (OSError, http.client.HTTPException) as error:
        print(json.dumps({"status": response.status, "events": events, "done": done, "error": type(error).__name__,
                          "instance": last}))
        return
    gaps.sort()
    print(json.dumps({"status": response.status, "events": events, "done": done, "instance": last,
                      "content_type": response.getheader("Content-Type"), "error_event": error_event,
                      "first_event_ms": round(first * 1000, 3) if first is not None else None,
                      "delivery_p50_ms": round(gaps[len(gaps) // 2] / 1e6, 3) if gaps else None}))


def streams(args):
    """C streams at once: every one must complete; the slowest first event is the figure."""
    results = []
    lock = threading.Lock()
    gate = threading.Barrier(args.concurrency)

    def one():
        conn, parts = connection(args.url, args.unix, timeout=60)
        gate.wait()
        start = time.monotonic()
        outcome = {"status": None, "done": False, "first": None}
        try:
            conn.request("POST", path_of(parts, "/chat/completions"), body=chat_body(True),
                         headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
            response = conn.getresponse()
            outcome["status"] = response.status
            buffer = b""
            while True:
                chunk = response.read1(65536)
                if not chunk:
                    break
                if outcome["first"] is None:
                    outcome["first"] = time.monotonic() - start
                buffer += chunk
                if b"data: [DONE]" in buffer:
                    outcome["done"] = True
        except (OSError, http.client.HTTPException) as error:
            outcome["error"] = type(error).__name__
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=one) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    firsts = sorted(r["first"] for r in results if r["first"] is not None)
    statuses = {}
    for r in results:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    print(json.dumps({"streams": len(results), "completed": sum(1 for r in results if r["done"]), "statuses": statuses,
                      "first_event_max_ms": round(firsts[-1] * 1000, 3) if firsts else None,
                      "first_event_p50_ms": round(firsts[len(firsts) // 2] * 1000, 3) if firsts else None}))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["loop", "fetch", "stream", "streams"])
    parser.add_argument("url")
    parser.add_argument("--unix")
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--pause", type=float, default=0, help="milliseconds between one worker's requests")
    args = parser.parse_args()
    {"loop": loop, "fetch": fetch, "stream": stream, "streams": streams}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
