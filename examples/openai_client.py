#!/usr/bin/env python3
"""Talk to whichever Opta LMX server lmx-agentd says is active, the OpenAI way.

Asks `lmx-status --url` for the endpoint (LAN or tunnel, as the agent decides right now), then
lists the server's models and sends one chat message. With the `openai` package installed it
uses the OpenAI SDK; without it, plain HTTP from the standard library does the same.

    examples/openai_client.py "Say hello"
    examples/openai_client.py --models-only

Environment: LMX_STATUS (the lmx-status command, default: lmx-status from the PATH),
OPENAI_API_KEY (the server's inference key, if it has one), LMX_MODEL (default: the first
model the server lists). The agent never hands out keys: a client brings its own.
Exit codes: 0 done, 1 no active endpoint, 69 the agent is not running, 2 the server failed.
"""
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request


def active_base_url():
    command = os.environ.get("LMX_STATUS", "lmx-status")
    try:
        done = subprocess.run([command, "--url"], capture_output=True, text=True, timeout=10)
    except FileNotFoundError:
        sys.exit(f"openai_client: {command} not found; install lmx-agent or set LMX_STATUS")
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        sys.exit(done.returncode)
    return done.stdout.strip() + "/v1"


def with_sdk(base_url, key, prompt, models_only):
    from openai import OpenAI  # noqa: imported only when installed

    client = OpenAI(base_url=base_url, api_key=key or "not-needed")
    models = [m.id for m in client.models.list().data]
    if models_only or not models:
        return models, None
    answer = client.chat.completions.create(
        model=os.environ.get("LMX_MODEL", models[0]), messages=[{"role": "user", "content": prompt}])
    return models, answer.choices[0].message.content


def with_http(base_url, key, prompt, models_only):
    def call(path, body=None):
        request = urllib.request.Request(base_url + path, data=None if body is None else json.dumps(body).encode())
        request.add_header("Content-Type", "application/json")
        if key:
            request.add_header("Authorization", "Bearer " + key)
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.load(response)

    models = [m["id"] for m in call("/models")["data"]]
    if models_only or not models:
        return models, None
    answer = call("/chat/completions", {
        "model": os.environ.get("LMX_MODEL", models[0]),
        "messages": [{"role": "user", "content": prompt}],
    })
    return models, answer["choices"][0]["message"]["content"]


def main():
    args = sys.argv[1:]
    models_only = "--models-only" in args
    prompt = " ".join(a for a in args if a != "--models-only") or "Say hello in five words."
    base_url = active_base_url()
    key = os.environ.get("OPENAI_API_KEY", "")
    print(f"endpoint: {base_url}")
    try:
        import openai  # noqa: F401

        run = with_sdk
    except ImportError:
        run = with_http
    try:
        models, reply = run(base_url, key, prompt, models_only)
    except Exception as error:  # the SDK's errors and urllib's alike: report, exit 2
        print(f"openai_client: {base_url} failed: {error}", file=sys.stderr)
        sys.exit(2)
    print("models: " + (", ".join(models) or "(none loaded)"))
    if reply is not None:
        print("reply: " + reply)


if __name__ == "__main__":
    main()
