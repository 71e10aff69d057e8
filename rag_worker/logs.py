"""Logging set-up for the worker process (plain lines to stderr, which gunicorn and run_system.py capture)."""

from __future__ import annotations

import logging
import os


def configure_logging() -> None:
    level = os.environ.get("LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
