"""The floor for bench.concurrency: a bare gevent relay of the fake Ollama's stream (Flask on gunicorn+gevent, no
RAG, no database), so the bench can show what the worker and gateway add on top of merely relaying tokens.

    OLLAMA_HOST=http://127.0.0.1:11434 python -m gunicorn -k gevent -b 127.0.0.1:8009 bench.floor_relay:app
"""

from __future__ import annotations

import json
import os

import httpx
from flask import Flask, Response, request, stream_with_context

app = Flask("floor_relay")
OLLAMA = os.environ.get("OLLAMA_HOST", "http://127.0.0.1:11434").rstrip("/")
MODEL = os.environ.get("GENERATION_MODEL", "qwen3:8b")
# One pooled client, as the worker keeps one: building a client per request (its TLS context) costs CPU.
CLIENT = httpx.Client(timeout=120, limits=httpx.Limits(max_connections=2000, max_keepalive_connections=200))


def frame(event: str, data: object) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


@app.get("/health")
def health():
    return {"ok": True}


@app.post("/chat_stream")
def chat_stream():
    prompt = str((request.get_json(silent=True) or {}).get("prompt", ""))
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "stream": True}

    def frames():
        with CLIENT.stream("POST", OLLAMA + "/api/chat", json=body) as r:
            for line in r.iter_lines():
                if not line:
                    continue
                data = json.loads(line)
                if data.get("done"):
                    break
                yield frame("token", {"token": data["message"]["content"]})
        yield frame("done", {})

    return Response(stream_with_context(frames()), mimetype="text/event-stream")
