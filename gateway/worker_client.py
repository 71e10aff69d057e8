"""The worker's HTTP API as the gateway uses it (docs/design/WORKER_API.md), over one pooled httpx.AsyncClient.

Plain requests are answered here as JSON; streamed ones are opened through gateway/streams.py, which owns them.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx

from . import ranges
from .errors import WorkerFailed
from .leanhttp import LeanPool
from .netio import AsyncioTransport
from .settings import Settings
from .streams import WorkerStream, open_stream, send_once_more, unreachable, worker_error
from .telemetry import outgoing_headers

log = logging.getLogger("gateway.worker")


def without_credentials(url: str) -> tuple[str, httpx.BasicAuth | None]:
    """`http://user:pass@worker:8001` -> (`http://worker:8001`, Basic auth): the password travels in the header
    only, never in a URL that httpx logs (`HTTP Request: GET ...` at INFO) or a message shows."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    auth = httpx.BasicAuth(unquote(parts.username or ""), unquote(parts.password or ""))
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])), auth


class WorkerClient:
    def __init__(self, settings: Settings, transport: httpx.AsyncBaseTransport | None = None):
        headers = {}
        if settings.worker_api_key is not None and settings.worker_api_key.get_secret_value().strip():
            headers["Authorization"] = f"Bearer {settings.worker_api_key.get_secret_value()}"
        self.settings = settings
        limits = httpx.Limits(
            max_connections=settings.worker_max_connections,
            max_keepalive_connections=min(100, settings.worker_max_connections),
            # Idle connections are dropped here well before the worker's keep-alive (WORKER_KEEPALIVE, 75 s)
            # closes them there; one the worker closes at the moment it is reused still fails before any answer,
            # which the idempotent requests survive (streams.send_once_more).
            keepalive_expiry=5.0,
        )
        base_url, auth = without_credentials(settings.worker_url.rstrip("/"))
        timeout = httpx.Timeout(connect=5.0, read=settings.worker_read_timeout_s, write=60.0, pool=60.0)
        # A chat turn's stream, the gateway's hot path, skips httpx on a plain-HTTP worker (gateway/leanhttp.py);
        # a transport given here (and TLS) keeps every request on httpx.
        self.lean: LeanPool | None = None
        url = httpx.URL(base_url)
        if transport is None and url.scheme == "http" and url.host:
            self.lean = LeanPool(
                url.host,
                url.port or 80,
                timeout=timeout,
                max_connections=settings.worker_max_connections,
                keepalive_expiry=limits.keepalive_expiry or 5.0,
                headers=headers,
                auth=auth,
            )
        self._path_prefix = urlsplit(base_url).path.rstrip("/")
        self.http = httpx.AsyncClient(
            base_url=base_url,
            auth=auth,
            headers=headers,
            timeout=timeout,
            limits=limits,
            # asyncio's own transports under httpcore (gateway/netio.py) instead of anyio's wrappers
            transport=transport or AsyncioTransport(limits=limits),
        )

    async def aclose(self) -> None:
        if self.lean is not None:
            await self.lean.aclose()
        await self.http.aclose()

    async def request_json(
        self,
        method: str,
        path: str,
        *,
        timeout: float | None = None,
        idempotent: bool = False,
        **kwargs: Any,
    ) -> Any:
        """One request answered as JSON. `idempotent`: sending it twice does what sending it once does (GETs are),
        so a connection that failed before any answer is tried once more on a fresh one."""
        extra = {"timeout": timeout} if timeout is not None else {}
        request = self.http.build_request(method, path, **kwargs, **extra)
        try:
            resp = await send_once_more(self.http, request, retry=idempotent or method == "GET")
            try:
                await resp.aread()
            finally:
                await resp.aclose()
        except httpx.TransportError as exc:
            raise unreachable(self.settings.worker_url, exc) from None
        except httpx.HTTPError as exc:  # an answer that cannot be read (a broken content encoding)
            raise WorkerFailed(f"the worker's answer could not be read ({type(exc).__name__})") from None
        if resp.status_code >= 400:
            raise worker_error(resp, resp.content)
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            raise WorkerFailed("the worker answered with something that is not JSON") from None

    async def open(self, method: str, path: str, *, idempotent: bool = False, **kwargs: Any) -> WorkerStream:
        """A streamed answer with a 2xx status; a refusal or failure before the body is raised as ApiError.
        `idempotent` as for `request_json`."""
        request = self.http.build_request(method, path, **kwargs)
        retry = idempotent or method == "GET"
        return await open_stream(self.http, request, self.settings.worker_url, retry=retry)

    # The routes, one method each.

    async def chat_stream(self, payload: dict) -> WorkerStream:
        """One turn as SSE: step, documents, token, then done (the answer) or error. Never sent twice (the
        worker would run the turn twice)."""
        if self.lean is None:
            return await self.open("POST", "/chat_stream", json=payload)
        # The JSON httpx would send (its encode_json).
        body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
        headers = {"Content-Type": "application/json", **outgoing_headers()}
        try:
            resp = await self.lean.send("POST", self._path_prefix + "/chat_stream", body, headers)
            if resp.status_code >= 400:
                try:
                    answer = await resp.aread()
                finally:
                    await resp.aclose()
                raise worker_error(resp, answer)  # type: ignore[arg-type]  (answers what it reads of one)
        except httpx.TransportError as exc:
            raise unreachable(self.settings.worker_url, exc) from None
        except httpx.DecodingError:
            raise WorkerFailed("the worker's answer could not be read (DecodingError)") from None
        return WorkerStream(resp)  # type: ignore[arg-type]

    async def build_index(self, index: str, rebuild: bool, prune: bool) -> WorkerStream:
        """A (re)build of the index from its uploads folder as SSE: progress per file, then done or error."""
        return await self.open("POST", "/index", json={"index": index, "rebuild": rebuild, "prune": prune})

    async def create_title(self, question: str) -> str:
        data = await self.request_json(
            "POST", "/create_title", json={"question": question}, timeout=self.settings.title_timeout_s
        )
        return str((data or {}).get("title") or "").strip()

    async def health(self) -> tuple[int, dict]:
        try:
            resp = await self.http.get("/health", timeout=10.0)
        except httpx.TransportError as exc:
            raise unreachable(self.settings.worker_url, exc) from None
        try:
            body = resp.json()
        except ValueError:
            body = {}
        return resp.status_code, body if isinstance(body, dict) else {}

    async def ollama_reachable(self, host: str) -> bool:
        # Its own client: the worker's API key must not travel to another host.
        try:
            async with httpx.AsyncClient(timeout=5.0) as probe:
                resp = await probe.get(host.rstrip("/") + "/api/tags")
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    async def config(self) -> dict:
        return await self.request_json("GET", "/config", timeout=10.0)

    def _upload(
        self, index: str, dataset: str, filename: str, content: bytes, content_type: str | None
    ) -> dict:
        return {
            # The name also goes as a form field: the multipart header's filename is escaped lossily (a '"'
            # and a literal "%22" look the same there), the field is taken as it is.
            "data": {"dataset": dataset, "index": index, "filename": filename},
            "files": {"file": (filename, content, content_type or "application/octet-stream")},
            "timeout": self.settings.worker_upload_timeout_s,
        }

    async def add_document(
        self, index: str, dataset: str, filename: str, content: bytes, content_type: str | None
    ) -> dict:
        # The worker keeps one copy per (dataset, name) and these same bytes again are a no-op (their hash is
        # already there): a second try never makes a second document.
        upload = self._upload(index, dataset, filename, content, content_type)
        return await self.request_json("POST", "/add_document", idempotent=True, **upload)

    async def add_document_stream(
        self, index: str, dataset: str, filename: str, content: bytes, content_type: str | None
    ) -> WorkerStream:
        """`add_document` as SSE: `progress` per stage, then `done` (the result) or `error`. A refusal before
        any work (4xx) is raised as ApiError."""
        upload = self._upload(index, dataset, filename, content, content_type)
        accept = {"Accept": "text/event-stream"}
        return await self.open("POST", "/add_document", idempotent=True, headers=accept, **upload)

    async def get_document(
        self, index: str, dataset: str, filename: str, byte_range: str | None = None
    ) -> WorkerStream:
        """The original file, streamed; `byte_range` (gateway/ranges.parse) asks for one range of it: a 206, or
        RangeNotSatisfiable (416) when it starts past the end."""
        params = {"index": index, "dataset": dataset, "filename": filename}
        if byte_range is None:
            return await self.open("GET", "/get_document", params=params)
        resp = await self._get_range(params, byte_range)
        if resp.status_code == 416 and byte_range.startswith("bytes=-"):
            # A suffix longer than the file is all of it (RFC 9110 §14.1.3); Werkzeug refuses it instead.
            await resp.aclose()
            resp = await self._get_range(params, "bytes=0-")
        if resp.status_code == 416:
            await resp.aclose()
            raise ranges.not_satisfiable(resp.headers.get("content-range"))
        if resp.status_code >= 400:
            try:
                body = await resp.aread()
            finally:
                await resp.aclose()
            raise worker_error(resp, body)
        return WorkerStream(resp)

    async def _get_range(self, params: dict, byte_range: str) -> httpx.Response:
        request = self.http.build_request(
            "GET", "/get_document", params=params, headers={"Range": byte_range}
        )
        try:
            return await send_once_more(self.http, request, retry=True)
        except httpx.TransportError as exc:
            raise unreachable(self.settings.worker_url, exc) from None

    async def get_document_text(self, index: str, dataset: str, filename: str) -> dict:
        """A document's chunks in order, each with its page and location."""
        params = {"index": index, "dataset": dataset, "filename": filename}
        return await self.request_json("GET", "/get_document_text", params=params)

    async def get_documents(self, index: str) -> list[dict]:
        return await self.request_json("GET", "/get_documents", params={"index": index}) or []

    async def delete_document(self, index: str, dataset: str, filename: str) -> dict:
        body = {"index": index, "dataset": dataset, "filename": filename}
        return await self.request_json("POST", "/delete", json=body, idempotent=True)

    async def create_index(self, index: str, embedder: str | None, language: str | None) -> dict:
        """Make the index's table now with this embedder and full-text language (PUT /indexes/<index>)."""
        body = {"embedder": embedder, "language": language}
        return await self.request_json("PUT", f"/indexes/{index}", json=body, idempotent=True)

    async def index_settings(self, index: str) -> dict:
        """{"index", "embedder", "language"} of an existing index (GET /indexes/<index>; a 404 when it has no
        table yet)."""
        return await self.request_json("GET", f"/indexes/{index}")

    async def drop_index(self, index: str) -> None:
        await self.request_json("DELETE", f"/indexes/{index}", idempotent=True)
