"""Give freed heap memory back to the system between the batches of a long indexing run.

Indexing a folder allocates and frees the same kinds of buffers batch after batch (tokenizer encodings, the
forward pass's activations, Arrow tables of rows, LanceDB's write buffers), from several threads. glibc keeps
what is freed in its arenas for reuse, and with fragmentation the resident size kept rising by ~0.15 MB per
file although the live data did not (bench/ingest_memory.py: `malloc_trim` took 1,100 MB back to 730 MB after
2,000 files). `malloc_trim(0)` after each batch commit returns those free pages (a few milliseconds); elsewhere
than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger(__name__)

_trim = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _trim = getattr(_libc, "malloc_trim", None)  # glibc only (not musl)
        if _trim is not None:
            _trim.argtypes = [ctypes.c_size_t]
            _trim.restype = ctypes.c_int
    except OSError:  # pragma: no cover - no C library to load
        _trim = None


def release_free_memory() -> bool:
    """Return the allocator's free pages to the system; False where that is not available."""
    if _trim is None:
        return False
    try:
        _trim(0)
    except Exception:  # pragma: no cover - housekeeping never fails a run
        log.debug("malloc_trim failed", exc_info=True)
        return False
    return True
