#!/usr/bin/env python3
"""A hostile Opta LMX server: speaks the contract until told to misbehave, then answers every
request with one misbehaviour, written byte by byte on a raw socket (no HTTP library in the way).

Usage: hostile-server.py --bind ADDR --port N [--instance ID] [--list]

Reads commands on stdin, one per line, and answers "ok <command>" on stdout:
  good            behave (the LMX contract: /healthz, discovery document, /readyz, /v1/*,
                  /admin/events with heartbeats)
  <misbehaviour>  one of the names `--list` prints; every answer after it misbehaves that way
  quit
Prints "listening" once bound. Everything it starts stops by itself: each answer is bounded in
bytes (at most 64 MiB) and time (at most 20 s), and the process ends when stdin closes.

The misbehaviours come in classes (the name's first word): odd numbers in every header and JSON
field the agent reads (retry-after-*, length-*, doc-*, ready-*), huge or endless headers and
bodies (huge-*, endless-*), slow answers (slow-*), malformed chunked encoding (chunked-*),
interim and bodiless statuses with bodies (status-*), redirects (redirect-*), invalid UTF-8
(utf8-*), duplicate and conflicting headers (dup-*), server-sent events that break the rules
(sse-*), connections closed at every stage (close-*), an answer before the request body was read
(early-answer), and answers that are not HTTP (garbage-*).
"""
import argparse
import json
import socket
import sys
import threading
import time

state = {"mode": "good", "instance": "hostile:1"}
MAX_BYTES = 64 << 20
MAX_SECONDS = 20.0


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def document(**overrides):
    doc = {
        "schema_version": "2026-03-02",
        "instance_id": state["instance"],
        "service": "opta-lmx",
        "version": "0.1.0",
        "security_profile": "lan",
        "ready": True,
        "loaded_models": ["hostile/model"],
        "loaded_model_count": 1,
        "in_flight_requests": 0,
        "auth": {"admin_key_required": True, "inference_key_required": True},
        "endpoints": {"preferred_base_url": "http://127.0.0.1:1", "base_urls": []},
    }
    doc.update(overrides)
    return doc


def head(status, headers, reason=None):
    reason = reason or {200: "OK", 204: "No Content", 304: "Not Modified", 429: "Too Many Requests", 503: "Service Unavailable"}.get(status, "X")
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def answer(status, body, content_type="application/json", extra=()):
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    headers = [("Content-Type", content_type), ("Content-Length", str(len(body))), ("X-Request-ID", "h")] + list(extra)
    return head(status, headers) + body


def good(path, method, request_body):
    """The contract, as a real server answers it."""
    if path == "/healthz":
        return answer(200, {"status": "ok", "version": "0.1.0"})
    if path in ("/.well-known/opta-lmx", "/v1/discovery"):
        return answer(200, document())
    if path == "/readyz":
        return answer(200, {"status": "ready", "version": "0.1.0", "models_loaded": 1})
    if path == "/v1/models":
        return answer(200, {"object": "list", "data": [{"id": "hostile/model", "object": "model"}]})
    if path.startswith("/v1/chat/completions"):
        if b'"stream": true' in request_body or b'"stream":true' in request_body:
            events = "".join(f'data: {{"choices":[{{"delta":{{"content":"w{i}"}}}}]}}\n\n' for i in range(3)) + "data: [DONE]\n\n"
            return answer(200, events, "text/event-stream")
        return answer(200, {"id": "c1", "object": "chat.completion", "choices": [{"message": {"role": "assistant", "content": "hi"}}]})
    return answer(404, {"detail": "Not Found"})


# --- the misbehaviours: each takes (path, method, body) and returns a list of actions ---
# An action is bytes (written), ("sleep", s), ("trickle", bytes, per_second), ("stream", generator)
# or "close" (close at once). A plain bytes value is one write.

