"""The folder of prometheus_client's multi-process mode, set up before a server starts its processes.

Kept apart from contract/metrics.py on purpose: prometheus_client chooses its mode when it is first imported,
so the parent process must name the folder before anything imports it (the processes it starts inherit both).
Used by the worker (gunicorn forks) and the gateway (uvicorn spawns).
"""

from __future__ import annotations

import os
from pathlib import Path

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare_multiprocess_dir(workers: int, prefix: str = "rag-worker-metrics-") -> str | None:
    """Before the processes start: the folder of multi-process mode, emptied of a previous run's files; one is
    made in the temporary folder when several processes start and none is named. None: one process, plain mode."""
    path = os.environ.get(MULTIPROC_ENV)
    if not path and workers <= 1:
        return None
    if not path:
        import tempfile

        path = tempfile.mkdtemp(prefix=prefix)
        os.environ[MULTIPROC_ENV] = path
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.db"):
        stale.unlink(missing_ok=True)
    return path
