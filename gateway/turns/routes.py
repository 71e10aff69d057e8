"""The turn routes: a turn (streamed or answered once stored), stop, and rejoin."""

from __future__ import annotations

import asyncio
import time

from sqlmodel import col, select
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import lifecycle
from ..chats import message_json
from ..context import Context, ctx, current_user, in_lane, in_thread, path_id, read_json
from ..db import Chat, Message
from ..errors import Conflict
from ..policy import allowed_turn
from ..responses import StopResult, TurnResult
from ..routing import WORKER, ApiRoute, Operation, event_stream
from ..schemas import StopRequest, TurnRequest
from ..sse import drain, event_response
from .plan import plan_turn
from .rejoin import REJOIN_POLL_S, rejoin_stream
from .relay import run_turn
from .state import TurnHandle
from .stored import read_running

STOP_WAIT_S = 30.0  # how long POST /stop waits for the owner to store the stopped turn


async def start_turn(request: Request) -> tuple[Context, TurnHandle, asyncio.Queue]:
    user, c, chat_id = await current_user(request), ctx(request), path_id(request)
    # Within this server's limits and what an administrator allows (the model, prompt overrides, presets).
    body = await allowed_turn(c, user, await read_json(request, TurnRequest))
    # MAX_TURNS_PER_USER: a 429 when the account has that many running, on any process (plan.check_running_turns).
    plan = await in_lane(c.turn_lane, plan_turn, c, user, chat_id, body)
    handle = TurnHandle(plan)
    out = handle.listen()
    c.turns[plan.chat_id] = handle
    handle.task = asyncio.create_task(run_turn(c, handle), name=f"turn-chat-{chat_id}")
    c.running.add(handle.task)
    handle.task.add_done_callback(c.running.discard)
    return c, handle, out


async def post_message_stream(request: Request) -> Response:
    c, _handle, out = await start_turn(request)
    return event_response(drain(out, c.settings.keepalive_s))


async def post_message(request: Request) -> JSONResponse:
    c, handle, _out = await start_turn(request)
    assert handle.task is not None
    rec = await asyncio.shield(handle.task)
    plan = handle.plan

    def load() -> dict:
        with c.db.read() as s:
            ids = [i for i in (rec.user_message_id, rec.message_id) if i is not None]
            msgs = {m.id: m for m in s.exec(select(Message).where(col(Message.id).in_(ids)))} if ids else {}
            chat = s.get(Chat, plan.chat_id)
            return {
                "route": plan.gate,
                "status": rec.status,
                "user_message": message_json(msgs[rec.user_message_id])
                if rec.user_message_id in msgs
                else None,
                "message": message_json(msgs[rec.message_id]) if rec.message_id in msgs else None,
                "title": chat.title if chat else None,
            }

    result = await in_thread(load)
    if rec.status == "complete":
        return JSONResponse(TurnResult(**result).data())
    result.update(rec.error or {})
    retry = (rec.error or {}).get("retry_after_s")
    headers = {"Retry-After": str(retry)} if retry else None
    return JSONResponse(TurnResult(**result).data(), status_code=rec.error_status, headers=headers)


async def stop_turn(request: Request) -> JSONResponse:
    """Stop the chat's running turn, wherever it runs; answers once the stopped turn is stored."""
    user, c, chat_id = await current_user(request), ctx(request), path_id(request)
    await read_json(request, StopRequest)
    run = await in_thread(read_running, c, user.id, chat_id)
    message_id = run.message_id if run.busy else None
    if message_id is not None:
        message_id = await in_thread(lifecycle.request_stop, c.db, chat_id)
    if message_id is None:
        raise Conflict("no answer is being written in this chat", code="no_turn")
    handle = c.turns.get(chat_id)
    if handle is not None and handle.plan.message_id == message_id and handle.task is not None:
        handle.stop.set()
        await asyncio.wait({asyncio.ensure_future(asyncio.shield(handle.task))}, timeout=STOP_WAIT_S)
    else:  # another replica owns it: it reads the request with its next heartbeat
        deadline = time.monotonic() + max(STOP_WAIT_S, c.settings.turn_lock_stale_s * 2)
        while time.monotonic() < deadline:
            run = await in_thread(read_running, c, user.id, chat_id, message_id)
            if not run.busy:
                break
            await asyncio.sleep(REJOIN_POLL_S)
    run = await in_thread(read_running, c, user.id, chat_id, message_id)
    msg = run.message
    return JSONResponse(
        StopResult(
            status=msg.status if msg is not None else "failed",
            busy=run.busy,
            message=message_json(msg) if msg is not None else None,
            user_message=message_json(run.user_message) if run.user_message is not None else None,
        ).data()
    )


TURN_EVENTS = event_stream(
    "route {layer, route, reason} first; then the worker's step, documents, token and done (its answer); then "
    "saved {message_id, user_message_id} and, for a new chat, title {title}; or error {error, code}, or "
    "interrupted {error, code, message_id, user_message_id} when stopped. ': keepalive' comments meanwhile",
    ["route", "step", "documents", "token", "done", "saved", "title", "error", "interrupted"],
)
REJOIN_EVENTS = event_stream(
    "snapshot {message_id, question, status, steps, documents, answer, ...} of the running turn, then its live "
    "events as in messages/stream",
    ["snapshot", "step", "documents", "token", "done", "saved", "title", "error", "interrupted"],
)
TURN_ERRORS = (400, 403, 404, 409, 429, *WORKER)

routes = [
    ApiRoute(
        "POST",
        "/api/chats/{id:int}/messages",
        post_message,
        Operation(
            "One turn, answered once it is stored (502/503 carry the stored turn and the error)",
            TurnRequest,
            TurnResult,
            errors=TURN_ERRORS,
            tag="turns",
        ),
    ),
    ApiRoute(
        "POST",
        "/api/chats/{id:int}/messages/stream",
        post_message_stream,
        Operation(
            "One turn, streamed as it is written; it is stored even if the client leaves",
            TurnRequest,
            TURN_EVENTS,
            errors=TURN_ERRORS,
            tag="turns",
        ),
    ),
    ApiRoute(
        "POST",
        "/api/chats/{id:int}/stop",
        stop_turn,
        Operation(
            "Stop the chat's running turn (from any replica); answers once it is stored",
            StopRequest,
            StopResult,
            errors=(404, 409),
            tag="turns",
        ),
    ),
    ApiRoute(
        "GET",
        "/api/chats/{id:int}/stream",
        rejoin_stream,
        Operation(
            "Rejoin the chat's running turn (204 when none runs)",
            answer=REJOIN_EVENTS,
            empty=(204,),
            errors=(404,),
            tag="turns",
        ),
    ),
]
