#!/usr/bin/env python3
"""Checks a running lmx-agentd against docs/openapi.yaml: every documented operation is called
on its socket, and each answer's status must be documented for it and its JSON must match the
documented schema (JSON Schema 2020-12, as OpenAPI 3.1 uses). Also fails when an operation of the
document was never exercised, so the document cannot fall behind the daemon unnoticed.

Usage: check-openapi.py SOCKET PAIRING_TEXT [--spec docs/openapi.yaml]
  PAIRING_TEXT: a valid pairing payload to import and remove again (the socket's user must be
  root or the daemon's). Needs PyYAML and jsonschema (make test puts them in the test venv).
Exit 0 all answers match, 1 a mismatch (each printed), 2 usage or setup error.
"""
import argparse
import http.client
import json
import os
import socket
import sys
import urllib.parse

import jsonschema
import yaml


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=10)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("socket")
    parser.add_argument("pairing")
    parser.add_argument("--spec", default=os.path.join(os.path.dirname(__file__), "..", "..", "docs", "openapi.yaml"))
    args = parser.parse_args()
    spec = yaml.safe_load(open(args.spec))
    components = spec["components"]
    problems, exercised, checked = [], set(), 0

    def operation(method, path):
        template = path.split("?", 1)[0]
        if template.startswith("/v1/pairings/"):
            template = "/v1/pairings/{id}"
        op = spec["paths"].get(template, {}).get(method.lower())
        return template, op

    def call(method, path, body=None, stream_line=False):
        nonlocal checked
        template, op = operation(method, path)
        if op is None:
            problems.append("%s %s: not in the document" % (method, path))
            return None, None
        exercised.add((method.lower(), template))
        conn = UnixConnection(args.socket)
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data else {}
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.readline() if stream_line else response.read()
        conn.close()
        status = str(response.status)
        documented = op["responses"].get(status)
        if documented is None:
            problems.append("%s %s: status %s is not documented (%s)" % (method, path, status, sorted(op["responses"])))
            return response.status, None
        content = documented.get("content", {})
        ctype = (response.getheader("Content-Type") or "").split(";")[0].strip()
        if "text/plain" in content:
            checked += 1
            return response.status, raw
        media = content.get("application/json") or content.get("application/x-ndjson")
        if media is None:
            return response.status, raw
        if stream_line:
            raw = raw.strip()
        try:
            value = json.loads(raw)
        except ValueError:
            problems.append("%s %s: %s answered with a body that is not JSON (%s)" % (method, path, status, ctype))
            return response.status, None
        schema = dict(media["schema"])
        schema["components"] = components
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        validator = jsonschema.Draft202012Validator(schema)
        for error in sorted(validator.iter_errors(value), key=str)[:5]:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            problems.append("%s %s %s: at %s: %s" % (method, path, status, where, error.message[:200]))
        checked += 1
        return response.status, value

    call("GET", "/v1/active")
    call("GET", "/v1/status")
    call("GET", "/v1/servers")
    call("GET", "/v1/resolve?model=" + urllib.parse.quote("test/model"))
    call("GET", "/v1/resolve?model=no-such-model")
    call("GET", "/v1/resolve")
    call("GET", "/v1/events?limit=50")
    call("GET", "/v1/traffic")
    status, history = call("GET", "/v1/history?since=1h")
    if status == 200 and history is not None and not history.get("routes"):
        problems.append("GET /v1/history: no route in the last hour of an agent with routes")
    call("GET", "/v1/history?since=7d&step=1h")
    if call("GET", "/v1/history?since=yesterday")[0] != 400:
        problems.append("GET /v1/history?since=yesterday: not refused with 400")
    call("POST", "/v1/refresh")
    call("GET", "/v1/pairings")
    _, imported = call("POST", "/v1/pairings", {"payloads": [{"text": args.pairing}]})
    call("POST", "/v1/pairings", {"payloads": [{"text": "opta-lmx://pair?v=9&url=https%3A%2F%2Fx.example"}]})
    call("POST", "/v1/pairings", {"not": "an upload"})
    call("GET", "/v1/pairings")
    pairing_id = imported[0]["pairing"]["id"] if isinstance(imported, list) and imported else "p00000000"
    call("DELETE", "/v1/pairings/" + pairing_id)
    call("DELETE", "/v1/pairings/" + pairing_id)
    call("GET", "/v1/watch", stream_line=True)
    call("GET", "/metrics")

    documented = {(method, path) for path, ops in spec["paths"].items() for method in ops}
    for method, path in sorted(documented - exercised):
        problems.append("%s %s: documented but not exercised by this check" % (method.upper(), path))
    for problem in problems:
        print("check-openapi: " + problem, file=sys.stderr)
    if problems:
        return 1
    print("check-openapi: %d answers from %d operations match docs/openapi.yaml" % (checked, len(documented)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
