#!/usr/bin/env python3
"""Uses the official `openai` Python SDK against a base URL, as a user's program would: with a
placeholder key (the SDK refuses to start without one). Prints one JSON object with what came back.

Usage: openai-sdk-client.py BASE_URL [MODEL]
Needs the `openai` package (the test bed's venv installs it).
"""
import json
import sys

import openai


def main():
    base, model = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "test/model")
    client = openai.OpenAI(base_url=base, api_key="sk-placeholder-not-a-real-key", max_retries=0, timeout=20)
    out = {"sdk": openai.__version__}
    out["models"] = [m.id for m in client.models.list().data]
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    out["chat"] = chat.choices[0].message.content
    pieces = []
    for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    out["stream_chunks"] = len(pieces)
    # An error the gateway answers itself: the SDK must read its shape (status, code, type).
    try:
        client.chat.completions.create(model="no/such-model", messages=[{"role": "user", "content": "hi"}])
        out["error"] = None
    except openai.APIStatusError as error:
        out["error"] = {"status": error.status_code, "code": error.code, "type": error.type, "message": str(error.message)[:200]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
