"""The folder of prometheus_client's multi-process mode, set up before gunicorn forks (contract/metrics_dir.py,
shared with the gateway's several uvicorn processes)."""

from __future__ import annotations

from contract.metrics_dir import MULTIPROC_ENV, prepare_multiprocess_dir

__all__ = ["MULTIPROC_ENV", "prepare_multiprocess_dir"]
