#!/usr/bin/env python3
"""Load and abuse for lmx-agentd's Unix socket (used by the integration tests and benchmarks).

  watch-load.py --socket PATH --clients N --seconds S
      N concurrent /v1/watch clients for S seconds; checks that every client received a gap-free,
      ordered sequence and that all ended at the same sequence number.
      Prints "connected N" once all have their snapshot, then "ok clients=N lines=L last_seq=Q".
  watch-load.py --socket PATH --garbage
      Garbage, oversized and half-sent requests, while checking that a normal request is still
      answered within a second. Prints "ok" or the failure.
  watch-load.py --socket PATH --rate SECONDS --concurrency C
      GET /v1/active as fast as possible from C clients (keep-alive); prints requests/s, p50, p99.
"""
import argparse
import asyncio
import json
import sys
import time


async def read_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return status, headers


async def chunks(reader):
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        yield data


class Client:
    def __init__(self):
        self.seqs = []
        self.snapshot = None
        self.error = None
        self.lines = 0


async def watch_client(path, client, ready, stop):
    try:
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(b"GET /v1/watch HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        status, headers = await read_head(reader)
        if status != 200:
            client.error = "status %d" % status
            return
        buffer = b""
        async for data in chunks(reader):
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                obj = json.loads(line)
                client.lines += 1
                if obj["type"] == "snapshot":
                    client.snapshot = obj["seq"]
                    ready.release()
                elif obj["type"] != "heartbeat":
                    client.seqs.append(obj["seq"])
            if stop.is_set():
                break
        writer.close()
    except Exception as e:  # noqa: BLE001
        client.error = repr(e)
        ready.release()


async def run_watch(args):
    clients = [Client() for _ in range(args.clients)]
    ready = asyncio.Semaphore(0)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(watch_client(args.socket, c, ready, stop)) for c in clients]
    for _ in clients:
        await asyncio.wait_for(ready.acquire(), 20)
    print("connected %d" % args.clients, flush=True)
    await asyncio.sleep(args.seconds)
    stop.set()
    await asyncio.sleep(0.5)
    for t in tasks:
        t.cancel()
    failures = []
    last = set()
    for i, c in enumerate(clients):
        if c.error:
            failures.append("client %d: %s" % (i, c.error))
            continue
        expected = c.snapshot + 1
        for s in c.seqs:
            if s != expected:
                failures.append("client %d: got seq %d, expected %d" % (i, s, expected))
                break
            expected += 1
        last.add(c.seqs[-1] if c.seqs else c.snapshot)
    if len(last) > 1:
        failures.append("clients ended at different sequence numbers: %s" % sorted(last))
    if not any(c.seqs for c in clients):
        failures.append("no change reached any client")
    if failures:
        print("fail " + "; ".join(failures[:5]), flush=True)
        return 1
    print("ok clients=%d lines=%d last_seq=%d" % (len(clients), sum(c.lines for c in clients), max(last)), flush=True)
    return 0


async def request(path, raw, timeout=2.0):
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(raw)
    await writer.drain()
    try:
        data = await asyncio.wait_for(reader.read(65536), timeout)
    finally:
        writer.close()
    return data


async def run_garbage(args):
    path = args.socket
    held = []
    # Half-sent requests, held open.
    for _ in range(20):
        r, w = await asyncio.open_unix_connection(path)
        w.write(b"GET /v1/sta")
        await w.drain()
        held.append(w)
    problems = []
    answer = await request(path, b"\x00\xff\xfe garbage \x01\x02\r\n\r\n")
    if answer and not answer.startswith(b"HTTP/1.1 4"):
        problems.append("garbage got %r" % answer[:40])
    answer = await request(path, b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n")
    if answer and not answer.startswith(b"HTTP/1.1 4"):
        problems.append("oversized header got %r" % answer[:40])
    answer = await request(path, b"POST /v1/active HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    if not answer.startswith(b"HTTP/1.1 405") and not answer.startswith(b"HTTP/1.1 404"):
        problems.append("wrong method got %r" % answer[:40])
    answer = await request(path, b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\n")
    if not answer.startswith(b"HTTP/1.1 404") or b'"error"' not in answer:
        problems.append("unknown path got %r" % answer[:60])
    started = time.monotonic()
    answer = await request(path, b"GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 1.0)
    if not answer.startswith(b"HTTP/1.1 200"):
        problems.append("normal request while abused got %r" % answer[:40])
    elapsed = time.monotonic() - started
    if elapsed > 1.0:
        problems.append("normal request took %.2f s" % elapsed)
    for w in held:
        w.close()
    print("ok" if not problems else "fail " + "; ".join(problems), flush=True)
    return 0 if not problems else 1


async def rate_client(path, deadline, latencies):
    reader, writer = await asyncio.open_unix_connection(path)
    req = b"GET /v1/active HTTP/1.1\r\nHost: x\r\n\r\n"
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        writer.write(req)
        status, headers = await read_head(reader)
        await reader.readexactly(int(headers.get("content-length", "0")))
        latencies.append(time.perf_counter() - t0)
    writer.close()


async def run_rate(args):
    latencies = []
    deadline = time.monotonic() + args.rate
    await asyncio.gather(*[rate_client(args.socket, deadline, latencies) for _ in range(args.concurrency)])
    latencies.sort()
    n = len(latencies)
    print(json.dumps({"requests": n, "rps": n / args.rate, "p50_ms": latencies[n // 2] * 1000,
                      "p99_ms": latencies[int(n * 0.99)] * 1000}), flush=True)
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--garbage", action="store_true")
    p.add_argument("--rate", type=float)
    p.add_argument("--concurrency", type=int, default=1)
    args = p.parse_args()
    if args.garbage:
        return asyncio.run(run_garbage(args))
    if args.rate:
        return asyncio.run(run_rate(args))
    return asyncio.run(run_watch(args))


if __name__ == "__main__":
    sys.exit(main())
