#!/usr/bin/env python3
"""A test server that speaks the Opta LMX HTTP contract (health, discovery document, readiness), switchable at run time.

Usage: lmx-test-server.py --bind ADDR --port N [--instance ID] [--tls CERT KEY]
                          [--require-access ID SECRET]

Reads commands on stdin, one per line, and answers "ok <command>" on stdout:
  ready | notready | overloaded | 401 | 403 | 502 | 530 | login-redirect | wrong-service | drop
  slow MS       every answer waits MS milliseconds
  hang          accept connections but never answer
  stall         send the status line, headers and half a body, then never finish
  retry-after N the Retry-After of overloaded answers (default 30)
  dead          stop listening (connections are refused)
  alive         listen again
  instance ID   report another instance_id
  load M | unload M   a model loaded or unloaded (discovery document and /admin/events)
  mute | unmute       stop or resume /admin/events heartbeats (the connection stays open)
  busy | idle         chat completions answer 429 (all slots busy, Retry-After: 5), or not
  cut N | cut         streamed completions end abruptly after N events, or not
  drop                chat completions are read, then the connection closes without an answer
  quit
Every request is logged on stdout as "REQ <path> <header names that carry credentials>".

For the gateway tests: POST /v1/chat/completions answers a completion, or with "stream": true
server-sent events (--stream-chunks chunks, --stream-interval ms apart, then [DONE]);
GET /v1/echo answers the request's headers; with --api-key every /v1/ path needs that key
(Authorization: Bearer or X-Api-Key), as a server with an inference key does.
"""
import argparse
import json
import socket
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

state = {"mode": "ready", "delay": 0.0, "instance": None, "retry_after": "30"}
subscribers = []  # queues of /admin/events clients
lock = threading.RLock()
out_lock = threading.Lock()


