#!/usr/bin/env python3
"""Streams started at once, measured without the noise of threads: an upstream and a client on
asyncio (one thread each), for proxy_bench.py's burst rows.

  burst.py serve PORT [--events N] [--keep-alive S]
                                     a stand-in server on 127.0.0.1:PORT: the LMX contract's
                                     GET answers (health, readiness, discovery document, models)
                                     and streamed chat completions whose first event is written
                                     as soon as the request is read, then N more 50 ms apart;
                                     idle connections closed after S seconds (5, as uvicorn,
                                     which Opta LMX servers run on)
  burst.py streams PORT N [--connect-late]
                                     N connections opened first, then N streamed completions
                                     sent at one moment; prints one JSON line: how many
                                     completed, the median and slowest time from a stream's
                                     request written to its first event read (ms). With
                                     --connect-late each connection is opened at that moment
                                     and timed from there (a client whose idle connections
                                     have closed: httpx, under the OpenAI SDK, drops them
                                     after 5 s)

The LMX test server (threads, one per connection) answers a burst in an order its scheduler
picks: the median of 64 first events moves by 10 ms from one round to the next, more than the
gateway adds. Here the server answers requests in the order they arrive and the client reads
them all on one thread, so what a proxy adds stands out.
"""
import argparse
import asyncio
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import proxy_bench as pb  # noqa: E402

GETS = {
    b"/healthz": b'{"status":"ok","version":"0.1.0"}',
    b"/readyz": b'{"status":"ready","version":"0.1.0","models_loaded":1}',
    b"/.well-known/opta-lmx": pb.DISCOVERY.encode(),
    b"/v1/models": pb.MODELS.encode(),
}
HEAD_LIMIT = 64 * 1024
BODY_LIMIT = 16 * 1024 * 1024


def event(i):
    data = {"id": "chatcmpl-burst", "object": "chat.completion.chunk", "created": 0, "model": "test/model",
            "choices": [{"index": 0, "delta": {"content": "t%d " % i}, "finish_reason": None}],
            "lmx_sent_ns": time.time_ns()}
    line = b"data: " + json.dumps(data).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(line), line)


async def read_body(reader, headers):
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return body
            if len(body) + size > BODY_LIMIT:
                raise ValueError("body too large")
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    length = int(headers.get(b"content-length", b"0"))
    if not 0 <= length <= BODY_LIMIT:
        raise ValueError("bad length")
    return await reader.readexactly(length)


async def serve_connection(reader, writer, events, keep_alive):
    try:
        while True:
            # Like uvicorn (Opta LMX servers run on it): a connection idle for 5 s is closed.
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), keep_alive)
            if len(head) > HEAD_LIMIT:
                break
            lines = head.split(b"\r\n")
            method, path = lines[0].split(b" ")[:2]
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                if name:
                    headers[name.strip().lower()] = value.strip()
            body = await read_body(reader, headers)
            path = path.split(b"?")[0]
            if method == b"GET":
                answer = GETS.get(path)
                status = b"200 OK" if answer is not None else b"404 Not Found"
                answer = answer if answer is not None else b'{"error":"not found"}'
                writer.write(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (status, len(answer), answer))
                await writer.drain()
                continue
            stream = b'"stream": true' in body or b'"stream":true' in body
            if not stream:
                answer = pb.COMPLETION.encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(answer), answer))
                await writer.drain()
                continue
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n" + event(0))
            await writer.drain()
            for i in range(1, events + 1):
                await asyncio.sleep(0.05)
                writer.write(event(i))
                await writer.drain()
            done = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError, ValueError,
            IndexError):
        pass
    finally:
        writer.close()


async def serve(port, events, keep_alive):
    server = await asyncio.start_server(lambda r, w: serve_connection(r, w, events, keep_alive), "127.0.0.1", port,
                                        backlog=4096, limit=HEAD_LIMIT)
    async with server:
        await server.serve_forever()


REQUEST_BODY = json.dumps({"model": "test/model", "stream": True,
                           "messages": [{"role": "user", "content": "hello"}]}).encode()


async def one_stream(port, go, opened, results, late):
    if late:
        opened.append(1)
        await go.wait()
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    else:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        opened.append(1)
        await go.wait()
        started = time.monotonic()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                 b"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (port, len(REQUEST_BODY), REQUEST_BODY))
    seen = b""
    first = None
    try:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                break
            seen = (seen + chunk)[-4096:]
            if first is None and b"data: " in seen:
                first = time.monotonic() - started
            if b"data: [DONE]" in seen:
                results.append(first)
                break
    finally:
        writer.close()


async def streams(port, count, late):
    go = asyncio.Event()
    opened, results = [], []
    tasks = [asyncio.create_task(one_stream(port, go, opened, results, late)) for _ in range(count)]
    while len(opened) < count and not any(t.done() for t in tasks):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # every connection accepted on the other side
    go.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    firsts = sorted(r for r in results if r is not None)
    return {"streams": count, "completed": len(results),
            "first_event_p50_ms": statistics.median(firsts) * 1000 if firsts else float("nan"),
            "first_event_max_ms": firsts[-1] * 1000 if firsts else float("nan")}


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve")
    s.add_argument("port", type=int)
    s.add_argument("--events", type=int, default=3)
    s.add_argument("--keep-alive", type=float, default=5, help="seconds an idle connection is kept (uvicorn's 5)")
    c = sub.add_parser("streams")
    c.add_argument("port", type=int)
    c.add_argument("count", type=int)
    c.add_argument("--connect-late", action="store_true",
                   help="open each connection at the moment its request is sent, and time from there")
    args = parser.parse_args()
    if args.command == "serve":
        asyncio.run(serve(args.port, args.events, args.keep_alive))
    else:
        print(json.dumps(asyncio.run(streams(args.port, args.count, args.connect_late))))


if __name__ == "__main__":
    main()
