"""Ingestion throughput (chunks/s, tokens/s) through the whole pipeline, against the embedder's raw forward pass.

    .venv/bin/python -m bench.ingest_throughput [--docs 500]

Writes the first N SciFact abstracts (title + text) as .txt files into a temporary folder and runs
`index_folder` on it (hash, convert, chunk, embed, write to LanceDB, overview; the same pipeline as `/index` and
the CLI) into a temporary index store. Then, in the same run and process, it embeds exactly the texts the
pipeline embedded (each chunk's headings + text) with `Embedder.embed_documents` alone. The ratio of the two
times is the pipeline's overhead over the model.

On a shared machine the load moves during a run, so the forward pass is timed twice, just before and just after
the pipeline (`--forward-runs 2`, the default), and the pipeline is compared with their mean (both printed).
The store (LanceDB's import), the converter and the model are loaded before any timing.

`--sentence-vectors both` (the default) runs the pipeline twice, into two indexes of one store: first storing no
sentence vectors (SENTENCE_VECTORS=turn, as before issue 31), then embedding and storing each chunk's passage
sentences (SENTENCE_VECTORS=ingest, the default): both beside the same forward passes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from tests.servers import SHARED


def write_corpus(folder: Path, n: int) -> int:
    written = 0
    with open(SHARED / "eval" / "scifact" / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            doc = json.loads(line)
            (folder / f"{doc['_id']}.txt").write_text(f"{doc['title']}\n\n{doc['text']}", encoding="utf-8")
            written += 1
            if written >= n:
                break
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=500)
    parser.add_argument(
        "--forward-runs",
        type=int,
        choices=(1, 2),
        default=2,
        help="time the forward pass after the pipeline only (1) or before and after it (2)",
    )
    parser.add_argument(
        "--sentence-vectors",
        choices=("both", "ingest", "turn"),
        default="both",
        help="the pipeline with SENTENCE_VECTORS=turn, =ingest, or both one after the other (same run)",
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from rag_worker.ingest.folder import index_folder
    from rag_worker.ingest.records import BatchDone
    from rag_worker.services import Services
    from rag_worker.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        folder = tmp_path / "corpus"
        folder.mkdir()
        n = write_corpus(folder, args.docs)
        settings = Settings(
            INDEX_STORE=str(tmp_path / "store"),
            UPLOADS_DIR=str(tmp_path / "uploads"),
            LLM_BACKEND="local",
            OVERVIEW_SUMMARIES="off",
        )
        services = Services(settings)
        embedder = services.embedder
        # Model load and Docling import are not part of either measurement.
        converter, chunker = services.converter, services.chunker
        services.store  # noqa: B018 - nor LanceDB's import
        embedder.embed_documents(["warm up the forward pass"])

        # The exact texts the pipeline embeds: each file converted and chunked as it does (cheap).
        texts: list[str] = []
        for path in sorted(folder.iterdir()):
            texts += [c.embed_text for c in chunker.chunk(converter.convert(path).document)]
        tokens = sum(embedder.count_tokens(t) for t in texts)

        def forward() -> float:
            started = time.perf_counter()
            embedder.embed_documents(texts)
            return time.perf_counter() - started

        forward_s = [forward()] if args.forward_runs == 2 else []

        modes = ["turn", "ingest"] if args.sentence_vectors == "both" else [args.sentence_vectors]
        pipeline: dict[str, float] = {}
        for mode in modes:
            services.store.sentence_vectors = mode == "ingest"
            started = time.perf_counter()
            done = None
            for event in index_folder(services, f"bench_{mode}", folder):
                if isinstance(event, BatchDone):
                    done = event
            pipeline[mode] = time.perf_counter() - started
            assert done is not None and not done.failed, done
            assert len(texts) == done.chunks, (len(texts), done.chunks)

        forward_s.append(forward())
        raw_s = sum(forward_s) / len(forward_s)

    print(
        f"machine: {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"embedder {embedder.model_id} (batch {embedder.batch_size}, max_length {embedder.max_length}, "
        f"{getattr(embedder, 'precision', 'float32')})"
    )
    print(f"documents {n}, chunks {done.chunks}, tokens {tokens} (chunk budget {chunker.max_tokens})")
    print(f"{'path':44s} {'seconds':>8s} {'chunks/s':>9s} {'tokens/s':>9s} {'share of forward':>16s}")
    rows = [(f"pipeline, SENTENCE_VECTORS={mode}", secs) for mode, secs in pipeline.items()]
    for label, secs in (*rows, ("embedder forward only", raw_s)):
        print(f"{label:44s} {secs:8.1f} {done.chunks / secs:9.1f} {tokens / secs:9.0f} {raw_s / secs:16.2f}")
    if len(forward_s) > 1:
        print(
            f"forward-only runs: {' / '.join(f'{f:.1f} s' for f in forward_s)} (before / after; mean above)"
        )
    for mode, secs in pipeline.items():
        print(
            f"SENTENCE_VECTORS={mode}: overhead ratio (pipeline / forward) {secs / raw_s:.2f}; "
            f"throughput as a share of the forward pass's {raw_s / secs:.2f}"
        )


if __name__ == "__main__":
    main()
