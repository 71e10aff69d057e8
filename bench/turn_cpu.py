"""CPU of one RAG turn, and how much of it each pipeline stage's forward passes take (issue 12).

    .venv/bin/python -m bench.turn_cpu [--chunks 10000] [--turns 12]

In one process, without gevent or HTTP: the real pipeline (prepare + run_turn) on the index bench.concurrency and
bench.pipeline_overhead build, against the fake Ollama at full speed. First --turns warm-up turns (models loaded,
caches as a running worker has them), then --turns measured ones, each with its own question. Prints the process
CPU per turn and, per pipeline stage that called the embedder, forward passes, texts and CPU per turn (the calling
thread's CPU time; TORCH_THREADS=1, so that is all of it). Figures only, never pass/fail.
"""

from __future__ import annotations

import argparse
import collections
import os
import time
import traceback


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=10_000)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument(
        "--profile", metavar="PATH", help="write a cProfile of the measured turns (calling thread) here"
    )
    args = ap.parse_args()
    from bench.concurrency import chunk_questions
    from bench.pipeline_overhead import build_index
    from rag_worker.pipeline.chat import prepare, run_turn
    from rag_worker.schemas import ChatRequest, parse
    from rag_worker.services import Services
    from rag_worker.settings import Settings
    from tests.ollama_server import OLLAMA_ENV, FakeOllama
    from tests.servers import ROOT

    base = ROOT / ".cache" / "bench" / f"pipeline_overhead_{args.chunks}"
    n_chunks = build_index(base / "index_store", args.chunks)
    with FakeOllama() as fake:
        env = {
            "OLLAMA_HOST": fake.url,
            **OLLAMA_ENV,
            "INDEX_STORE": str(base / "index_store"),
            "TORCH_THREADS": "1",
        }
        os.environ.update(env)
        services = Services(Settings())
        embedder = services.embedder
        calls: collections.Counter[str] = collections.Counter()
        texts: collections.Counter[str] = collections.Counter()
        cpu: collections.Counter[str] = collections.Counter()
        forward = embedder._forward

        def counted(batch: list[str]):
            stages = [f.name for f in traceback.extract_stack()[:-1] if "rag_worker/pipeline" in f.filename]
            stage = "/".join(stages[-2:]) or "?"
            t0 = time.thread_time()
            out = forward(batch)
            calls[stage] += 1
            texts[stage] += len(batch)
            cpu[stage] += time.thread_time() - t0
            return out

        embedder._forward = counted
        embedder._batcher.forward = counted
        questions = chunk_questions(n_chunks, 2 * args.turns)

        def turn(question: str) -> dict:
            req = parse(ChatRequest, {"prompt": question, "index": "bench", "options": {"route": "rag"}})
            last = None
            for event in run_turn(prepare(services, req)):
                last = event
            return last.data

        for q in questions[: args.turns]:
            turn(q)
        calls.clear(), texts.clear(), cpu.clear()
        profile = None
        if args.profile:
            import cProfile

            profile = cProfile.Profile(time.thread_time)
            profile.enable()
        t0 = time.process_time()
        abstained = sum(bool(turn(q).get("abstained")) for q in questions[args.turns :])
        total = (time.process_time() - t0) / args.turns
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.profile)
    n = args.turns
    print(f"index of {n_chunks} chunks, {n} RAG turns after {n} warm-up turns ({abstained} abstained)")
    print(f"process CPU per turn: {total * 1000:.1f} ms")
    print(f"{'stage (caller of the embedder)':40} {'passes':>7} {'texts':>7} {'CPU ms':>7}  (per turn)")
    for stage in sorted(cpu, key=cpu.get, reverse=True):
        print(f"{stage:40} {calls[stage] / n:7.2f} {texts[stage] / n:7.1f} {cpu[stage] / n * 1000:7.1f}")


if __name__ == "__main__":
    main()
