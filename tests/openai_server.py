"""A protocol-faithful fake OpenAI-compatible model server (as vLLM, llama.cpp's server or LM Studio serve).

It follows OpenAI's chat-completions protocol as the `openai` SDK reads it (tests/unit/test_openai_server.py
checks it with the real SDK): `GET /v1/models`, `POST /v1/chat/completions` answering a `chat.completion` or,
with `stream: true`, `data: {chat.completion.chunk}` lines sent chunked and closed by `data: [DONE]`; `usage`;
`max_tokens` cutting the reply with `finish_reason: "length"`; `stop`; errors as
`{"error": {"message", "type", "param", "code"}}` with 400/401/404, and an error line mid-stream. Replies come
from the fake Ollama's deterministic "grounded model" (`default_responder`) or what a test queues in `replies`.

    with FakeOpenAI(models=["qwen3:8b"], api_key="k") as fake:
        openai.OpenAI(base_url=fake.base_url, api_key="k").chat.completions.create(...)

    python -m tests.openai_server --port 8080 --models qwen3:8b,qwen3:0.6b
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.ollama_server import Responder, default_responder, split_pieces

STREAM_ERROR = "The server had an error while processing your request."


class FakeOpenAI:
    def __init__(
        self,
        models: list[str] | None = None,
        *,
        api_key: str | None = None,
        token_delay_s: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        self.models: list[str] = list(models if models is not None else ["qwen3:8b", "qwen3:0.6b"])
        self.api_key = api_key
        self.token_delay_s = token_delay_s
        self.response_delay_s = 0.0  # before the headers: a server that takes long to answer (timeouts)
        self.error_after_tokens: int | None = None  # send an error line after N pieces
        self.responder: Responder = default_responder
        self.replies: list[str] = []
        self.requests: list[dict] = []
        self.host, self.port = host, port
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> FakeOpenAI:
        handler = type("Handler", (_Handler,), {"fake": self})
        server = _Server((self.host, self.port), handler)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-openai", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def reset(self) -> None:
        self.token_delay_s = 0.0
        self.response_delay_s = 0.0
        self.error_after_tokens = None
        self.responder = default_responder
        with self._lock:
            self.replies.clear()

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reply_for(self, model: str, messages: list[dict], body: dict) -> str:
        with self._lock:
            if self.replies:
                return self.replies.pop(0)
        return self.responder(model, messages, body)

    def log(self, path: str, body: dict) -> dict:
        entry = {"path": path, "body": body, "pieces_sent": 0, "finished": False, "aborted": False}
        with self._lock:
            self.requests.append(entry)
        return entry


class _Error(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param = status, code, param

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], OSError):  # a client hanging up is normal here
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeOpenAI"
    fake: FakeOpenAI

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._drain_body()
        try:
            self._authorize()
            path = self.path.split("?", 1)[0]
            if path == "/v1/models":
                now = int(time.time())
                data = [
                    {"id": m, "object": "model", "created": now, "owned_by": "fake"} for m in self.fake.models
                ]
                return self._json(200, {"object": "list", "data": data})
            raise _Error(404, f"Not found: {path}", "not_found")
        except _Error as exc:
            self._json(exc.status, exc.body())

    def do_POST(self) -> None:
        try:
            body = self._read_json()
            self._authorize()
            if self.path.split("?", 1)[0] != "/v1/chat/completions":
                raise _Error(404, f"Not found: {self.path}", "not_found")
            self._completions(body)
        except _Error as exc:
            self._json(exc.status, exc.body())

    # -- the endpoint ----------------------------------------------------------------------------------------

    def _completions(self, body: dict) -> None:
        model, messages = body.get("model"), body.get("messages")
        if not isinstance(model, str) or not model:
            raise _Error(400, "you must provide a model parameter", param="model")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise _Error(400, "'messages' must be a non-empty array of objects", param="messages")
        if model not in self.fake.models:
            raise _Error(404, f"The model `{model}` does not exist.", "model_not_found", "model")
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise _Error(400, "max_tokens must be a positive integer", param="max_tokens")
        entry = self.fake.log("/v1/chat/completions", body)
        if self.fake.response_delay_s:
            time.sleep(self.fake.response_delay_s)
        text = self.fake.reply_for(model, messages, body)
        pieces, finish = split_pieces(text), "stop"
        if limit is not None and limit < len(pieces):
            pieces, finish = pieces[:limit], "length"
        pieces = _apply_stop(pieces, body.get("stop"))
        usage = {
            "prompt_tokens": max(1, sum(len(str(m.get("content") or "")) for m in messages) // 4),
            "completion_tokens": len(pieces),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if not body.get("stream"):
            entry["pieces_sent"], entry["finished"] = len(pieces), True
            message = {"role": "assistant", "content": "".join(pieces), "refusal": None}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            return self._json(
                200,
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [choice],
                    "usage": usage,
                },
            )

        def chunk(delta: dict, finish_reason: str | None = None) -> dict:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [choice],
            }

        self._start_stream()
        try:
            self._event(chunk({"role": "assistant", "content": ""}))
            for i, piece in enumerate(pieces):
                if self.fake.error_after_tokens is not None and i >= self.fake.error_after_tokens:
                    self._event(_Error(500, STREAM_ERROR, "server_error").body())
                    self._end_stream()
                    return
                if i and self.fake.token_delay_s:
                    time.sleep(self.fake.token_delay_s)
                self._event(chunk({"content": piece}))
                entry["pieces_sent"] = i + 1
            entry["finished"] = True
            self._event(chunk({}, finish))
            if (body.get("stream_options") or {}).get("include_usage"):
                self._event({**chunk({}), "choices": [], "usage": usage})
            self._raw(b"data: [DONE]\n\n")
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError):
            entry["aborted"] = True  # the client went away: stop generating, as a real server does
            self.close_connection = True

    # -- plumbing ------------------------------------------------------------------------------------------

    def _authorize(self) -> None:
        key = self.fake.api_key
        if key is not None and self.headers.get("Authorization") != f"Bearer {key}":
            raise _Error(401, "Incorrect API key provided.", "invalid_api_key")

    def _read_json(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise _Error(400, "We could not parse the JSON body of your request.") from None
        if not isinstance(body, dict):
            raise _Error(400, "The request body must be a JSON object.")
        return body

    def _drain_body(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)

    def _json(self, status: int, data: dict) -> None:
        payload = json.dumps(data, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def _event(self, obj: dict) -> None:
        self._raw(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

    def _raw(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _apply_stop(pieces: list[str], stop: object) -> list[str]:
    stops = [stop] if isinstance(stop, str) else [s for s in stop or [] if isinstance(s, str) and s]
    text = "".join(pieces)
    cuts = [at for s in stops if (at := text.find(s)) >= 0]
    if not cuts:
        return pieces
    kept, length = [], min(cuts)
    for piece in pieces:
        if length <= 0:
            break
        kept.append(piece[:length])
        length -= len(piece)
    return kept


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A fake OpenAI-compatible server for benches and demos.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--tokens-per-second", type=float, default=20.0, help="0 for no delay")
    parser.add_argument("--models", default="qwen3:8b,qwen3:0.6b", help="comma-separated model ids")
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args(argv)
    delay = 1.0 / args.tokens_per_second if args.tokens_per_second > 0 else 0.0
    fake = FakeOpenAI(
        [m.strip() for m in args.models.split(",") if m.strip()],
        api_key=args.api_key,
        token_delay_s=delay,
        host=args.host,
        port=args.port,
    )
    fake.start()
    print(f"fake OpenAI-compatible server at {fake.base_url} serving {', '.join(fake.models)}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)
    fake.stop()


if __name__ == "__main__":
    main()
