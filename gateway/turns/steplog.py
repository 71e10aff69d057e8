"""The step log: each finished turn's steps as rows of `turn_steps` (gateway/db.py, migration 8), written with
the answer in its transaction (one INSERT of many rows), and what the admin page charts from them.

A turn's `step` events come in pairs (the stage starting, then its result with the method used); a stage is one
row: where it started in the turn, the method, the detail of its last event, and its duration, which is the
worker's own timing of the stage (`<stage>_ms` in the done event's timings) or, for a step the worker does not
time, the gap to the next step. Two more rows per turn hold its clocks: `first_token` and `total`.

The per-stage median is plain SQL on both databases (window functions; no `percentile_cont` on SQLite):

    WITH ranked AS (SELECT step, duration_ms,
                           ROW_NUMBER() OVER (PARTITION BY step ORDER BY duration_ms) AS rn,
                           COUNT(*) OVER (PARTITION BY step) AS n
                    FROM turn_steps WHERE created_at >= :since AND duration_ms IS NOT NULL)
    SELECT step, AVG(duration_ms) AS median_ms, MAX(n) AS turns FROM ranked
    WHERE rn IN ((n + 1) / 2, (n + 2) / 2) GROUP BY step
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, func, select
from sqlmodel import Session, col
from starlette.requests import Request
from starlette.responses import JSONResponse

from ..context import ctx, current_user, in_thread
from ..db import Message, TurnStep, utcnow
from ..errors import BadRequest, NotFound
from ..routing import ApiRoute, Operation

# The worker's step names and the timings key that measures each (docs/design/WORKER_API.md).
TIMED = {
    "rewriting": "rewrite_ms",
    "triage": "triage_ms",
    "fetch_check": "fetch_check_ms",
    "hyde": "hyde_ms",
    "retrieving": "retrieve_ms",
    "reranking": "rerank_ms",
    "evaluating": "evaluate_ms",
    "retrying": "retry_ms",
    "expanding": "expand_ms",
    "sql": "sql_ms",
    "generating": "generate_ms",
    "grounding": "grounding_ms",
    "provenance": "provenance_ms",
}
CLOCKS = ("first_token", "total")
MAX_DETAIL_CHARS = 2000


def _ms(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def step_rows(message_id: int, steps: list[dict], timings: dict) -> list[dict]:
    """The rows of one finished turn: a row per stage (its events merged), then its clocks."""
    merged: dict[str, dict] = {}
    for event in steps:
        name = event.get("step")
        started = _ms(event.get("elapsed_ms"))
        if not isinstance(name, str) or not name or started is None:
            continue
        row = merged.get(name)
        if row is None:
            row = merged[name] = {"step": name[:32], "started_ms": started, "method": None, "detail": {}}
        if isinstance(event.get("method"), str):
            row["method"] = event["method"][:64]
        if isinstance(event.get("detail"), dict) and len(str(event["detail"])) <= MAX_DETAIL_CHARS:
            row["detail"] = event["detail"]
    ordered = sorted(merged.values(), key=lambda r: r["started_ms"])
    total = _ms(timings.get("total_ms"))
    now = utcnow()
    rows = []
    for i, row in enumerate(ordered):
        duration = _ms(timings.get(TIMED.get(row["step"], "")))
        if duration is None:  # not timed by the worker: until the next step (or the turn's end)
            end = ordered[i + 1]["started_ms"] if i + 1 < len(ordered) else total
            duration = end - row["started_ms"] if end is not None and end >= row["started_ms"] else None
        rows.append(
            {**row, "message_id": message_id, "position": i, "duration_ms": duration, "created_at": now}
        )
    for j, clock in enumerate(CLOCKS):
        value = _ms(timings.get(f"{clock}_ms"))
        if value is not None:
            rows.append(
                {
                    "message_id": message_id,
                    "position": len(ordered) + j,
                    "step": clock,
                    "method": None,
                    "started_ms": 0,
                    "duration_ms": value,
                    "detail": {},
                    "created_at": now,
                }
            )
    return rows


# Built once (gateway/lifecycle.py says why): a multi-row VALUES would be compiled afresh for each turn, as its
# number of rows changes; an INSERT run with many parameter sets is compiled once.
INSERT_STEP = TurnStep.__table__.insert()


def save_steps(s: Session | Connection, message_id: int, steps: list[dict], timings: dict) -> None:
    """The step rows of a finished turn's answer, inside the caller's transaction (the one that stores the
    answer, once: its message was made when the turn started, so it has none yet)."""
    rows = step_rows(message_id, steps, timings)
    if rows:
        s.execute(INSERT_STEP, rows)


def stage_medians(s: Session, since) -> list[dict]:
    """[{step, median_ms, turns}] of the steps logged since `since`, slowest median first."""
    ranked = (
        select(
            col(TurnStep.step).label("step"),
            col(TurnStep.duration_ms).label("duration_ms"),
            func.row_number()
            .over(partition_by=col(TurnStep.step), order_by=col(TurnStep.duration_ms))
            .label("rn"),
            func.count().over(partition_by=col(TurnStep.step)).label("n"),
        )
        .where(col(TurnStep.created_at) >= since, col(TurnStep.duration_ms).is_not(None))
        .cte("ranked")
    )
    query = (
        select(ranked.c.step, func.avg(ranked.c.duration_ms).label("median_ms"), func.max(ranked.c.n))
        .where(ranked.c.rn.in_([(ranked.c.n + 1) // 2, (ranked.c.n + 2) // 2]))
        .group_by(ranked.c.step)
    )
    out = [
        {"step": step, "median_ms": round(float(median), 1), "turns": int(n)}
        for step, median, n in s.execute(query).all()
    ]
    return sorted(out, key=lambda r: (-r["median_ms"], r["step"]))


MAX_POINTS = 2000


def first_tokens(s: Session, since) -> list[dict]:
    """The first-token latency of each turn since `since` (the latest MAX_POINTS), oldest first."""
    query = (
        select(col(TurnStep.created_at), col(TurnStep.duration_ms), col(Message.route))
        .join(Message, col(Message.id) == col(TurnStep.message_id))
        .where(col(TurnStep.step) == "first_token", col(TurnStep.created_at) >= since)
        .order_by(col(TurnStep.created_at).desc())
        .limit(MAX_POINTS)
    )
    points = [{"at": at, "ms": ms, "route": route} for at, ms, route in s.execute(query).all()]
    return list(reversed(points))


MAX_HOURS = 24 * 31


def read_hours(request: Request) -> int:
    """`hours` (1 to 744, default 24): how far back the statistics reach."""
    values = request.query_params.getlist("hours")
    unknown = sorted(set(request.query_params) - {"hours"})
    if unknown:
        raise BadRequest(f"unknown query parameter '{unknown[0]}'", code="invalid", field=unknown[0])
    if not values:
        return 24
    if len(values) > 1:
        raise BadRequest("give hours once", code="invalid", field="hours")
    raw = values[0]
    if not raw.isascii() or not raw.isdigit() or len(raw) > 4:
        raise BadRequest("hours must be a whole number of hours", code="invalid", field="hours")
    hours = int(raw)
    if not 1 <= hours <= MAX_HOURS:
        raise BadRequest(f"hours must be between 1 and {MAX_HOURS}", code="invalid", field="hours")
    return hours


async def turn_stats(request: Request) -> JSONResponse:
    """The admin page's chart data: per-stage medians and first-token latencies of the last `hours`."""
    user = await current_user(request)
    if not user.is_admin:
        raise NotFound("no such API route: /api/admin/turn-stats", code="not_found")
    hours = read_hours(request)
    c = ctx(request)
    since = utcnow() - timedelta(hours=hours)

    def load() -> dict:
        with c.db.session() as s:
            return {"stages": stage_medians(s, since), "first_tokens": first_tokens(s, since)}

    data = await in_thread(load)
    from ..db import iso

    points = [{**p, "at": iso(p["at"])} for p in data["first_tokens"]]
    return JSONResponse(
        {"hours": hours, "since": iso(since), "stages": data["stages"], "first_tokens": points}
    )


routes = [
    ApiRoute(
        "GET",
        "/api/admin/turn-stats",
        turn_stats,
        Operation(
            "The step log's statistics for administrators: per-stage median durations and each turn's "
            "first-token latency over the last `hours` (1-744, default 24); others get 404",
            answer={
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["hours", "since", "stages", "first_tokens"],
                        "properties": {
                            "hours": {"type": "integer"},
                            "since": {"type": "string"},
                            "stages": {"type": "array", "items": {"type": "object"}},
                            "first_tokens": {"type": "array", "items": {"type": "object"}},
                        },
                    }
                }
            },
            errors=(400, 404),
            tag="admin",
        ),
    ),
]