def busy(value):
    """429 on /v1/*, 503 overloaded on the probe paths, with this Retry-After value."""
    def f(path, method, body):
        if path.startswith("/v1/") and path != "/v1/discovery":
            return answer(429, {"error": {"message": "busy", "code": "busy"}}, extra=[("Retry-After", value)])
        if path == "/readyz" or path == "/healthz":
            return answer(503, {"error": {"message": "overloaded", "type": "server_error", "code": "overloaded"}}, extra=[("Retry-After", value)])
        return good(path, method, body)
    return f


def doc_with(**fields):
    def f(path, method, body):
        if path in ("/.well-known/opta-lmx", "/v1/discovery"):
            return answer(200, json.dumps(document(**fields)).replace('"__RAW__', "").replace('__RAW__"', ""))
        return good(path, method, body)
    return f


def raw_doc(text):
    def f(path, method, body):
        if path in ("/.well-known/opta-lmx", "/v1/discovery"):
            return answer(200, text)
        return good(path, method, body)
    return f


def ready_with(text):
    def f(path, method, body):
        if path == "/readyz":
            return answer(200, text)
        return good(path, method, body)
    return f


def with_length(value, body=b'{"status":"ok","version":"0.1.0"}'):
    def f(path, method, request_body):
        return [head(200, [("Content-Type", "application/json"), ("Content-Length", value)]) + body, "close"]
    return f


def headers_then(headers, body=b"{}", status=200):
    def f(path, method, request_body):
        return [head(status, headers) + body, "close"]
    return f


def huge_header(path, method, body):
    return [head(200, [("Content-Type", "application/json"), ("X-Huge", "a" * (8 << 20)), ("Content-Length", "2")]) + b"{}", "close"]


def many_headers(path, method, body):
    return [head(200, [("Content-Type", "application/json")] + [(f"X-H{i}", "v") for i in range(100_000)] + [("Content-Length", "2")]) + b"{}", "close"]


def endless_headers(path, method, body):
    def gen():
        yield b"HTTP/1.1 200 OK\r\n"
        for i in range(10_000_000):
            yield f"X-More-{i}: {'b' * 100}\r\n".encode()
    return [("stream", gen())]


def huge_body(path, method, body):
    size = 48 << 20
    def gen():
        yield head(200, [("Content-Type", "application/json"), ("Content-Length", str(size))])
        yield b'{"status":"ok","version":"'
        chunk = b"v" * (1 << 20)
        for _ in range(47):
            yield chunk
    return [("stream", gen()), "close"]


def endless_body(path, method, body):
    def gen():
        yield head(200, [("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")])
        chunk = b"100000\r\n" + b"x" * 0x100000 + b"\r\n"
        while True:
            yield chunk
    return [("stream", gen())]


def slow_body(path, method, body):
    text = json.dumps(document()).encode() if "opta-lmx" in path or "discovery" in path else b'{"status":"ok","version":"0.1.0"}'
    return [head(200, [("Content-Type", "application/json"), ("Content-Length", str(len(text)))]), ("trickle", text, 2)]


def slow_headers(path, method, body):
    return [("trickle", head(200, [("Content-Type", "application/json"), ("Content-Length", "2"), ("X-Pad", "p" * 40)]) + b"{}", 4)]


def slow_sse(path, method, body):
    return [head(200, [("Content-Type", "text/event-stream"), ("Transfer-Encoding", "chunked")]), ("trickle", b"5\r\ndata:\r\n", 1)]


def chunked(raw):
    def f(path, method, body):
        return [head(200, [("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")]) + raw, "close"]
    return f


def interim(path, method, body):
    return [b"HTTP/1.1 100 Continue\r\n\r\n" + b"HTTP/1.1 102 Processing\r\n\r\n" * 2000 + good(path, method, body)]


