"""`python -m rag_worker index FOLDER --index NAME [--rebuild]`: the /index pipeline from a shell, with a bar."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from contract.languages import EMBEDDERS, INDEX_LANGUAGES

from ..errors import ApiError

# The CLI writes and never serves searches: small Lance caches keep its memory flat over 100k files
# (bench/ingest_memory.py); LANCEDB_INDEX_CACHE_MB / LANCEDB_METADATA_CACHE_MB still win when set.
INGEST_CACHES = {"LANCEDB_INDEX_CACHE_MB": 64, "LANCEDB_METADATA_CACHE_MB": 16}


def ingest_settings():
    """The worker's settings from the environment, with the indexing CLI's cache sizes unless set there."""
    from ..settings import Settings

    return Settings(**{k: v for k, v in INGEST_CACHES.items() if k not in os.environ})


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rag_worker index",
        description="Index a folder: files at its top level go to dataset 'default', each subfolder is a dataset.",
    )
    parser.add_argument("folder", type=Path)
    parser.add_argument("--index", default="default", help="index (table) name, default 'default'")
    parser.add_argument(
        "--rebuild",
        action="store_true",
        help="index everything again into a new table, swapped in when complete (documents whose file is "
        "not in the folder are kept unless --prune)",
    )
    parser.add_argument(
        "--prune",
        action="store_true",
        help="also remove indexed documents whose file is no longer in the folder",
    )
    parser.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: this process; ray: convert, chunk and embed across a Ray cluster (RAY_ADDRESS, or a "
        "local one when unset; needs `scripts/setup.sh --ray`)",
    )
    parser.add_argument("--ray-address", default=None, help="Ray cluster address (default: RAY_ADDRESS)")
    parser.add_argument(
        "--ray-cpus-per-worker", type=int, default=1, help="CPUs (and torch threads) per Ray actor, default 1"
    )
    parser.add_argument(
        "--ray-files-per-batch", type=int, default=16, help="files per Ray task (one Lance fragment each)"
    )
    parser.add_argument(
        "--embedder",
        choices=EMBEDDERS,
        default=None,
        help="a new index's embedder: default (EMBEDDING_MODEL, all-MiniLM-L6-v2) or multilingual-e5-small; an "
        "existing index keeps its own (naming another one is an error)",
    )
    parser.add_argument(
        "--language",
        choices=INDEX_LANGUAGES,
        default=None,
        help="a new index's full-text language (ISO 639-1; en by default; ja, ko and zh use 2-grams)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from ..services import Services

    services = Services(ingest_settings())
    if args.embedder is not None or args.language is not None:
        from ..errors import ApiError

        try:  # made now with these settings; an existing index with others is refused before any work
            services.store.create_index(args.index, embedder=args.embedder, language=args.language)
        except ApiError as err:
            print(f"error: {err.message}", file=sys.stderr)
            return 2
    nodes: set[str] = set()
    events = _events(services, args, nodes)
    if events is None:
        print("error: --engine ray needs Ray: run `bash scripts/setup.sh --ray`", file=sys.stderr)
        return 2
    return _report(events, args, nodes)


def _events(services, args: argparse.Namespace, nodes: set[str]) -> Iterator | None:
    """The run's events from the chosen engine; None when it is Ray and Ray is not installed."""
    if args.engine != "ray":
        from .folder import index_folder

        return index_folder(services, args.index, args.folder, args.rebuild, prune=args.prune)
    from .ray_engine import available, index_folder_ray

    if not available():
        return None
    return index_folder_ray(
        services,
        args.index,
        args.folder,
        args.rebuild,
        prune=args.prune,
        address=args.ray_address,
        cpus_per_worker=args.ray_cpus_per_worker,
        files_per_batch=args.ray_files_per_batch,
        nodes_seen=nodes,
    )


def _report(events: Iterator, args: argparse.Namespace, nodes: set[str]) -> int:
    """Show the events with a progress bar and a summary; the exit status (1 when a file failed)."""
    from tqdm import tqdm

    from .records import BatchDone, Progress

    bar = None
    reported: set[str] = set()
    try:
        for event in events:
            if isinstance(event, Progress):
                if bar is None:
                    bar = tqdm(total=event.total, unit="file", disable=args.quiet, dynamic_ncols=True)
                bar.set_postfix_str(f"{event.stage} {event.file}"[:60], refresh=False)
                bar.n = event.done
                bar.refresh()
                if event.stage == "failed":
                    reported.add(event.file)
                    tqdm.write(f"failed: {event.file}: {event.error}", file=sys.stderr)
            elif isinstance(event, BatchDone):
                if bar is not None:
                    bar.close()
                _summary(event, args.index, nodes, reported)
                return 1 if event.failed else 0
    except ApiError as err:
        if bar is not None:
            bar.close()
        print(f"error: {err.message}", file=sys.stderr)
        return 2
    except ConnectionError as err:  # Ray: the cluster cannot be reached, or refused the driver's token
        if bar is not None:
            bar.close()
        print(f"error: cannot use the Ray cluster: {err}", file=sys.stderr)
        return 2
    return 0


def _summary(done, index: str, nodes: set[str], reported: set[str]) -> None:
    print(
        f"index '{index}': {done.documents} documents ({done.unchanged} unchanged), "
        f"{done.chunks} chunks, {len(done.failed)} failed, {done.removed} chunks pruned, "
        f"{done.kept} kept from before, "
        f"in {done.seconds:.1f} s" + (f" on {len(nodes)} Ray nodes" if nodes else "")
    )
    for problem in done.failed:
        if problem["file"] not in reported:  # folder-level problems, not reported per file
            print(f"skipped: {problem['file']}: {problem['error']}", file=sys.stderr)
