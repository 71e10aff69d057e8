"""Logging set-up for the worker process: stderr (which gunicorn and run_system.py capture), as plain lines or,
with LOG_FORMAT=json, one JSON object a line (contract/observe.py), each with its request's context."""

from __future__ import annotations

from contract.observe import configure


def configure_logging() -> None:
    configure("rag_worker")
