"""Ingestion throughput (chunks/s, tokens/s) through the whole pipeline, against the embedder's raw forward pass.

    .venv/bin/python -m bench.ingest_throughput [--docs 500]

Writes the first N SciFact abstracts (title + text) as .txt files into a temporary folder and runs
`index_folder` on it (hash, convert, chunk, embed, write to LanceDB, overview; the same pipeline as `/index` and
the CLI) into a temporary index store. Then, in the same run and process, it embeds exactly the texts the
pipeline embedded (each chunk's headings + text) with `Embedder.embed_documents` alone. The ratio of the two
times is the pipeline's overhead over the model.
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
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from rag_worker.ingest.pipeline import BatchDone, index_folder, parts
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
        parts(services)  # model load and Docling import are not part of either measurement
        embedder.embed_documents(["warm up the forward pass"])

        started = time.perf_counter()
        done = None
        for event in index_folder(services, "bench", folder):
            if isinstance(event, BatchDone):
                done = event
        pipeline_s = time.perf_counter() - started
        assert done is not None and not done.failed, done

        # The exact texts the pipeline embedded: re-chunk each file (cheap) to recover them.
        texts: list[str] = []
        part = parts(services)
        for path in sorted(folder.iterdir()):
            texts += [c.embed_text for c in part.chunker.chunk(part.converter.convert(path).document)]
        assert len(texts) == done.chunks, (len(texts), done.chunks)
        tokens = sum(embedder.count_tokens(t) for t in texts)

        started = time.perf_counter()
        embedder.embed_documents(texts)
        raw_s = time.perf_counter() - started

    print(
        f"machine: {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"embedder {embedder.model_id} (batch {embedder.batch_size}, max_length {embedder.max_length})"
    )
    print(f"documents {n}, chunks {done.chunks}, tokens {tokens} (chunk budget {part.chunker.max_tokens})")
    print(f"{'path':28s} {'seconds':>8s} {'chunks/s':>9s} {'tokens/s':>9s}")
    for label, secs in (("pipeline (index_folder)", pipeline_s), ("embedder forward only", raw_s)):
        print(f"{label:28s} {secs:8.1f} {done.chunks / secs:9.1f} {tokens / secs:9.0f}")
    print(f"overhead ratio (pipeline / forward): {pipeline_s / raw_s:.2f}")


if __name__ == "__main__":
    main()