def switching(path, method, body):
    return [b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n" + b"\x81\x05hello" * 100, "close"]


def bodied(status):
    def f(path, method, body):
        return [head(status, [("Content-Type", "application/json"), ("Content-Length", "30")]) + b'{"status":"ok","version":"1"}  ' + b"junk after" * 100, "close"]
    return f


def redirect(status, location):
    def f(path, method, body):
        return [head(status, [("Location", location), ("Content-Length", "0")])]
    return f


def bad_utf8(path, method, body):
    if path in ("/.well-known/opta-lmx", "/v1/discovery"):
        text = json.dumps(document(version="V", instance_id="I")).encode()
        text = text.replace(b'"V"', b'"\xff\xfe\xc0\xaf"').replace(b'"I"', b'"' + state["instance"].encode() + b'"')
        return answer(200, text)
    if path == "/healthz":
        return answer(200, b'{"status":"ok","version":"\xed\xa0\x80"}')
    return [head(200, [("Content-Type", "application/json"), ("X-Bad", "\xff\xfe"), ("Content-Length", "2")]) + b"{}", "close"]


def sse(payload_gen):
    """/admin/events and streamed completions answer this stream; the rest is good."""
    def f(path, method, body):
        if path.startswith("/admin/events") or path.startswith("/v1/chat/completions"):
            return [head(200, [("Content-Type", "text/event-stream"), ("Connection", "close")]), ("stream", payload_gen()), "close"]
        return good(path, method, body)
    return f


def sse_giant_line():
    yield b"event: model_loaded\ndata: "
    for _ in range(32):
        yield b"m" * (1 << 20)
    yield b"\n\n"


def sse_no_newlines():
    for _ in range(32):
        yield b"data: " + b"z" * (1 << 20)


def sse_many_lines():
    for _ in range(64):
        yield b"\n" * (1 << 20)


def sse_cut_mid_event():
    yield b'data: {"choices":[{"delta":{"content":"one"}}]}\n\ndata: {"choices":[{"delta":{"conte'


def sse_models():
    for i in range(5000):
        yield f'event: model_loaded\ndata: {{"model_id": "{"n" * 300}{i}"}}\n\n'.encode()
    yield b'event: model_loaded\ndata: {"model_id": "bad\\u0000name"}\n\n'


def close_after(prefix):
    def f(path, method, body):
        full = good(path, method, body)
        return [full[: prefix(full)], "close"]
    return f


def garbage(data):
    def f(path, method, body):
        return [data, "close"]
    return f


def connection_named(path, method, body):
    if path.startswith("/v1/"):
        return answer(200, {"object": "list", "data": []}, extra=[("Connection", "X-Secret-Hop, keep-alive"), ("X-Secret-Hop", "upstream-only")])
    return good(path, method, body)


MODES = {
    # Retry-After, every odd form
    "retry-after-nan": busy("nan"),
    "retry-after-inf": busy("inf"),
    "retry-after-negative": busy("-1"),
    "retry-after-exponent": busy("1e309"),
    "retry-after-huge": busy("99999999999999999999999999999"),
    "retry-after-hex": busy("0x10"),
    "retry-after-date": busy("Wed, 21 Oct 2015 07:28:00 GMT"),
    "retry-after-list": busy("5, 7"),
    "retry-after-empty": busy(""),
    "retry-after-unicode-digits": busy("\u0661\u0662".encode().decode("latin-1")),
    "retry-after-fraction": busy("0.0000000001"),
    # Content-Length
    "length-negative": with_length("-1"),
    "length-huge": with_length("99999999999999999999999"),
    "length-list": with_length("31, 31"),
    "length-short-body": with_length("5000"),
    "length-hex": with_length("0x1f"),
    # numbers in the discovery document and readiness body
    "doc-inflight-max": doc_with(in_flight_requests=9223372036854775807),
    "doc-inflight-min": doc_with(in_flight_requests=-9223372036854775808),
    "doc-inflight-past-int64": raw_doc('{"service":"opta-lmx","instance_id":"hostile:1","ready":true,"in_flight_requests":123456789012345678901234567890,"loaded_model_count":1e400}'),
    "doc-counts-negative": doc_with(loaded_model_count=-5, in_flight_requests=-1),
    "doc-counts-float": doc_with(loaded_model_count=1.5, in_flight_requests=2.5e18),
    "doc-nan-literal": raw_doc('{"service":"opta-lmx","instance_id":"hostile:1","ready":true,"in_flight_requests":NaN,"loaded_model_count":Infinity}'),
    "doc-huge-strings": doc_with(version="v" * 60000, security_profile="p" * 60000, loaded_models=["m" * 250 + str(i) for i in range(600)]),
    "doc-many-urls": doc_with(endpoints={"preferred_base_url": "http://" + "h" * 5000, "base_urls": ["http://10.254.0.%d:1" % (i % 250) for i in range(5000)]}),
    "doc-deep-nesting": raw_doc("[" * 100000 + "]" * 100000),
    "doc-wrong-types": doc_with(loaded_models="not a list", in_flight_requests="12", ready="yes", auth=[1, 2], endpoints=7),
    "ready-models-huge": ready_with('{"status":"ready","version":"0.1.0","models_loaded":1e99999}'),
    # huge or endless headers and bodies
    "huge-header": huge_header,
    "huge-many-headers": many_headers,
    "endless-headers": endless_headers,
    "huge-body": huge_body,
    "endless-body": endless_body,
    # slow answers
    "slow-body": slow_body,
    "slow-headers": slow_headers,
    "slow-sse": slow_sse,
    # malformed chunked encoding
    "chunked-bad-size": chunked(b"zz\r\nhello\r\n0\r\n\r\n"),
    "chunked-size-overflow": chunked(b"fffffffffffffffffffffff\r\nhello\r\n0\r\n\r\n"),
    "chunked-negative": chunked(b"-5\r\nhello\r\n0\r\n\r\n"),
    "chunked-no-crlf": chunked(b"5\r\nhelloXX5\r\nhello0\r\n\r\n"),
    "chunked-with-length": headers_then([("Content-Type", "application/json"), ("Transfer-Encoding", "chunked"), ("Content-Length", "3")], b"2\r\n{}\r\n0\r\n\r\n"),
    # interim and bodiless statuses
    "status-1xx-flood": interim,
    "status-101": switching,
    "status-204-body": bodied(204),
    "status-304-body": bodied(304),
    "status-999": headers_then([("Content-Length", "2")], b"{}", status=999),
    # redirects (only ever to loopback)
    "redirect-self-loop": redirect(302, "/healthz"),
    "redirect-elsewhere": redirect(301, "http://127.0.0.1:1/healthz"),
    "redirect-bad-location": redirect(307, "ht!tp://\x01bad"),
    # invalid UTF-8
    "utf8-invalid": bad_utf8,
    # duplicate and conflicting headers
    "dup-content-length": headers_then([("Content-Type", "application/json"), ("Content-Length", "2"), ("Content-Length", "7")], b"{}"),
    "dup-retry-after": lambda p, m, b: [head(429, [("Retry-After", "1"), ("Retry-After", "nan"), ("Content-Length", "2")]) + b"{}"],
    "dup-content-type": headers_then([("Content-Type", "text/event-stream"), ("Content-Type", "application/json"), ("Content-Length", "2")], b"{}"),
    "dup-connection-named": connection_named,
    # server-sent events that break the rules
    "sse-giant-line": sse(sse_giant_line),
    "sse-no-newlines": sse(sse_no_newlines),
    "sse-many-blank-lines": sse(sse_many_lines),
    "sse-cut-mid-event": sse(sse_cut_mid_event),
    "sse-model-flood": sse(sse_models),
    # closed at every stage
    "close-at-once": lambda p, m, b: ["close"],
    "close-mid-status": close_after(lambda full: 7),
    "close-after-status": close_after(lambda full: full.index(b"\r\n") + 2),
    "close-mid-headers": close_after(lambda full: full.index(b"\r\n\r\n") - 5),
    "close-after-headers": close_after(lambda full: full.index(b"\r\n\r\n") + 4),
    "close-mid-body": close_after(lambda full: full.index(b"\r\n\r\n") + 10),
    "close-reset": lambda p, m, b: ["reset"],
    # answered before the request body was read (then the connection closes)
    "early-answer": lambda p, m, b: [answer(200, {"object": "list", "data": []}, extra=[("Connection", "close")]), "close"],
    # not HTTP
    "garbage-ssh": garbage(b"SSH-2.0-OpenSSH_9.2\r\n"),
    "garbage-binary": garbage(bytes(range(256)) * 64),
    "garbage-http2": garbage(b"\x00\x00\x12\x04\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x64\x00\x04\x40\x00\x00\x00\x00\x06\x00\x00\x40\x00"),
    "garbage-status-text": garbage(b"HTTP/1.1 abc OK\r\nContent-Length: 2\r\n\r\n{}"),
    "garbage-http09": garbage(b'{"status":"ok","version":"0.1.0"}'),
}


def read_request(conn, skip_body=False):
    """Reads one request: its path, method and body (bounded). None when the client went away.
    With skip_body, the body is left unread (the answer comes before it)."""
    data = b""
    conn.settimeout(30)
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk or len(data) > 1 << 20:
            return None
        data += chunk
    head_part, rest = data.split(b"\r\n\r\n", 1)
    lines = head_part.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) < 2:
        return None
    method, target = parts[0], parts[1]
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    body = rest
    if skip_body:
        return method, target.split("?")[0], b"", headers
    if "content-length" in headers:
        want = min(int(headers["content-length"]), 8 << 20)
        while len(body) < want:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while not body.endswith(b"0\r\n\r\n") and len(body) < 8 << 20:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
    return method, target.split("?")[0], body, headers


