"""A protocol-faithful fake Ollama server: the one stand-in the tests and benches use.

It follows Ollama's own API description (shared/fixtures/ollama-api-spec/): the same paths, NDJSON streams sent
with chunked transfer encoding, the same final `done` object with durations in nanoseconds, the same error
shapes (`{"error": "..."}` with 400/404, an error line mid-stream). Replies come from `default_responder`, a
small deterministic "grounded model", or from whatever a test puts in `replies` / `responder`.

    with FakeOllama(models=["qwen3:8b"], token_delay_s=0.05) as fake:
        ollama.Client(host=fake.url).chat(model="qwen3:8b", messages=[...])

    python -m tests.ollama_server --port 11434 --tokens-per-second 20 --models qwen3:8b,qwen3:0.6b
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Responder = Callable[[str, list[dict], dict], str]

VERSION = "0.12.6"
# The models the fake serves by default, and what a worker (or gateway test stack) is given to use them through
# the Ollama backend: `{"OLLAMA_HOST": fake.url, **OLLAMA_ENV}`.
MODELS = ["qwen3:8b", "qwen3:0.6b"]
OLLAMA_ENV = {"LLM_BACKEND": "ollama", "GENERATION_MODEL": MODELS[0], "UTILITY_MODEL": MODELS[1]}
EMBED_DIMS = 384
STREAM_ERROR = "an error was encountered while running the model"


# -- the default "model" --------------------------------------------------------------------------------------

_SOURCE_MARK = re.compile(r"^\[S(\d+)\]", re.MULTILINE)
_WORD = re.compile(r"[a-z0-9]+")


def default_responder(model: str, messages: list[dict], request: dict) -> str:
    """Behave like a small grounded model, deterministically (see the module docstring of the test suite)."""
    contents = [str(m.get("content") or "") for m in messages]
    last_user = next((str(m.get("content") or "") for m in reversed(messages) if m.get("role") == "user"), "")
    if any("answer yes or no" in line.lower() for text in contents for line in text.splitlines()):
        return "YES"
    sources = _sources(m for m in messages if m.get("role") in ("system", "user"))
    if sources:
        query = set(_WORD.findall(last_user.lower()))
        ref, block = max(sources, key=lambda s: (len(query & set(_WORD.findall(s[1].lower()))), -s[0]))
        return f"According to the sources, {_first_sentence(block)} [S{ref}]."
    if "rewrite" in last_user.lower() or "standalone" in last_user.lower():
        questions = [ln for ln in last_user.splitlines() if ln.strip().startswith("Question:")]
        if questions:
            return questions[-1].strip()[len("Question:") :].strip()
    return f"Hello! I am a test model. You said: {last_user[:80]}"


def _sources(messages: Iterator[dict]) -> list[tuple[int, str]]:
    """The `[Sn] ...` blocks of the messages: each runs from its mark to the next mark (or the end)."""
    blocks: list[tuple[int, str]] = []
    for message in messages:
        text = str(message.get("content") or "")
        marks = list(_SOURCE_MARK.finditer(text))
        for i, mark in enumerate(marks):
            end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
            blocks.append((int(mark.group(1)), text[mark.end() : end].strip()))
    return blocks


def _first_sentence(block: str) -> str:
    lines = [ln.strip() for ln in block.splitlines() if ln.strip()]
    # A header line such as "policy.pdf, page 3" (no closing punctuation) is not what the answer quotes.
    if len(lines) > 1 and not lines[0].endswith((".", "!", "?")):
        lines = lines[1:]
    text = re.sub(r"^\([^)]*\)\s*", "", " ".join(lines))
    sentence = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    words = sentence.split()
    if len(words) > 40:  # lists and tables have no full stop for a long way: quote a sentence's worth
        sentence = " ".join(words[:40])
    return sentence.rstrip(".!?:")


def split_pieces(text: str) -> list[str]:
    """One word and its trailing whitespace per piece; joined back they give the text exactly."""
    return re.findall(r"\s*\S+\s*", text) or ([text] if text else [])


# -- the server -----------------------------------------------------------------------------------------------


def full_name(name: str) -> str:
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last else f"{name}:latest"


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def hashed_embedding(text: str, dims: int = EMBED_DIMS) -> list[float]:
    """A deterministic unit vector: hashed bag of words, so texts sharing words point the same way."""
    vector = [0.0] * dims
    words = _WORD.findall(text.lower()) or [""]
    for word in words:
        digest = hashlib.sha256(word.encode()).digest()
        index = int.from_bytes(digest[:4], "big") % dims
        vector[index] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


class _BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class FakeOllama:
    def __init__(
        self,
        models: list[str] | None = None,
        token_delay_s: float = 0.0,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        self.models: list[str] = list(models if models is not None else MODELS)
        self.token_delay_s = token_delay_s
        self.fail_after_tokens: int | None = None  # drop the connection after N pieces, no final line
        self.error_after_tokens: int | None = None  # send an {"error"} line after N pieces
        self.responder: Responder = default_responder
        self.replies: list[str] = []
        self.requests: list[dict] = []
        self.host, self.port = host, port
        self._lock = threading.Lock()
        self._loaded: dict[str, float] = {}
        self._connections: set[socket.socket] = set()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._down = False

    # -- lifecycle -----------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FakeOllama:
        handler = type("Handler", (_Handler,), {"fake": self})
        server = _Server((self.host, self.port), handler)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-ollama-{self.port}",
            daemon=True,
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

    def set_down(self, down: bool) -> None:
        """Down: as if Ollama stopped. Connections are refused and open ones (keep-alive, streams) are cut.

        Up again: listening on the same port.
        """
        if down and not self._down:
            self.stop()
            with self._lock:
                open_connections = list(self._connections)
            for connection in open_connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
        elif not down and self._down:
            self.start()
        self._down = down

    def reset(self, token_delay_s: float = 0.0) -> None:
        """Back to a healthy server with the default responder, for the next test after one that tweaked it."""
        self.set_down(False)
        self.token_delay_s = token_delay_s
        self.fail_after_tokens = None
        self.error_after_tokens = None
        with self._lock:
            self.replies.clear()
        self.responder = default_responder

    def __enter__(self) -> FakeOllama:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the handler asks -------------------------------------------------------------------------------

    def has(self, model: str) -> bool:
        want = full_name(model)
        return any(full_name(m) == want for m in self.models)

    def reply_for(self, model: str, messages: list[dict], body: dict) -> str:
        with self._lock:
            if self.replies:
                return self.replies.pop(0)
        return self.responder(model, messages, body)

    def log(self, path: str, body: dict) -> dict:
        entry = {"path": path, "body": body, "pieces_sent": 0, "finished": False, "aborted": False}
        with self._lock:
            self.requests.append(entry)
            self._loaded[full_name(body.get("model", ""))] = time.time()
        return entry

    def loaded_models(self) -> list[str]:
        with self._lock:
            return [m for m in self._loaded if self.has(m)]

    def tags(self) -> list[dict]:
        return [_model_entry(full_name(m)) for m in list(self.models)]


def _model_entry(name: str) -> dict:
    digest = hashlib.sha256(name.encode()).hexdigest()
    family = name.split(":")[0].split("/")[-1].rstrip("0123456789.") or "llama"
    return {
        "name": name,
        "model": name,
        "modified_at": "2025-05-10T08:06:48.639712648-07:00",
        "size": 500_000_000 + int(digest[:6], 16),
        "digest": digest,
        "details": {
            "parent_model": "",
            "format": "gguf",
            "family": family,
            "families": [family],
            "parameter_size": "8.2B",
            "quantization_level": "Q4_K_M",
        },
    }


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Ollama accepts a burst of connections; the stdlib's backlog of 5 resets them under 100 concurrent streams.
    request_queue_size = 512

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-reply is normal here (cancellation tests); anything else is still shown.
        import sys

        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 so streams go out chunked, as Ollama's do: a stream cut short is then visibly incomplete.
    protocol_version = "HTTP/1.1"
    server_version = "FakeOllama"
    fake: FakeOllama

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def setup(self) -> None:
        super().setup()
        with self.fake._lock:
            self.fake._connections.add(self.connection)

    def finish(self) -> None:
        with self.fake._lock:
            self.fake._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    # -- routing -------------------------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        if self.path == "/":
            self._send(200, b"", "text/plain; charset=utf-8", length=len(b"Ollama is running"))
        else:
            self._send(404, b"", "text/plain; charset=utf-8", length=len(b"404 page not found"))

    def do_GET(self) -> None:
        routes = {
            "/": lambda: self._send(200, b"Ollama is running", "text/plain; charset=utf-8"),
            "/api/tags": lambda: self._json(200, {"models": self.fake.tags()}),
            "/api/version": lambda: self._json(200, {"version": VERSION}),
            "/api/ps": self._ps,
        }
        route = routes.get(self.path.split("?", 1)[0])
        if route is None:
            return self._not_found()
        self._drain_body()
        route()

    def do_POST(self) -> None:
        routes = {
            "/api/chat": self._chat,
            "/api/generate": self._generate,
            "/api/embed": self._embed,
            "/api/show": self._show,
        }
        route = routes.get(self.path.split("?", 1)[0])
        if route is None:
            self._drain_body()
            return self._not_found()
        try:
            body = self._read_json()
            route(body)
        except _BadRequest as exc:
            self._json(exc.status, {"error": str(exc)})

    # -- endpoints -------------------------------------------------------------------------------------------

    def _chat(self, body: dict) -> None:
        model = self._model(body)
        messages = body.get("messages") or []
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise _BadRequest("invalid message format")
        entry = self.fake.log("/api/chat", body)
        if not messages:  # an empty chat loads (or with keep_alive 0, unloads) the model
            return self._json(
                200,
                {
                    "model": model,
                    "created_at": now_rfc3339(),
                    "message": {"role": "assistant", "content": ""},
                    "done_reason": _load_reason(body),
                    "done": True,
                },
            )
        text = self.fake.reply_for(model, messages, body)
        self._reply(
            body, entry, model, text, lambda piece: {"message": {"role": "assistant", "content": piece}}
        )

    def _generate(self, body: dict) -> None:
        model = self._model(body)
        prompt = body.get("prompt") or ""
        if not isinstance(prompt, str):
            raise _BadRequest("prompt must be a string")
        entry = self.fake.log("/api/generate", body)
        if not prompt:
            return self._json(
                200,
                {
                    "model": model,
                    "created_at": now_rfc3339(),
                    "response": "",
                    "done_reason": _load_reason(body),
                    "done": True,
                },
            )
        messages = [{"role": "system", "content": body["system"]}] if body.get("system") else []
        messages.append({"role": "user", "content": prompt})
        text = self.fake.reply_for(model, messages, body)
        self._reply(body, entry, model, text, lambda piece: {"response": piece})

    def _embed(self, body: dict) -> None:
        model = self._model(body)
        inputs = body.get("input", [])
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
            raise _BadRequest("invalid input type")
        dims = body.get("dimensions") or EMBED_DIMS
        if not isinstance(dims, int) or dims < 1:
            raise _BadRequest("dimensions must be a positive integer")
        self.fake.log("/api/embed", body)
        self._json(
            200,
            {
                "model": model,
                "embeddings": [hashed_embedding(t, dims) for t in inputs],
                "total_duration": 14_143_917,
                "load_duration": 1_019_500,
                "prompt_eval_count": sum(len(t.split()) for t in inputs),
            },
        )

    def _show(self, body: dict) -> None:
        model = self._model(body)
        entry = _model_entry(full_name(model))
        self._json(
            200,
            {
                "modelfile": f'# Modelfile generated by "ollama show"\nFROM {full_name(model)}\n',
                "parameters": 'stop                           "<|im_end|>"',
                "template": "{{ .Prompt }}",
                "details": entry["details"],
                "model_info": {
                    "general.architecture": entry["details"]["family"],
                    "general.parameter_count": 8_190_735_360,
                    f"{entry['details']['family']}.context_length": 40960,
                },
                "capabilities": ["completion", "tools", "thinking"],
                "modified_at": entry["modified_at"],
            },
        )

    def _ps(self) -> None:
        expires = datetime.fromtimestamp(time.time() + 300, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        models = [
            {**_model_entry(name), "expires_at": expires, "size_vram": 0}
            for name in self.fake.loaded_models()
        ]
        for m in models:
            m.pop("modified_at")
        self._json(200, {"models": models})

    # -- the reply -----------------------------------------------------------------------------------------

    def _reply(self, body: dict, entry: dict, model: str, text: str, payload: Callable[[str], dict]) -> None:
        started = time.monotonic_ns()
        pieces = split_pieces(text)
        options = body.get("options") or {}
        limit = options.get("num_predict") if isinstance(options, dict) else None
        done_reason = "stop"
        if isinstance(limit, int) and 0 <= limit < len(pieces):
            pieces, done_reason = pieces[:limit], "length"
        prompt_chars = sum(len(str(m.get("content") or "")) for m in body.get("messages") or []) + len(
            str(body.get("prompt") or "")
        )
        stats = {
            "done_reason": done_reason,
            "total_duration": 0,
            "load_duration": 1_334_875,
            "prompt_eval_count": max(1, prompt_chars // 4),
            "prompt_eval_duration": 24_573_166,
            "eval_count": len(pieces),
            "eval_duration": 0,
        }

        def final(content: str) -> dict:
            elapsed = time.monotonic_ns() - started
            return {
                "model": model,
                "created_at": now_rfc3339(),
                **payload(content),
                "done": True,
                **stats,
                "total_duration": elapsed + 1_334_875,
                "eval_duration": max(elapsed, 1),
            }

        if body.get("stream") is False:
            if self.fake.token_delay_s:
                time.sleep(self.fake.token_delay_s * len(pieces))
            entry["pieces_sent"] = len(pieces)
            entry["finished"] = True
            return self._json(200, final("".join(pieces)))

        self._start_stream()
        try:
            for i, piece in enumerate(pieces):
                if self.fake.fail_after_tokens is not None and i >= self.fake.fail_after_tokens:
                    self._abort()  # no final line, no closing chunk: as if Ollama died
                    return
                if self.fake.error_after_tokens is not None and i >= self.fake.error_after_tokens:
                    self._chunk({"error": STREAM_ERROR})
                    self._end_stream()
                    return
                if i and self.fake.token_delay_s:
                    time.sleep(self.fake.token_delay_s)
                self._chunk({"model": model, "created_at": now_rfc3339(), **payload(piece), "done": False})
                entry["pieces_sent"] = i + 1
            # Generation is over before the final line goes out (as in Ollama): mark it first, or a client
            # that returns on the `done` line could look at the log before this thread gets to it.
            entry["finished"] = True
            self._chunk(final(""))
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError):
            entry["aborted"] = True  # what cancellation tests wait for
            self.close_connection = True  # the client went away: stop generating, as Ollama does

    # -- plumbing ------------------------------------------------------------------------------------------

    def _model(self, body: dict) -> str:
        model = body.get("model")
        if not model:
            raise _BadRequest("model is required")
        if not isinstance(model, str):
            raise _BadRequest("model must be a string")
        if not self.fake.has(model):
            raise _BadRequest(f'model "{model}" not found, try pulling it first', status=404)
        return model

    def _read_json(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw.strip():
            raise _BadRequest("missing request body")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _BadRequest(f"invalid character in request body: {exc}") from None
        if not isinstance(body, dict):
            raise _BadRequest("request body must be a JSON object")
        return body

    def _drain_body(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)

    def _not_found(self) -> None:
        self._send(404, b"404 page not found", "text/plain; charset=utf-8")

    def _json(self, status: int, data: dict) -> None:
        self._send(
            status, json.dumps(data, separators=(",", ":")).encode(), "application/json; charset=utf-8"
        )

    def _send(self, status: int, data: bytes, content_type: str, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data) if length is None else length))
        self.send_header("Date", self.date_time_string())
        self.end_headers()
        if data:
            self.wfile.write(data)

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def _chunk(self, obj: dict) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _abort(self) -> None:
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _load_reason(body: dict) -> str:
    return "unload" if body.get("keep_alive") in (0, "0", "0s") else "load"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A fake Ollama server for benches and manual demos.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=11434)
    parser.add_argument("--tokens-per-second", type=float, default=20.0, help="0 for no delay")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated model tags")
    args = parser.parse_args(argv)
    delay = 1.0 / args.tokens_per_second if args.tokens_per_second > 0 else 0.0
    fake = FakeOllama(
        models=[m.strip() for m in args.models.split(",") if m.strip()],
        token_delay_s=delay,
        host=args.host,
        port=args.port,
    )
    fake.start()
    print(
        f"fake Ollama at {fake.url} serving {', '.join(fake.models)} at {args.tokens_per_second} tokens/s",
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        fake.stop()


if __name__ == "__main__":
    main()
