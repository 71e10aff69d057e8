"""The owner's side of a turn: read the worker's stream to its end (or a stop), relay each frame to the
listeners, save progress while it streams, and store the outcome."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from contract import observe

from .. import lifecycle, metrics, telemetry
from ..context import Context, in_lane
from ..errors import ApiError
from ..sse import frame
from ..streams import WorkerStreamBroken
from .state import TurnHandle, TurnPlan, TurnRecord
from .stored import release_lock, save_complete, save_failed
from .title import name_chat

log = logging.getLogger("gateway.turns")


async def keep_turn(c: Context, handle: TurnHandle) -> None:
    """The owner's side of the write-ahead turn: every heartbeat (or sooner, after TURN_SAVE_TOKENS tokens)
    save what changed in one short write with the heartbeat, and pick up a stop asked for elsewhere."""
    plan, rec = handle.plan, handle.rec
    # With nothing new to save (a turn waiting in the worker's queue, or between tokens) the heartbeat is
    # written only every quarter of TURN_LOCK_STALE_S (never less often than TURN_HEARTBEAT_S asks, never
    # more often either); the beats in between read the stop request and the lock without writing.
    beat_every = max(c.settings.turn_heartbeat_s, c.settings.turn_lock_stale_s / 4)
    beaten = time.monotonic()
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(handle.wake.wait(), timeout=c.settings.turn_heartbeat_s)
        handle.wake.clear()
        if handle.finishing:
            return
        tokens, steps = len(rec.tokens), rec.step_changes
        content = rec.partial_reply if tokens != handle.saved_tokens and rec.done is None else None
        step_list = list(rec.steps) if steps != handle.saved_steps and rec.done is None else None
        documents = rec.documents if rec.documents_changed and rec.done is None else None
        rec.documents_changed = False
        unchanged = content is None and step_list is None and documents is None
        try:
            if unchanged:  # with the other turns that beat now: one transaction for all
                beat = time.monotonic() - beaten >= beat_every
                owned, stop = await c.turn_checks.check(plan.chat_id, plan.message_id, beat)
                beaten = time.monotonic() if beat else beaten
            else:
                owned, stop = await in_lane(
                    c.turn_lane,
                    lifecycle.save_progress,
                    c.db,
                    plan.chat_id,
                    plan.message_id,
                    content,
                    step_list,
                    documents,
                )
                beaten = time.monotonic()
        except Exception:
            log.exception("saving the running turn in chat %s failed; trying again", plan.chat_id)
            rec.documents_changed = rec.documents_changed or documents is not None
            continue
        handle.saved_tokens, handle.saved_steps = tokens, steps
        if stop or not owned:
            handle.stop.set()


async def read_worker(c: Context, handle: TurnHandle) -> str | None:
    """Relay the worker's frames to the listeners until `done` or an error; returns a held `error` frame."""
    rec = handle.rec
    try:
        async with await c.worker.chat_stream(handle.plan.payload) as stream:
            async for f in stream.frames():
                rec.see(f)
                if rec.error is not None:  # an error event, or an answer that breaks the worker's contract
                    return f.raw if f.event == "error" else frame("error", rec.error)
                if f.event == "token" and handle.first_token_at is None:
                    handle.first_token_at = time.monotonic()
                handle.emit(f.raw)
                # The documents go with the next heartbeat's save (at most TURN_HEARTBEAT_S later, with the first
                # tokens), not in a write of their own; many tokens unsaved are saved at once.
                if len(rec.tokens) - handle.saved_tokens >= c.settings.turn_save_tokens:
                    handle.wake.set()
                if f.event == "done":
                    return None
    except WorkerStreamBroken as exc:  # mid-turn: reported as the gateway's failure, as any other break
        log.exception("turn in chat %s failed", handle.plan.chat_id)
        rec.error = {"error": f"the turn failed: {exc.cause}", "code": "gateway_error"}
    except ApiError as exc:
        rec.error = {"error": exc.message, "code": exc.code}
        rec.error_status = exc.status if exc.status >= 500 else 502
        if exc.headers and "Retry-After" in exc.headers:  # the worker is at capacity: say when to come back
            rec.error["retry_after_s"] = int(exc.headers["Retry-After"])
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a bug or an unexpected transport failure: still store, still tell the browser
        log.exception("turn in chat %s failed", handle.plan.chat_id)
        rec.error = {"error": f"the turn failed: {type(exc).__name__}", "code": "gateway_error"}
    return None


