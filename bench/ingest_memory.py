"""Resident memory of folder indexing over many small files (the `python -m rag_worker index` path).

    .venv/bin/python -m bench.ingest_memory --files 20000 [--every 1000] [--warmup 500]

Generates N small text files (about 1 KB of made-up sentences each, all different) in a temporary folder and
indexes them with `index_folder` (what the CLI runs) into a temporary store, printing the process's resident
memory (RSS) every `--every` files. The goal (issue 15) is flat memory: after the first few hundred files, RSS
stays within ±150 MB of its level for the rest of the run. The summary line gives RSS after `--warmup` files,
the lowest and highest value after it, and the spread.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import tempfile
import time
from pathlib import Path

WORDS = [
    "wing",
    "lift",
    "drag",
    "flow",
    "boundary",
    "layer",
    "shock",
    "wave",
    "pressure",
    "surface",
    "heat",
    "transfer",
    "plate",
    "cone",
    "cylinder",
    "nozzle",
    "turbulent",
    "laminar",
    "supersonic",
    "hypersonic",
    "subsonic",
    "mach",
    "number",
    "reynolds",
    "stagnation",
    "point",
    "skin",
    "friction",
    "measurement",
    "theory",
    "experiment",
    "solution",
    "equation",
    "model",
    "velocity",
    "temperature",
    "density",
    "viscous",
    "inviscid",
    "separation",
    "transition",
    "jet",
    "wake",
    "vortex",
    "edge",
    "leading",
    "trailing",
    "angle",
    "attack",
    "thickness",
    "ratio",
    "aspect",
    "span",
    "body",
    "airfoil",
    "blade",
    "compressor",
    "turbine",
    "rotor",
    "stator",
    "panel",
    "flutter",
    "vibration",
    "structure",
    "load",
    "stress",
    "buckling",
]


def write_files(folder: Path, n: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    for i in range(n):
        sentences = []
        for _ in range(rng.randint(6, 10)):
            words = rng.choices(WORDS, k=rng.randint(10, 18))
            sentences.append(" ".join(words).capitalize() + ".")
        title = " ".join(rng.choices(WORDS, k=6)).title()
        (folder / f"doc{i:06d}.txt").write_text(f"{title} {i}\n\n" + " ".join(sentences), encoding="utf-8")


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--every", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=500, help="files after which memory should stay flat")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from rag_worker.ingest.cli import ingest_settings
    from rag_worker.ingest.folder import index_folder
    from rag_worker.ingest.records import BatchDone, Progress
    from rag_worker.services import Services

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        folder = tmp_path / "files"
        folder.mkdir()
        write_files(folder, args.files)
        os.environ.update(
            INDEX_STORE=str(tmp_path / "store"),
            UPLOADS_DIR=str(tmp_path / "uploads"),
            LLM_BACKEND="local",
            OVERVIEW_SUMMARIES="off",
        )
        settings = ingest_settings()  # exactly what `python -m rag_worker index` runs with
        services = Services(settings)
        print(
            f"machine: {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}; "
            f"{args.files} files of ~1 KB; RSS before models {rss_mb():.0f} MB",
            flush=True,
        )
        started = time.monotonic()
        samples: list[tuple[int, float]] = []
        done = None
        next_mark = args.every
        at_warmup = None
        for event in index_folder(services, "memory", folder):
            if isinstance(event, Progress) and event.stage in ("indexed", "unchanged", "failed"):
                if at_warmup is None and event.done >= args.warmup:
                    at_warmup = rss_mb()
                    print(f"{event.done:>7d} files  RSS {at_warmup:7.0f} MB  (warm-up level)", flush=True)
                if event.done >= next_mark:
                    samples.append((event.done, rss_mb()))
                    rate = event.done / (time.monotonic() - started)
                    print(
                        f"{event.done:>7d} files  RSS {samples[-1][1]:7.0f} MB  {rate:6.1f} files/s",
                        flush=True,
                    )
                    next_mark += args.every
            elif isinstance(event, BatchDone):
                done = event
        assert done is not None
        print(
            f"done: {done.documents} documents, {done.chunks} chunks, {len(done.failed)} failed, {done.seconds:.0f} s"
        )
        after = [mb for n, mb in samples if n > args.warmup]
        if at_warmup is not None and after:
            low, high = min(after), max(after)
            print(
                f"RSS after {args.warmup} files: {at_warmup:.0f} MB; later min {low:.0f} MB, max {high:.0f} MB; "
                f"spread from the warm-up level {low - at_warmup:+.0f} / {high - at_warmup:+.0f} MB"
            )


if __name__ == "__main__":
    main()
