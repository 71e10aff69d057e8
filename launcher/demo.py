"""The `demo` index: on a first start with an empty store, README.md and docs/ are indexed so a newcomer can ask
about the system at once."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launcher.paths import ROOT, open_log, project_path
from launcher.processes import stop_group, tail


def store_is_empty(settings) -> bool:
    lancedb_dir = project_path(settings.index_store) / "lancedb"
    return not lancedb_dir.is_dir() or not any(lancedb_dir.iterdir())


# docs/benchmarks/ is the archive of earlier measurements: figures that later rounds replaced. Indexed, its
# old numbers would be retrieved and cited as if current, and it was a fifth of the first start's indexing.
ARCHIVES = ("benchmarks",)


def demo_sources() -> list[Path]:
    docs = sorted(
        p
        for p in (ROOT / "docs").rglob("*")
        if p.is_file()
        and p.suffix.lower() in {".md", ".txt"}
        and p.relative_to(ROOT / "docs").parts[0] not in ARCHIVES
    )
    readme = ROOT / "README.md"
    return ([readme] if readme.is_file() else []) + docs


def build_demo_index(env: dict[str, str], logs_dir: Path, timeout: float) -> bool:
    """Index copies of README.md and docs/ as the `demo` index (dataset `docs`), so a newcomer can ask at once."""
    sources = demo_sources()
    if not sources:
        print("Demo:    no README.md or docs/ to index; skipped", flush=True)
        return False
    log_path = logs_dir / "demo-index.log"
    print(
        f"Demo:    first start with an empty store: indexing {len(sources)} project documents as `demo` ...",
        flush=True,
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rag-demo-") as tmp:
        dataset = Path(tmp) / "docs"
        dataset.mkdir()
        for src in sources:
            shutil.copy2(src, dataset / src.name)
        with open_log(log_path) as log:
            cmd = [sys.executable, "-m", "rag_worker", "index", tmp, "--index", "demo", "--quiet"]
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                stop_group("demo indexing", proc.pid, None, grace=5)
                rc = None
            except BaseException:
                stop_group("demo indexing", proc.pid, None, grace=5)
                raise
    if rc == 0:
        print(
            f"Demo:    index `demo` ready ({time.monotonic() - started:.0f} s); ask it about this system",
            flush=True,
        )
        return True
    print(
        f"Demo:    indexing failed ({'timeout' if rc is None else f'exit {rc}'}); see {log_path}:", flush=True
    )
    print(tail(log_path, 10), flush=True)
    return False
