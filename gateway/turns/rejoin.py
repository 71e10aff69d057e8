"""Rejoining a running turn (`GET /api/chats/{id}/stream`): from the owner's memory, or from another
replica's database saves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from ..access import readable_documents
from ..context import Context, ctx, current_user, in_thread, path_id
from ..db import User
from ..errors import NotFound
from ..sse import KEEPALIVE, drain, event_response, frame
from .stored import Running, db_snapshot, end_frames, read_running

REJOIN_POLL_S = 0.25  # how often a replica that does not own a turn reads its saves for a rejoined stream


def visible(c: Context, user: User, snapshot: dict) -> dict:
    """The snapshot without passages of an index the user can no longer read."""
    docs, done = snapshot.get("documents"), snapshot.get("done")
    if not docs and not done:
        return snapshot
    with c.db.read() as s:
        shown = {**snapshot, "documents": readable_documents(s, user, docs) if docs else docs}
        if isinstance(done, dict) and done.get("documents"):
            kept = readable_documents(s, user, done["documents"])
            if len(kept) != len(
                done["documents"]
            ):  # an index was revoked: its passages leave the history too
                history = [m for m in done.get("history") or [] if m.get("role") != "system"]
                shown["done"] = {**done, "documents": kept, "history": history}
        return shown


async def follow_database(c: Context, user: User, chat_id: int, first: Running) -> AsyncIterator[str]:
    """A turn another replica owns, streamed from its periodic saves: the snapshot, then what changed."""
    user_id = user.id
    message_id = first.message_id
    run = first
    yield frame("snapshot", await in_thread(visible, c, user, db_snapshot(run)))
    assert run.message is not None
    sent_text, sent_steps, sent_docs = run.message.content, len(run.message.steps), run.message.documents
    quiet = 0.0
    while run.message is not None and run.message.status == "running" and run.busy:
        await asyncio.sleep(REJOIN_POLL_S)
        quiet += REJOIN_POLL_S
        try:
            run = await in_thread(read_running, c, user_id, chat_id, message_id)
        except NotFound:  # the chat was deleted meanwhile
            yield frame("error", {"error": "the chat was deleted", "code": "chat_not_found"})
            return
        msg = run.message
        if msg is None:
            break
        for step in msg.steps[sent_steps:]:
            yield frame("step", step)
            quiet = 0.0
        sent_steps = len(msg.steps)
        if msg.documents and msg.documents != sent_docs:
            yield frame("documents", {"documents": msg.documents})
            sent_docs = msg.documents
        if len(msg.content) > len(sent_text) and msg.content.startswith(sent_text):
            yield frame("token", {"token": msg.content[len(sent_text) :]})
            sent_text = msg.content
            quiet = 0.0
        if quiet >= c.settings.keepalive_s:
            quiet = 0.0
            yield KEEPALIVE
    if run.message is not None and run.message.status == "running":
        # The turn lost its lock without being finished: recovered as interrupted by now, or about to be.
        run = await in_thread(read_running, c, user_id, chat_id, message_id)
    for item in end_frames(run):
        yield item


async def rejoin_stream(request: Request) -> Response:
    user, c, chat_id = await current_user(request), ctx(request), path_id(request)
    handle = c.turns.get(chat_id)
    if handle is not None and handle.task is not None and not handle.task.done():
        await in_thread(read_running, c, user.id, chat_id)  # the owner check (404)
        taken = handle.snapshot()
        out = handle.listen()  # no await between the snapshot and listening: nothing falls in between
        snapshot = frame("snapshot", await in_thread(visible, c, user, taken))  # the events queue meanwhile
        return event_response(drain(out, c.settings.keepalive_s, [snapshot]))
    run = await in_thread(read_running, c, user.id, chat_id)
    if run.message is None or run.message.status != "running" or not run.busy:
        return Response(status_code=204)
    return event_response(follow_database(c, user, chat_id, run))
