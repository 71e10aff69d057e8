"""An unchanged folder synced again: `python -m rag_worker sync` over N files that the index already holds.

    .venv/bin/python -m bench.sync [--files 10000]

Makes a folder of `--files` small Markdown files (a tenth at the top, the rest in 9 dataset subfolders) and an
index that holds every one of them under its name and hash (its rows written in-process with random vectors:
converting and embedding 10,000 files would take the bench's time, not the sync's). Then, in one run:

- baseline: a plain directory walk with stat of the same tree (`os.walk` + `os.stat`), the least any sync that
  looks at every file must do;
- first sync: no records yet, so every file is read and hashed (and found unchanged: the index has its bytes);
- unchanged sync: the records say size and mtime, so no file is read; this is the cron case (target ≤ 10 s on
  2 cores), measured in-process (`sync_folder`) and as the CLI in a fresh process (its start-up included).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def make_folder(folder: Path, files: int) -> list[tuple[str, Path]]:
    out = []
    datasets = ["default"] + [f"team{i}" for i in range(1, 10)]
    for i in range(files):
        dataset = datasets[i % len(datasets)]
        where = folder if dataset == "default" else folder / dataset
        where.mkdir(parents=True, exist_ok=True)
        path = where / f"note{i:05d}.md"
        path.write_text(f"# Note {i}\n\nThis is note number {i} of the {dataset} team.\n", encoding="utf-8")
        out.append((dataset, path))
    return out


def fill_index(services, index: str, files: list[tuple[str, Path]]) -> None:
    from rag_worker.ingest.chunk import Chunk
    from rag_worker.ingest.document import file_sha256, write_batch
    from rag_worker.ingest.records import Prepared

    dim = services.store.embedder_for(index).dim
    rng = np.random.default_rng(0)
    for start in range(0, len(files), 1000):
        items = []
        for dataset, path in files[start : start + 1000]:
            body = path.read_text(encoding="utf-8")
            prep = Prepared(
                dataset,
                path.name,
                path,
                file_sha256(path),
                "markdown",
                path.stem,
                [Chunk(0, body, body, None)],
            )
            items.append((prep, rng.standard_normal((1, dim)).astype(np.float32)))
        write_batch(services, index, items, compact=False)
    services.store.optimize(index)


def walk_with_stat(folder: Path) -> int:
    n = 0
    for root, _dirs, names in os.walk(folder):
        for name in names:
            os.stat(os.path.join(root, name))
            n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=10_000)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from contract.sync import run_to_end
    from rag_worker.ingest.sync import sync_folder
    from rag_worker.services import Services
    from rag_worker.settings import Settings

    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        tmp = Path(tmp)
        env = {
            "INDEX_STORE": str(tmp / "store"),
            "UPLOADS_DIR": str(tmp / "uploads"),
            "OVERVIEW_SUMMARIES": "off",
            "LLM_BACKEND": "local",
        }
        folder = tmp / "folder"
        t = time.perf_counter()
        files = make_folder(folder, args.files)
        services = Services(Settings(**env))
        fill_index(services, "bench", files)
        print(f"setup: {args.files} files and their index rows in {time.perf_counter() - t:.1f} s")

        t = time.perf_counter()
        walked = walk_with_stat(folder)
        walk_s = time.perf_counter() - t
        print(f"baseline  os.walk + stat      {walked:6d} files  {walk_s:7.3f} s")

        t = time.perf_counter()
        first = run_to_end(sync_folder(services, "bench", folder))
        first_s = time.perf_counter() - t
        print(
            f"first sync (hash every file)  {first.unchanged:6d} unchanged, {first.hashed} hashed  {first_s:7.3f} s"
            f"  ({first_s / walk_s:.1f}x the walk)"
        )
        t = time.perf_counter()
        again = run_to_end(sync_folder(services, "bench", folder))
        again_s = time.perf_counter() - t
        print(
            f"unchanged sync, in-process    {again.unchanged:6d} unchanged, {again.hashed} hashed  {again_s:7.3f} s"
            f"  ({again_s / walk_s:.1f}x the walk)"
        )
        assert (again.added, again.changed, again.removed, again.hashed) == (0, 0, 0, 0), again
        services.close()
        t = time.perf_counter()
        cli = subprocess.run(
            [sys.executable, "-m", "rag_worker", "sync", str(folder), "--index", "bench", "--quiet"],
            cwd=ROOT,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
        )
        cli_s = time.perf_counter() - t
        print(f"unchanged sync, CLI process   {cli.stdout.strip()}  {cli_s:7.3f} s wall (start-up included)")
        if cli.returncode != 0:
            print(cli.stderr, file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
