"""The worker's HTTP API as the gateway uses it (WORKER_API.md), over one pooled httpx.AsyncClient."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from .errors import ApiError, WorkerFailed
from .settings import Settings
from .sse import Frame, read_frames

log = logging.getLogger("gateway.worker")


class WorkerUnavailable(ApiError):
    status, code = 503, "worker_unavailable"


def _worker_error(resp: httpx.Response, body: bytes) -> ApiError:
    """The worker's own error, kept for the browser when it is about the request (4xx), a 502 otherwise."""
    try:
        data = json.loads(body)
    except ValueError:
        data = {}
    message = data.get("error") if isinstance(data, dict) else None
    code = data.get("code") if isinstance(data, dict) else None
    field = data.get("field") if isinstance(data, dict) else None
    if not message:
        # Not the worker's own JSON error: something in front of the app (gunicorn refusing the request, a proxy)
        # answered. The browser gets a generic message; the operator's log keeps what was said.
        log.warning(
            "the worker answered HTTP %s to %s %s without a JSON error: %r",
            resp.status_code,
            resp.request.method,
            resp.request.url.path,
            body[:300],
        )
        message = f"the worker answered HTTP {resp.status_code}"
    if resp.status_code in (400, 404, 409, 413, 415, 422):
        return ApiError(message, code=code or "worker_error", field=field, status=resp.status_code)
    if resp.status_code == 503:
        # The worker's queue is full (code "busy") or a model is down: a 503 for the browser too, with the
        # worker's Retry-After passed on.
        retry = resp.headers.get("Retry-After")
        headers = {"Retry-After": retry} if retry and retry.isdigit() else None
        return WorkerFailed(message, code=code or "worker_unavailable", status=503, headers=headers)
    return WorkerFailed(message, code=code or "worker_error")


class WorkerClient:
    def __init__(self, settings: Settings, transport: httpx.AsyncBaseTransport | None = None):
        headers = {}
        if settings.worker_api_key is not None and settings.worker_api_key.get_secret_value().strip():
            headers["Authorization"] = f"Bearer {settings.worker_api_key.get_secret_value()}"
        self.settings = settings
        limits = httpx.Limits(
            max_connections=settings.worker_max_connections,
            max_keepalive_connections=min(100, settings.worker_max_connections),
        )
        self.http = httpx.AsyncClient(
            base_url=settings.worker_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(connect=5.0, read=settings.worker_read_timeout_s, write=60.0, pool=60.0),
            limits=limits,
            transport=transport,
        )

    def _unreachable(self, exc: Exception) -> WorkerUnavailable:
        return WorkerUnavailable(
            f"the worker at {self.settings.worker_url} is unreachable ({type(exc).__name__})"
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def request_json(
        self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any
    ) -> Any:
        try:
            extra = {"timeout": timeout} if timeout is not None else {}
            resp = await self.http.request(method, path, **kwargs, **extra)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        if resp.status_code >= 400:
            raise _worker_error(resp, resp.content)
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            raise WorkerFailed("the worker answered with something that is not JSON") from None

    @asynccontextmanager
    async def stream(self, method: str, path: str, **kwargs: Any) -> AsyncIterator[httpx.Response]:
        """An open streaming response with a 2xx status; errors before the body are raised as ApiError."""
        try:
            async with self.http.stream(method, path, **kwargs) as resp:
                if resp.status_code >= 400:
                    body = await resp.aread()
                    raise _worker_error(resp, body)
                yield resp
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None

    @asynccontextmanager
    async def events(self, path: str, payload: dict) -> AsyncIterator[AsyncIterator[Frame]]:
        """POST `payload` and iterate the SSE frames of the answer as they arrive."""
        async with self.stream("POST", path, json=payload) as resp:
            yield read_frames(resp.aiter_lines())

    # The routes, one method each.

    async def create_title(self, question: str) -> str:
        data = await self.request_json(
            "POST", "/create_title", json={"question": question}, timeout=self.settings.title_timeout_s
        )
        return str((data or {}).get("title") or "").strip()

    async def health(self) -> tuple[int, dict]:
        try:
            resp = await self.http.get("/health", timeout=10.0)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
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

    async def add_document(
        self, index: str, dataset: str, filename: str, content: bytes, content_type: str | None
    ) -> dict:
        files = {"file": (filename, content, content_type or "application/octet-stream")}
        return await self.request_json(
            "POST",
            "/add_document",
            # The name also goes as a form field: the multipart header's filename is escaped lossily (a '"'
            # and a literal "%22" look the same there), the field is taken as it is.
            data={"dataset": dataset, "index": index, "filename": filename},
            files=files,
            timeout=self.settings.worker_upload_timeout_s,
        )

    @asynccontextmanager
    async def add_document_events(
        self, index: str, dataset: str, filename: str, content: bytes, content_type: str | None
    ) -> AsyncIterator[AsyncIterator[Frame]]:
        """`add_document` as SSE: `progress` per stage, then `done` (the result) or `error`. A refusal before
        any work (4xx) is raised as ApiError when entering."""
        files = {"file": (filename, content, content_type or "application/octet-stream")}
        async with self.stream(
            "POST",
            "/add_document",
            data={"dataset": dataset, "index": index, "filename": filename},
            files=files,
            headers={"Accept": "text/event-stream"},
            timeout=self.settings.worker_upload_timeout_s,
        ) as resp:
            yield read_frames(resp.aiter_lines())

    async def get_documents(self, index: str) -> list[dict]:
        return await self.request_json("GET", "/get_documents", params={"index": index}) or []

    async def delete_document(self, index: str, dataset: str, filename: str) -> dict:
        return await self.request_json(
            "POST", "/delete", json={"index": index, "dataset": dataset, "filename": filename}
        )

    async def drop_index(self, index: str) -> None:
        await self.request_json("DELETE", f"/indexes/{index}")