def say(line):
    with out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "opta-lmx-test/0.1"

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        with lock:
            self.server.connections.add(self.connection)

    def finish(self):
        with lock:
            self.server.connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def send_json(self, status, body, headers=None):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Request-ID", "test-%d" % time.monotonic_ns())
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        args = self.server.args
        creds = [h for h in ("CF-Access-Client-Id", "CF-Access-Client-Secret", "X-Admin-Key", "Authorization")
                 if self.headers.get(h) is not None]
        say("REQ %s %s" % (self.path, ",".join(creds) or "-"))
        with lock:
            mode, delay, instance = state["mode"], state["delay"], state["instance"]
        if mode == "hang":
            time.sleep(3600)
            return
        if mode == "stall":
            # A peer that answers, then stops mid-body: headers promise more than ever comes.
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "4096")
            self.end_headers()
            self.wfile.write(b'{"status": "ok", "version": "0.1')
            self.wfile.flush()
            time.sleep(3600)
            return
        if delay:
            time.sleep(delay)
        path = self.path.split("?", 1)[0]
        if args.require_access:
            cid, secret = args.require_access
            if self.headers.get("CF-Access-Client-Id") != cid or self.headers.get("CF-Access-Client-Secret") != secret:
                return self.send_json(403, {"detail": "Forbidden by Access"})
        if mode in ("401", "403"):
            return self.send_json(int(mode), {"detail": "Invalid or missing key"})
        if mode in ("502", "530"):
            return self.send_json(int(mode), {"error": "tunnel"})
        if mode == "login-redirect":
            self.send_response(302)
            self.send_header("Location", "https://team.cloudflareaccess.com/cdn-cgi/access/login/x")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if mode == "overloaded" and path not in ("/healthz", "/readyz", "/admin/health"):
            return self.send_json(503, {"error": {"message": "Server under memory pressure", "type": "server_error",
                                                  "code": "overloaded"}}, {"Retry-After": state["retry_after"]})
        ident = instance or args.instance
        if path == "/healthz":
            return self.send_json(200, {"status": "ok", "version": "0.1.0"})
        if path in ("/.well-known/opta-lmx", "/v1/discovery"):
            ready = mode not in ("notready",)
            host = args.bind
            return self.send_json(200, {
                "schema_version": "2026-03-02", "instance_id": ident,
                "continuity": {"event_resume_supported": True},
                "service": "something-else" if mode == "wrong-service" else "opta-lmx",
                "version": "0.1.0", "security_profile": args.profile, "ready": ready,
                # Under the cloud profile the document names no models (the count stays right).
                "loaded_models": (args.models if args.profile == "lan" else []) if ready else [],
                "loaded_model_count": len(args.models) if ready else 0,
                "in_flight_requests": 0,
                "auth": {"admin_key_required": True, "inference_key_required": bool(args.api_key),
                         "supabase_jwt_enabled": False},
                # As the real server lists them: its own addresses (and localhost), plain http.
                "endpoints": {"preferred_base_url": "http://%s:%d" % (host, args.port),
                              "base_urls": args.base_urls or []},
            })
        if path == "/readyz":
            if mode == "notready":
                return self.send_json(503, {"status": "unavailable", "reason": "no models loaded"})
            return self.send_json(200, {"status": "ready", "version": "0.1.0", "models_loaded": 1})
        if path.startswith("/admin/"):
            if self.headers.get("X-Admin-Key") != args.admin_key:
                return self.send_json(403, {"detail": "Invalid or missing admin key"})
            if path == "/admin/events":
                return self.send_events()
            return self.send_json(200, {"status": "ok"})
        if path == "/v1/bytes":
            return self.send_bytes()
        if path.startswith("/v1/") and not self.authorized():
            return self.send_json(401, {"error": {"message": "Invalid or missing API key", "type": "authentication_error"}})
        if path == "/v1/echo":
            # The request as it arrived (path with query, headers), and a cookie the gateway
            # must not pass back, a header it replaces.
            return self.send_json(200, {"headers": {k.lower(): v for k, v in self.headers.items()}, "instance": ident,
                                        "path": self.path},
                                  {"Set-Cookie": "session=from-upstream; Path=/", "X-Content-Type-Options": "upstream"})
        if path == "/v1/models":
            return self.send_json(200, {"object": "list", "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "opta-lmx"} for name in args.models]})
        return self.send_json(404, {"detail": "Not Found"})

    def do_POST(self):
        """A minimal OpenAI chat completion, so that clients (examples/) can be tried end to end."""
        if self.path.split("?", 1)[0] == "/v1/upload":
            return self.receive_upload()
        length = int(self.headers.get("Content-Length") or 0)
        try:
            request = json.loads(self.rfile.read(min(length, 1 << 20)) or b"{}")
        except ValueError:
            return self.send_json(400, {"error": {"message": "invalid JSON", "type": "invalid_request_error"}})
        creds = [h for h in ("CF-Access-Client-Id", "CF-Access-Client-Secret", "X-Admin-Key", "Authorization", "X-Api-Key")
                 if self.headers.get(h) is not None]
        say("REQ POST %s %s" % (self.path, ",".join(creds) or "-"))
        with lock:
            mode, instance, busy = state["mode"], state["instance"], state.get("busy", False)
        if mode == "drop":
            # Reads the request, then closes the connection without a word: it may have acted.
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if busy:
            return self.send_json(429, {"error": {"message": "All inference slots are busy", "type": "rate_limit_exceeded",
                                                  "code": "rate_limit_exceeded"}}, {"Retry-After": "5"})
        if mode == "overloaded":
            return self.send_json(503, {"error": {"message": "Server under memory pressure", "type": "server_error",
                                                  "code": "overloaded"}}, {"Retry-After": state["retry_after"]})
        if mode in ("dead", "hang", "notready") or self.path.split("?", 1)[0] != "/v1/chat/completions":
            return self.send_json(404 if mode == "ready" else 503, {"detail": "not available"})
        if not self.authorized():
            return self.send_json(401, {"error": {"message": "Invalid or missing API key", "type": "authentication_error"}})
        ident = instance or self.server.args.instance
        model = request.get("model", "test/model")
        routed = model in ("auto", "chat", "code", "reasoning") or model.startswith(("preset:", "copilot/"))
        if model not in self.server.args.models and not routed:
            return self.send_json(404, {"error": {"message": "model %s not found" % model, "type": "invalid_request_error",
                                                  "code": "model_not_found"}})
        if request.get("stream"):
            return self.stream_completion(request, ident)
        return self.send_json(200, {
            "id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()),
            "model": request.get("model", "test/model"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "Hello from %s." % ident}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
        })


    def authorized(self):
        key = self.server.args.api_key
        if not key:
            return True
        return self.headers.get("Authorization") == "Bearer " + key or self.headers.get("X-Api-Key") == key

    def send_events(self):
        """GET /admin/events: server-sent events as the real server sends them (event: TYPE,
        data: JSON), a heartbeat every --heartbeat seconds unless muted."""
        import queue
        q = queue.Queue()
        with lock:
            subscribers.append(q)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            while True:
                try:
                    kind, data = q.get(timeout=self.server.args.heartbeat)
                except queue.Empty:
                    with lock:
                        muted = state.get("muted", False)
                    if muted:
                        continue
                    kind, data = "heartbeat", {"ts": time.time()}
                if kind is None:
                    break
                event = b"event: %s\ndata: %s\n\n" % (kind.encode(), json.dumps(data).encode())
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
        except OSError:
            pass
        finally:
            with lock:
                if q in subscribers:
                    subscribers.remove(q)

    def receive_upload(self):
        """POST /v1/upload: reads the whole body (Content-Length or chunked) and answers its length
        and SHA-256, so that a proxy's streaming of request bodies can be checked."""
        import hashlib
        digest, total = hashlib.sha256(), 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                data = self.rfile.read(size)
                self.rfile.readline()
                digest.update(data)
                total += len(data)
        else:
            left = int(self.headers.get("Content-Length") or 0)
            while left > 0:
                data = self.rfile.read(min(left, 65536))
                if not data:
                    break
                digest.update(data)
                total += len(data)
                left -= len(data)
        say("REQ POST /v1/upload %d" % total)
        return self.send_json(200, {"length": total, "sha256": digest.hexdigest()})

    def send_bytes(self):
        """GET /v1/bytes?n=N: N deterministic bytes (every value 0-255) in uneven chunks, to check
        that a proxy passes a body through unchanged."""
        query = dict(p.split("=", 1) for p in (self.path.split("?", 1)[1:] or [""])[0].split("&") if "=" in p)
        n = int(query.get("n", "65536"))
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent, size = 0, 1
        while sent < n:
            data = bytes((sent + i) * 131 % 256 for i in range(min(size, n - sent)))
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            sent += len(data)
            size = size * 3 % 8191 + 1
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def stream_completion(self, request, ident):
        """Server-sent events in HTTP/1.1 chunks, one event per chunk, flushed as it is made."""
        args = self.server.args
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(data):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        try:
            with lock:
                cut = state.get("cut")
            for i in range(args.stream_chunks):
                if cut is not None and i == cut:
                    # The server goes away mid-answer: no last chunk, the connection just ends.
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                event = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": int(time.time()),
                         "model": request.get("model", "test/model"),
                         "choices": [{"index": 0, "delta": {"content": "t%d " % i}, "finish_reason": None}],
                         "lmx_sent_ns": time.time_ns(), "lmx_instance": ident}
                chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
                if args.stream_interval:
                    time.sleep(args.stream_interval / 1000.0)
            chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, *args, **kwargs):
        self.connections = set()
        super().__init__(*args, **kwargs)

    def kill(self):
        """Like a crashed process: the listener and every open connection go away."""
        self.shutdown()
        self.server_close()
        with lock:
            connections = list(self.connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                connection.close()
            except OSError:
                pass


class TLSServer(Server):
    """TLS on accept; a client that speaks plain HTTP to the TLS port is logged as
    "PLAIN <request line> <credential header names>" (what an eavesdropper would have read)."""

    def get_request(self):
        sock, addr = self.socket.accept()
        try:
            sock.settimeout(5)
            first = sock.recv(1, socket.MSG_PEEK)
            if first and first != b"\x16":
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    head += chunk
                lines = head.split(b"\r\n")
                names = [line.split(b":", 1)[0].decode("latin-1") for line in lines[1:] if b":" in line]
                creds = [h for h in ("CF-Access-Client-Id", "CF-Access-Client-Secret", "X-Admin-Key", "Authorization", "X-Api-Key")
                         if h.lower() in (n.lower() for n in names)]
                say("PLAIN %s %s" % (lines[0].decode("latin-1"), ",".join(creds) or "-"))
                sock.close()
                raise OSError("plain HTTP on the TLS port")
            sock.settimeout(None)
            return self.tls.wrap_socket(sock, server_side=True), addr
        except (OSError, ssl.SSLError):
            try:
                sock.close()
            except OSError:
                pass
            raise


def make_server(args):
    server = (TLSServer if args.tls else Server)((args.bind, args.port), Handler)
    server.args = args
    if args.tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls[0], args.tls[1])
        server.tls = context
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--count", type=int, default=1, help="serve COUNT consecutive ports from --port")
    parser.add_argument("--instance", default=None)
    parser.add_argument("--admin-key", default="test-admin-key")
    parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    parser.add_argument("--require-access", nargs=2, metavar=("ID", "SECRET"))
    parser.add_argument("--mode", default="ready")
    parser.add_argument("--api-key", default=None, help="require this inference key on /v1/*")
    parser.add_argument("--models", default="test/model", help="comma-separated loaded models")
    parser.add_argument("--heartbeat", type=float, default=30, help="seconds between /admin/events heartbeats")
    parser.add_argument("--profile", default="lan", choices=["lan", "cloud"], help="security_profile")
    parser.add_argument("--base-urls", default="", help="comma-separated endpoints.base_urls of the discovery document")
    parser.add_argument("--stream-chunks", type=int, default=20)
    parser.add_argument("--stream-interval", type=int, default=50, help="milliseconds between streamed chunks")
    args = parser.parse_args()
    args.models = [m for m in args.models.split(",") if m]
    args.base_urls = [u for u in args.base_urls.split(",") if u]
    if args.instance is None:
        args.instance = "%s:%d" % (socket.gethostname(), args.port)
    state["mode"] = args.mode
    extra = []
    for offset in range(1, args.count):
        other = argparse.Namespace(**vars(args))
        other.port = args.port + offset
        other.instance = "%s:%d" % (socket.gethostname(), other.port)
        extra.append(make_server(other))
    server = make_server(args)
    say("listening %s:%d" % (args.bind, args.port))
    for raw in sys.stdin:
        command = raw.strip().split()
        if not command:
            continue
        name = command[0]
        if name == "quit":
            break
        with lock:
            if name == "slow":
                state["delay"] = int(command[1]) / 1000.0
            elif name == "retry-after":
                state["retry_after"] = command[1]
            elif name == "instance":
                state["instance"] = command[1]
            elif name in ("load", "unload"):
                # A model loaded or unloaded: the discovery document changes and every
                # /admin/events subscriber is told.
                model = command[1]
                if name == "load" and model not in args.models:
                    args.models.append(model)
                if name == "unload" and model in args.models:
                    args.models.remove(model)
                for q in subscribers:
                    q.put(("model_loaded" if name == "load" else "model_unloaded", {"model_id": model}))
            elif name in ("busy", "idle"):
                state["busy"] = name == "busy"
            elif name == "cut":
                state["cut"] = int(command[1]) if len(command) > 1 else None
            elif name in ("mute", "unmute"):
                state["muted"] = name == "mute"
            elif name == "dead":
                if server is not None:
                    server.kill()
                    server = None
            elif name == "alive":
                if server is None:
                    server = make_server(args)
            else:
                state["mode"] = name
                state["delay"] = 0.0 if name != "hang" else state["delay"]
        say("ok " + " ".join(command))
    if server is not None:
        server.shutdown()


if __name__ == "__main__":
    main()