def run_actions(conn, actions):
    if isinstance(actions, bytes):
        actions = [actions]
    deadline = time.monotonic() + MAX_SECONDS
    sent = 0
    for action in actions:
        if time.monotonic() > deadline:
            return False
        if action == "close":
            return False
        if action == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            return False
        if isinstance(action, bytes):
            conn.sendall(action)
            sent += len(action)
        elif action[0] == "sleep":
            time.sleep(action[1])
        elif action[0] == "trickle":
            data, per_second = action[1], action[2]
            for i in range(len(data)):
                if time.monotonic() > deadline:
                    return False
                conn.sendall(data[i:i + 1])
                time.sleep(1.0 / per_second)
        elif action[0] == "stream":
            for piece in action[1]:
                if time.monotonic() > deadline or sent > MAX_BYTES:
                    return False
                conn.sendall(piece)
                sent += len(piece)
    return True


def serve(conn):
    try:
        while True:
            request = read_request(conn, skip_body=state["mode"] == "early-answer")
            if request is None:
                return
            method, path, body, headers = request
            say(f"REQ {path}")
            mode = state["mode"]
            if mode == "good":
                actions = events_stream() if path.startswith("/admin/events") else good(path, method, body)
            else:
                actions = MODES[mode](path, method, body)
            if not run_actions(conn, actions):
                return
    except OSError:
        pass
    finally:
        try:
            conn.close()
        except OSError:
            pass


def events_stream():
    def gen():
        for _ in range(int(MAX_SECONDS)):
            if state["mode"] != "good":
                return
            yield b"event: heartbeat\ndata: {}\n\n"
            time.sleep(1)
    return [head(200, [("Content-Type", "text/event-stream"), ("Connection", "close")]), ("stream", gen()), "close"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--instance", default="hostile:1")
    parser.add_argument("--list", action="store_true", help="print the misbehaviours, one per line, and exit")
    args = parser.parse_args()
    if args.list:
        for name in MODES:
            print(name)
        return
    state["instance"] = args.instance
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.bind, args.port))
    listener.listen(256)

    def accept():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    say(f"listening {args.bind}:{listener.getsockname()[1]}")
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            break
        if command == "good" or command in MODES:
            state["mode"] = command
            say(f"ok {command}")
        else:
            say(f"unknown {command}")
    listener.close()


if __name__ == "__main__":
    main()
