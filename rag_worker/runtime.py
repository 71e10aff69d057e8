"""Run CPU-bound or blocking calls off the gevent loop.

Under gunicorn's gevent worker a torch forward pass or a LanceDB query made in a greenlet freezes every other
connection of that worker (MODELS.md measured 9 s stalls). `offload` sends such calls to gevent's native thread
pool when the process is monkey-patched, and simply calls them otherwise (CLI, plain threads).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def gevent_active() -> bool:
    try:
        from gevent import monkey
    except ImportError:  # pragma: no cover - gevent is a worker dependency
        return False
    return monkey.is_module_patched("threading")


def offload(fn: Callable[..., T], *args, **kwargs) -> T:
    """Call fn(*args, **kwargs) in a native thread when running under gevent; block only this greenlet."""
    if gevent_active():
        import gevent

        return gevent.get_hub().threadpool.apply(fn, args, kwargs)
    return fn(*args, **kwargs)


def cooperative_sleep(seconds: float) -> None:
    """Yield to other greenlets (or just sleep when gevent is not active)."""
    if gevent_active():
        import gevent

        gevent.sleep(seconds)
    else:
        import time

        time.sleep(seconds)
