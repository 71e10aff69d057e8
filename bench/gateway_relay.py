"""Gateway relay benchmark: what the gateway adds to a streamed turn, and 100 concurrent turns through it.

    .venv/bin/python -m bench.gateway_relay [--turns 20] [--concurrent 100] [--tokens-per-second 20]
    .venv/bin/python -m bench.gateway_relay --observability [--turns 40]

Starts the fake Ollama (the only stand-in), the real worker (gunicorn + gevent, 1 process) and the real gateway
(uvicorn) on loopback, then:

1. Relay overhead: the same direct-route turn N times straight to the worker's /chat_stream and N times through
   the gateway's /api/chats/{id}/messages/stream (which also loads the chat and stores the turn). Compares time
   to first token and to `done`; the difference in `done`, divided by the events relayed, is the added latency
   per event.
2. Load: C concurrent streamed turns (one chat each, direct route, so the model stream is what is exercised) with
   the fake Ollama writing T tokens/s per stream. Reports errors, stalled turns (no `done`, or a silence over 5 s),
   and the inter-token gaps the browser sees (p50 / p95 / max).

`--observability` instead runs three worker+gateway pairs at once (metrics off, on, on with tracing exported;
bench/observability.py) and interleaves the same streamed turns between them: the gateway's and the worker's
CPU time per turn, side by side.

Prints its figures; never pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from tests.ollama_server import OLLAMA_ENV, FakeOllama
from tests.servers import gateway_process, worker_process

STALL_S = 5.0
PROMPT = "Tell me a short story about a duck in a pond"


async def read_stream(resp: httpx.Response) -> list[tuple[float, str, object]]:
    """(arrival time, event, data) for every frame, comments included as ':'."""
    out, event, data = [], "message", []
    async for line in resp.aiter_lines():
        now = time.perf_counter()
        if line == "":
            if data:
                out.append((now, event, json.loads("\n".join(data))))
            event, data = "message", []
        elif line.startswith(":"):
            out.append((now, ":", None))
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
    return out


async def timed_turn(client: httpx.AsyncClient, url: str, body: dict, headers: dict | None = None) -> dict:
    start = time.perf_counter()
    async with client.stream("POST", url, json=body, headers=headers) as resp:
        if resp.status_code != 200:
            return {"error": f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"}
        frames = await read_stream(resp)
    names = [e for _, e, _ in frames]
    tokens = [t for t, e, _ in frames if e == "token"]
    done = next((t for t, e, _ in frames if e == "done"), None)
    gaps = [b - a for a, b in zip(tokens, tokens[1:], strict=False)]
    silences = [b - a for (a, *_), (b, *_) in zip(frames, frames[1:], strict=False)]
    return {
        "error": None if done and "error" not in names else f"no done (events: {names[-3:]})",
        "ttft": tokens[0] - start if tokens else None,
        "done": done - start if done else None,
        "events": sum(1 for e in names if e not in (":", "route", "saved", "title")),
        "gaps": gaps,
        "longest_silence": max(silences, default=0.0),
    }


async def setup_user(client: httpx.AsyncClient) -> dict:
    r = await client.post("/api/auth/register", json={"username": "bench", "password": "bench passphrase"})
    r.raise_for_status()
    return {"Authorization": f"Bearer {r.json()['token']}"}


async def new_chat(client: httpx.AsyncClient, headers: dict) -> int:
    # Titled, so the turn ends at `saved` and no title call joins the measurement.
    r = await client.post("/api/chats", json={"title": "bench"}, headers=headers)
    return r.json()["id"]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else float("nan")


async def relay_overhead(worker_url: str, gateway_url: str, turns: int) -> dict:
    async with httpx.AsyncClient(timeout=120) as w, httpx.AsyncClient(base_url=gateway_url, timeout=120) as g:
        headers = await setup_user(g)
        body = {"prompt": PROMPT, "options": {"route": "direct"}}
        await timed_turn(w, worker_url + "/chat_stream", body)  # warm both paths
        chat = await new_chat(g, headers)
        await timed_turn(g, f"/api/chats/{chat}/messages/stream", {"message": PROMPT}, headers)
        direct, through = [], []
        for _ in range(turns):  # interleaved, so drift on the shared machine hits both alike
            direct.append(await timed_turn(w, worker_url + "/chat_stream", body))
            chat = await new_chat(g, headers)
            through.append(
                await timed_turn(g, f"/api/chats/{chat}/messages/stream", {"message": PROMPT}, headers)
            )
    errors = [r["error"] for r in direct + through if r["error"]]
    if errors:
        return {"errors": errors[:3]}
    med = {
        name: {k: statistics.median(r[k] for r in runs) for k in ("ttft", "done", "events")}
        for name, runs in (("direct", direct), ("gateway", through))
    }
    added_done = med["gateway"]["done"] - med["direct"]["done"]
    added_ttft = med["gateway"]["ttft"] - med["direct"]["ttft"]
    # Before the first token the gateway does its one-off work (token, chat load, turn lock, worker call); after
    # it, every event only passes through the relay: that difference, per later event, is the relay's cost.
    later_events = max(1.0, med["direct"]["events"] - 2)
    return {
        "median": med,
        "added_ttft_ms": added_ttft * 1000,
        "added_done_ms": added_done * 1000,
        "added_per_event_ms": added_done * 1000 / med["direct"]["events"],
        "relay_ms_per_event_after_first_token": (added_done - added_ttft) * 1000 / later_events,
    }


async def load(gateway_url: str, concurrent: int) -> dict:
    limits = httpx.Limits(max_connections=concurrent * 2, max_keepalive_connections=concurrent)
    async with httpx.AsyncClient(base_url=gateway_url, timeout=300, limits=limits) as g:
        r = await g.post("/api/auth/login", json={"username": "bench", "password": "bench passphrase"})
        headers = {"Authorization": f"Bearer {r.json()['token']}"}
        chats = [await new_chat(g, headers) for _ in range(concurrent)]
        start = time.perf_counter()
        results = await asyncio.gather(
            *(timed_turn(g, f"/api/chats/{c}/messages/stream", {"message": PROMPT}, headers) for c in chats),
            return_exceptions=True,
        )
        wall = time.perf_counter() - start
        stored = 0
        for c in chats:
            chat = (await g.get(f"/api/chats/{c}", headers=headers)).json()
            stored += sum(
                1 for m in chat["messages"] if m["role"] == "assistant" and m["status"] == "complete"
            )
    errors = [
        r if isinstance(r, BaseException) else r["error"]
        for r in results
        if isinstance(r, BaseException) or r["error"]
    ]
    ok = [r for r in results if not isinstance(r, BaseException) and not r["error"]]
    gaps = [g for r in ok for g in r["gaps"]]
    stalled = sum(1 for r in ok if r["longest_silence"] > STALL_S) + len(errors)
    return {
        "turns": concurrent,
        "errors": len(errors),
        "error_samples": [str(e)[:200] for e in errors[:3]],
        "stalled": stalled,
        "stored_complete": stored,
        "wall_s": wall,
        "ttft_p50_s": pct([r["ttft"] for r in ok], 0.5),
        "ttft_p95_s": pct([r["ttft"] for r in ok], 0.95),
        "done_p95_s": pct([r["done"] for r in ok], 0.95),
        "gap_p50_ms": pct(gaps, 0.5) * 1000,
        "gap_p95_ms": pct(gaps, 0.95) * 1000,
        "gap_max_ms": max(gaps, default=float("nan")) * 1000,
        "tokens": len(gaps) + len(ok),
    }


async def observability_turns(pairs: dict, turns: int) -> dict:
    from bench.observability import CONFIGS, group_cpu_s

    clients = {name: httpx.AsyncClient(base_url=gw.url, timeout=120) for name, (_w, gw) in pairs.items()}
    try:
        headers = {name: await setup_user(c) for name, c in clients.items()}
        for name, c in clients.items():  # warm every path once
            await timed_turn(
                c,
                f"/api/chats/{await new_chat(c, headers[name])}/messages/stream",
                {"message": PROMPT},
                headers[name],
            )
        cpu = {name: {"gateway": 0.0, "worker": 0.0} for name in CONFIGS}
        errors = 0
        for i in range(turns):
            for name in CONFIGS if i % 2 == 0 else tuple(reversed(CONFIGS)):
                worker, gateway = pairs[name]
                c, h = clients[name], headers[name]
                chat = await new_chat(c, h)
                before = group_cpu_s(gateway.proc.pid), group_cpu_s(worker.proc.pid)
                r = await timed_turn(c, f"/api/chats/{chat}/messages/stream", {"message": PROMPT}, h)
                errors += r["error"] is not None
                cpu[name]["gateway"] += group_cpu_s(gateway.proc.pid) - before[0]
                cpu[name]["worker"] += group_cpu_s(worker.proc.pid) - before[1]
    finally:
        for c in clients.values():
            await c.aclose()
    return {
        name: {
            "gateway_ms": v["gateway"] * 1000 / turns,
            "worker_ms": v["worker"] * 1000 / turns,
            "both_ms": (v["gateway"] + v["worker"]) * 1000 / turns,
        }
        for name, v in cpu.items()
    } | {"errors": errors}


def observability_cost(turns: int) -> None:
    import contextlib

    from bench.observability import CONFIGS, config_env, table
    from tests.otlp_receiver import OtlpReceiver

    with contextlib.ExitStack() as stack:
        fake = stack.enter_context(FakeOllama())
        otlp = stack.enter_context(OtlpReceiver())
        pairs = {}
        for name in CONFIGS:
            tmp = Path(tempfile.mkdtemp(prefix=f"gateway-bench-{name.replace('+', '-')}-"))
            extra = config_env(name, otlp.url)
            env = {"OLLAMA_HOST": fake.url, **OLLAMA_ENV, "SSE_KEEPALIVE_S": "15", **extra}
            worker = stack.enter_context(worker_process(tmp, env=env))
            gateway = stack.enter_context(gateway_process(tmp, worker_url=worker.url, env=extra))
            pairs[name] = (worker, gateway)
        fake.token_delay_s = 0.0
        rows = asyncio.run(observability_turns(pairs, turns))
        spans = len(otlp.spans())
    print(
        f"\n{turns} streamed direct-route turns through each pair, interleaved; errors: {rows.pop('errors')}"
    )
    for key, label in (
        ("gateway_ms", "gateway CPU / turn"),
        ("worker_ms", "worker CPU / turn"),
        ("both_ms", "both / turn"),
    ):
        print(table(rows, key, label))
    print(f"spans received by the OTLP receiver: {spans}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--concurrent", type=int, default=100)
    parser.add_argument("--tokens-per-second", type=float, default=20.0)
    parser.add_argument(
        "--observability", action="store_true", help="CPU per turn with metrics off / on / on with tracing"
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.observability:
        observability_cost(args.turns)
        return
    tmp = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, python {platform.python_version()}")
    with FakeOllama() as fake:
        env = {
            "OLLAMA_HOST": fake.url,
            **OLLAMA_ENV,
            "SSE_KEEPALIVE_S": "15",
        }
        with worker_process(tmp, env=env) as worker, gateway_process(tmp, worker_url=worker.url) as gateway:
            fake.token_delay_s = 0.0
            relay_overhead_result = asyncio.run(relay_overhead(worker.url, gateway.url, args.turns))
            print(
                f"\n1. relay overhead, {args.turns} turns each way, fake Ollama at full speed (direct route):"
            )
            print(json.dumps(relay_overhead_result, indent=2, default=float))
            fake.token_delay_s = 1.0 / args.tokens_per_second
            result = asyncio.run(load(gateway.url, args.concurrent))
            print(
                f"\n2. {args.concurrent} concurrent streamed turns, fake Ollama at {args.tokens_per_second:g} tokens/s"
                " per stream:"
            )
            print(json.dumps(result, indent=2, default=float))


if __name__ == "__main__":
    main()
