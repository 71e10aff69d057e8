"""An upload that reports its indexing as it happens: `POST /api/indexes/{id}/documents` with
`Accept: text/event-stream` relays the worker's `progress` events (stage: converting, chunking, embedding,
writing) and ends with `done` (the stored document, as the JSON answer has it) or `error`.

A refusal before any work (not the user's index, too large, empty, unsupported type) is still a JSON 4xx.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import httpx
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import StreamingResponse

from .context import Context, in_thread
from .errors import ApiError
from .sse import SSE_HEADERS, frame

log = logging.getLogger("gateway.uploads")


def wants_events(request: Request) -> bool:
    return "text/event-stream" in request.headers.get("accept", "")


async def relay(
    c: Context,
    worker_name: str,
    dataset: str,
    filename: str,
    content: bytes,
    upload: UploadFile,
    record: Callable[[dict], dict],
) -> StreamingResponse:
    events = c.worker.add_document_events(worker_name, dataset, filename, content, upload.content_type)
    frames = await events.__aenter__()  # a 4xx from the worker is raised here, as JSON

    async def body() -> AsyncIterator[str]:
        ended = False
        try:
            async for f in frames:
                data = f.data if isinstance(f.data, dict) else {}
                if f.event == "progress":
                    yield f.raw
                elif f.event == "done":
                    ended = True
                    try:
                        document = await in_thread(record, data)
                    except ApiError as exc:  # the index was deleted meanwhile
                        yield frame("error", exc.to_dict())
                        return
                    yield frame("done", document)
                    return
                elif f.event == "error":
                    ended = True
                    yield frame(
                        "error", {"error": str(data.get("error") or "indexing failed"), **_code(data)}
                    )
                    return
        except (ApiError, httpx.HTTPError) as exc:
            message = (
                exc.message
                if isinstance(exc, ApiError)
                else f"the worker stream broke ({type(exc).__name__})"
            )
            ended = True
            yield frame("error", {"error": message, "code": "worker_unavailable"})
        finally:
            await events.__aexit__(None, None, None)
            if not ended:
                log.warning("the worker's indexing stream for %s ended without a result", filename)
        if not ended:
            yield frame(
                "error",
                {"error": "the worker's stream ended before indexing finished", "code": "interrupted"},
            )

    return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)


def _code(data: dict) -> dict:
    out = {"code": str(data.get("code") or "indexing_failed")}
    if data.get("field"):
        out["field"] = str(data["field"])
    return out
