"""The gateway's database work per RAG turn, many turns at once: the turn lane against the thread pool.

    .venv/bin/python -m bench.gateway_db [--turns 100] [--rounds 3] [--lanes 1,2,4] [--database-url URL]

In one process, on one event loop, without HTTP or a worker: N turns at once (one chat each, an index linked),
each doing what a streamed RAG turn does in the database, in the gateway's own functions: read its user
(`load_user`), start (`plan_turn`: the reads, the turn lock and both messages), two periodic saves
(`save_progress`: the steps and documents, then the answer so far) and the final save (`save_complete`: both
messages, the chat state, the step log), each sent to a thread as the gateway sends it. The baseline, in the same
run and alternated with the rest: every call on the thread pool (`in_thread`, anyio's forty threads), as before
the turn lane; then `in_lane` with a lane of each size in --lanes (TURN_DB_THREADS). Prints the process CPU per
turn and the wall time of the burst for each. SQLite in a temporary folder unless --database-url names another
database (its tables are made there; use a throwaway one). Figures only, never pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time

PASSAGE = (
    "Using multiple transfected cell models, we found that the expansion is driven by the interaction of the "
    "proinflammatory molecule with its receptor, which recruited components to the inhibition motif. "
)


def rag_frames() -> list:
    """The frames of one RAG turn as the worker sends them: 4 steps, 8 documents, 27 tokens, `done`."""
    from gateway.sse import frame, parse_frame

    docs = [
        {
            "id": f"{i:032x}",
            "document_id": str(5000 + i),
            "filename": f"{5000 + i}.txt",
            "dataset": "scifact",
            "index": "bench",
            "page": None,
            "chunk_index": i,
            "location": None,
            "text": PASSAGE,
            "context": PASSAGE * 3,
            "score": 8.3 - i,
            "ref": f"S{i + 1}",
        }
        for i in range(8)
    ]
    tokens = [f"word{i} " for i in range(26)] + ["[S1]."]
    reply = "".join(tokens)
    done = {
        "reply": reply,
        "question": "What does the study find about the receptor?",
        "rewritten": None,
        "history": [
            {"role": "user", "content": "What does the study find about the receptor?"},
            {"role": "assistant", "content": reply},
        ],
        "documents": docs,
        "fetched_new_documents": True,
        "route": "rag",
        "citations": [{"ref": "S1", "id": docs[0]["id"], "filename": docs[0]["filename"], "page": None}],
        "abstained": False,
        "model": "qwen3:8b",
        "flags": {"evidence": 0.35, "grounding": "none"},
        "timings": {"retrieve_ms": 34, "evaluate_ms": 16, "generate_ms": 274, "total_ms": 372},
        "grounding": {
            "supported_share": 1.0,
            "supported": 1,
            "checked": 1,
            "policy": "flag",
            "sentences": [],
        },
        "language": {"code": "en", "source": "detected"},
    }
    raw = [
        frame("step", {"step": "retrieving", "label": "Searching all datasets (hybrid)", "elapsed_ms": 18}),
        frame("step", {"step": "evaluating", "label": "Checking the passages", "elapsed_ms": 53}),
        frame("step", {"step": "evaluating", "label": "judged relevant", "elapsed_ms": 69}),
        frame("step", {"step": "expanding", "label": "Adding neighbouring passages", "elapsed_ms": 70}),
        frame("documents", {"documents": docs}),
        *(frame("token", {"token": t}) for t in tokens),
        frame("done", done),
    ]
    return [parse_frame(f.rstrip("\n")) for f in raw]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=100, help="turns at once in each burst")
    ap.add_argument("--rounds", type=int, default=3, help="bursts per variant, alternated")
    ap.add_argument("--lanes", default="1,2,4", help="lane sizes (TURN_DB_THREADS) to measure")
    ap.add_argument("--database-url", default=None)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="gateway-db-bench-")
    os.environ.setdefault("INDEX_STORE", tmp)
    os.environ["MAX_TURNS_PER_USER"] = str(args.turns * 10)

    import anyio

    from gateway import lifecycle
    from gateway.auth import LoginThrottle
    from gateway.context import Context, in_lane, in_thread, load_user
    from gateway.db import Chat, ChatIndex, Database, Index, User
    from gateway.schemas import TurnRequest
    from gateway.settings import Settings
    from gateway.turns.plan import plan_turn
    from gateway.turns.state import TurnRecord
    from gateway.turns.stored import save_complete
    from gateway.worker_client import WorkerClient

    settings = Settings()
    db = Database(args.database_url or f"sqlite:///{tmp}/gateway.db")
    db.migrate()
    c = Context(
        settings=settings, db=db, worker=WorkerClient(settings), jwt_secret="s" * 64, throttle=LoginThrottle()
    )
    with db.session() as s:
        user = User(username=f"bench-{os.getpid()}", password_hash="x")
        s.add(user)
        s.commit()
        s.refresh(user)
        index = Index(
            owner_id=user.id,
            name="bench",
            worker_name=f"bench_{os.getpid()}",
            status="ready",
            document_count=1,
        )
        s.add(index)
        s.commit()
        s.refresh(index)
        user_id, index_id = user.id, index.id
    frames = rag_frames()
    half = 5  # the steps and documents, saved with the first beat; the tokens with the second
    body = TurnRequest(message="What does the study find about the receptor?", force_rag=True)

    def new_chats(n: int) -> list[int]:
        with db.session() as s:
            chats = [Chat(owner_id=user_id, title="bench") for _ in range(n)]
            s.add_all(chats)
            s.commit()
            ids = [ch.id for ch in chats]
            s.add_all(ChatIndex(chat_id=i, index_id=index_id) for i in ids)
            s.commit()
        return ids

    async def turn(run, chat_id: int) -> None:
        me = await run(load_user, db, user_id)
        plan = await run(plan_turn, c, me, chat_id, body)
        rec = TurnRecord(message_id=plan.message_id, user_message_id=plan.user_message_id)
        for f in frames[:half]:
            rec.see(f)
        args_ = (db, plan.chat_id, plan.message_id)
        await run(lifecycle.save_progress, *args_, rec.partial_reply, list(rec.steps), rec.documents)
        for f in frames[half:]:
            rec.see(f)
        await run(lifecycle.save_progress, *args_, rec.partial_reply, None, None)
        await run(save_complete, c, plan, rec)

    async def burst(label: str) -> tuple[float, float]:
        if label == "pool":
            run = in_thread
        else:
            lane = anyio.CapacityLimiter(int(label))

            async def run(fn, *a):
                return await in_lane(lane, fn, *a)

        chats = new_chats(args.turns)
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(turn(run, ch) for ch in chats))
        return (time.process_time() - cpu) * 1000 / args.turns, time.perf_counter() - wall

    variants = ["pool", *[x.strip() for x in args.lanes.split(",") if x.strip()]]
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, python {platform.python_version()}")
    print(
        f"database: {db.url.split('@')[-1]}; {args.turns} RAG turns at once, {args.rounds} bursts per variant"
    )
    results: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}

    async def all_rounds() -> None:
        await burst("pool")  # warm-up: statements compiled, pages cached
        for _ in range(args.rounds):
            for v in variants:
                results[v].append(await burst(v))

    asyncio.run(all_rounds())
    print(f"{'variant':24} {'CPU ms per turn (each burst)':34} {'median':>7} {'wall s (median)':>16}")
    for v in variants:
        cpus = [r[0] for r in results[v]]
        walls = [r[1] for r in results[v]]
        name = "thread pool (baseline)" if v == "pool" else f"turn lane, {v} thread(s)"
        each = " ".join(f"{x:.2f}" for x in cpus)
        print(f"{name:24} {each:34} {statistics.median(cpus):7.2f} {statistics.median(walls):16.2f}")


if __name__ == "__main__":
    main()
