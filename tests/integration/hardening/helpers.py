"""Shared pieces of the issue-27 regression tests: a worker whose working directory is a temporary folder,
a fake-model responder that writes a fixed SQL query, and a loopback listener that records every request."""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.ollama_server import OLLAMA_ENV, default_responder
from tests.servers import ROOT, ServerProcess, free_port

# A prompt override for the SQL prompt: the worker sends it to the model as its system prompt, which is how a
# user steered the query in the report; here it tells the fake model's responder which request writes SQL.
SQL_PROMPT = "HARDENING-27: write one DuckDB SELECT for the question."

NUMBERS_CSV = "n\n" + "".join(f"{i}\n" for i in range(1000))


def writes_sql(sql: str):
    """A responder that answers the overridden SQL prompt with `sql`, and behaves as the default otherwise."""

    def respond(model, messages, request):
        if messages and messages[0].get("content") == SQL_PROMPT:
            return sql
        return default_responder(model, messages, request)

    return respond


def sql_requests(fake) -> list[dict]:
    """The requests the fake Ollama received (`{"path", "body"}` each) that carry the overridden SQL prompt."""
    return [r for r in list(fake.requests) if SQL_PROMPT in str((r.get("body") or {}).get("messages"))]


def worker_in(tmp: Path, ollama_url: str, **env: str) -> ServerProcess:
    """The real worker (gunicorn + gevent) started with `tmp` as its working directory, so anything it writes
    relative to its cwd (DuckDB's default spill folder `.tmp`) lands where the test can see it."""
    port = free_port()
    base = {
        "INDEX_STORE": str(tmp / "index_store"),
        "UPLOADS_DIR": str(tmp / "shared_uploads"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WORKER_WORKERS": "1",
        "PYTHONPATH": str(ROOT),
        "OLLAMA_HOST": ollama_url,
        "OVERVIEW_SUMMARIES": "off",
        **OLLAMA_ENV,
    }
    run_dir = tmp / "cwd"
    run_dir.mkdir(parents=True, exist_ok=True)
    return ServerProcess(
        [sys.executable, "-m", "rag_worker", "serve", "--port", str(port)],
        port,
        {**base, **env},
        tmp / "logs" / f"worker-{port}.log",
        cwd=run_dir,
    )


class Listener:
    """A loopback HTTP server that answers 200 to anything and records each request line: a stand-in for an
    internal address (a metadata service, the worker itself) that an uploaded file must not make anyone fetch."""

    def __init__(self):
        hits = self.hits = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's naming)
                hits.append(f"{self.command} {self.path}")
                body = b"\x89PNG\r\n\x1a\n"
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_HEAD = do_POST = do_PROPFIND = do_OPTIONS = do_GET  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> Listener:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
