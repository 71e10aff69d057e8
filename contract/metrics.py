"""What both services' Prometheus metrics share: the METRICS=off switch, the no-op metric it hands out, the
common histogram buckets and the text exposition (summed over processes in prometheus_client's multi-process
mode, when PROMETHEUS_MULTIPROC_DIR names the folder the processes write to).
"""

from __future__ import annotations

import os

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Seconds: a turn's first token and whole answer take from a few hundred milliseconds to minutes on a CPU.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 30.0, 60.0, 120.0, 300.0)
HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

# METRICS=off: nothing is recorded (every metric is one shared no-op) and /metrics answers 404.
ENABLED = os.environ.get("METRICS", "on").strip().lower() not in ("off", "false", "0", "no")


class _Off:
    """A metric that records nothing (METRICS=off): the hooks stay in place and cost one call."""

    def labels(self, *args, **kwargs) -> _Off:
        return self

    def inc(self, *args, **kwargs) -> None:
        pass

    dec = set = observe = inc


OFF = _Off()


def metric(cls, *args, **kwargs):
    """`cls(*args, **kwargs)` (a prometheus_client Counter, Gauge or Histogram), or the no-op when metrics are off."""
    return cls(*args, **kwargs) if ENABLED else OFF


def is_multiprocess() -> bool:
    return bool(os.environ.get(MULTIPROC_ENV))


def render() -> tuple[bytes, str]:
    """The text exposition of every metric (summed over the processes in multi-process mode)."""
    if is_multiprocess():
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