async def run_turn(c: Context, handle: TurnHandle) -> TurnRecord:
    """Read the worker's stream to its end (or to a stop), relaying frames, and persist the outcome; in a span
    of its own (the worker's request is its child), counted in the metrics once it is stored."""
    plan = handle.plan
    # This task's own context: its log lines name the worker indexes it searches.
    observe.index_name.set(",".join(plan.payload.get("index") or [])[:200] or None)
    metrics.TURNS_RUNNING.inc()
    try:
        with telemetry.span("turn", **{"rag.route": plan.route}):
            rec = await _run_turn(c, handle)
    finally:
        metrics.TURNS_RUNNING.dec()
    first = handle.first_token_at
    metrics.observe_turn(
        plan.route,
        metrics.turn_outcome(
            rec.status, rec.stopped, rec.error, bool(rec.done is not None and rec.done.abstained)
        ),
        time.monotonic() - handle.started,
        first - handle.started if first is not None else None,
        len(rec.tokens),
    )
    return rec


async def _run_turn(c: Context, handle: TurnHandle) -> TurnRecord:
    plan, rec = handle.plan, handle.rec
    started = handle.started
    handle.emit(frame("route", plan.gate))
    keeper = asyncio.create_task(keep_turn(c, handle), name=f"keep-chat-{plan.chat_id}")
    reader = asyncio.create_task(read_worker(c, handle), name=f"read-chat-{plan.chat_id}")
    stopper = asyncio.create_task(handle.stop.wait())
    held = None  # the terminal `error` frame, relayed after the failure is stored
    try:
        try:
            await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done():
                held = reader.result()
            else:
                # Stop: closing the worker stream closes the worker's generator, which closes the model call.
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
                if rec.done is None:
                    rec.stopped = True
        except asyncio.CancelledError:
            # The gateway is shutting down mid-turn: record what there is, then let the cancellation through.
            reader.cancel()
            rec.status = "interrupted"
            rec.error = {"error": "the gateway stopped before the answer was complete", "code": "interrupted"}
            await asyncio.shield(store_failure(c, plan, rec))
            raise
        finally:
            stopper.cancel()
        # The periodic saves end before the final one: a save still in flight completes first, so the two never
        # write the turn's rows at once (they would wait on each other's row locks on Postgres).
        handle.finishing = True
        handle.wake.set()
        await asyncio.gather(keeper, return_exceptions=True)
        await finish(c, handle, held)
    finally:
        keeper.cancel()
        c.turns.pop(plan.chat_id, None)
        handle.emit(None)
    elapsed_ms = (time.monotonic() - started) * 1000
    log.info(
        "turn chat=%s route=%s status=%s in %.0f ms",
        plan.chat_id,
        plan.route,
        rec.status,
        elapsed_ms,
        extra={
            "chat_id": plan.chat_id,
            "duration_ms": round(elapsed_ms, 1),
            "outcome": rec.status,
            "error_code": (rec.error or {}).get("code"),
        },
    )
    return rec


async def finish(c: Context, handle: TurnHandle, held: str | None) -> None:
    plan, rec = handle.plan, handle.rec
    if rec.done is not None:
        try:
            await in_lane(c.turn_lane, save_complete, c, plan, rec)
            rec.status = "complete"
            handle.emit(
                frame("saved", {"message_id": rec.message_id, "user_message_id": rec.user_message_id})
            )
            if plan.needs_title:
                try:
                    handle.emit(frame("title", {"title": await name_chat(c, plan)}))
                except BaseException:
                    await asyncio.shield(in_lane(c.turn_lane, release_lock, c, plan))
                    raise
        except Exception:
            log.exception("storing the turn in chat %s failed", plan.chat_id)
            await in_lane(c.turn_lane, release_lock, c, plan)
            # The JSON route's 502 says so too (it carried the turn with no error before).
            rec.error = {"error": "the answer could not be saved", "code": "save_failed"}
            handle.emit(frame("error", rec.error))
        return
    if rec.stopped:
        rec.status = "interrupted"
        rec.error = {"error": lifecycle.STOPPED, "code": "stopped"}
        rec.error_status = 200
        await store_failure(c, plan, rec)
        handle.emit(
            frame(
                "interrupted",
                {**rec.error, "message_id": rec.message_id, "user_message_id": rec.user_message_id},
            )
        )
        return
    if rec.error is None:
        rec.status = "interrupted"
        rec.error = {
            "error": "the worker's stream ended before the answer was complete",
            "code": "interrupted",
        }
    else:
        rec.status = "failed"
    await store_failure(c, plan, rec)
    handle.emit(held or frame("error", rec.error))


async def store_failure(c: Context, plan: TurnPlan, rec: TurnRecord) -> None:
    try:
        await in_lane(c.turn_lane, save_failed, c, plan, rec)
    except Exception:
        log.exception("storing the failed turn in chat %s failed", plan.chat_id)
        await in_lane(c.turn_lane, release_lock, c, plan)
