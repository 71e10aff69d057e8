"""Run CPU-bound or blocking calls off the gevent loop.

Under gunicorn's gevent worker a torch forward pass or a LanceDB query made in a greenlet freezes every other
connection of that worker (docs/design/MODELS.md measured 9 s stalls). `offload` sends such calls to gevent's native thread
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


def limit_blas_threads(threads: int) -> None:
    """numpy's BLAS (OpenBLAS) on `threads` threads for the whole process (0: the library's own default, one per
    core). The worker runs many turns at once, each product small: a product big enough for OpenBLAS to split
    (a few hundred vectors against a query) woke its threads, which then spun waiting for the next one, about 7 ms
    of CPU a RAG turn on two cores (docs/benchmarks.md, "Eleventh round"). torch's threads are TORCH_THREADS'."""
    if threads <= 0:
        return
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads, user_api="blas")


_pool = None


def offload_all(calls: list[Callable[[], T]]) -> list[T]:
    """Run the calls at once in native threads and return their results in order (the first failure is raised
    once all have ended). LanceDB releases the GIL, so a hybrid search's two legs take as long as the slower one
    rather than both together (docs/benchmarks.md, "Fourth round")."""
    if len(calls) < 2:
        return [offload(fn) for fn in calls]
    if gevent_active():
        import gevent

        pool = gevent.get_hub().threadpool
        pending = [pool.spawn(fn) for fn in calls]
        gevent.wait(pending)
        return [p.get() for p in pending]
    global _pool
    if _pool is None:
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="offload")
    futures = [_pool.submit(fn) for fn in calls]
    for f in futures:
        f.exception()  # wait for every call, so none is still running when this raises
    return [f.result() for f in futures]
