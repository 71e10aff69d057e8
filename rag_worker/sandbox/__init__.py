"""Heavy work on untrusted files (document conversion; later OCR) in a child process with a memory and a time limit.

Why: a 1.6 MB PDF of 10,000 pages took a worker from 620 MB to 3.5 GB and kept it. Run in the worker, such a
file takes the memory of every turn that process serves; run here, it can only take its own, and every byte of
it is returned when the job ends.

How:
- The worker starts one helper process per worker process (`python -m rag_worker.sandbox`), which imports the
  heavy libraries once (Docling) and then waits for jobs on its stdin.
- Each job runs in a fresh fork of that helper: it starts in milliseconds with everything imported, its address
  space is capped with `RLIMIT_AS` (the helper's own size plus the job's `memory_mb`), an alarm ends it past its
  time, and all its memory goes back to the system when it exits. The helper itself never runs a job.
- Jobs talk back over one pipe as JSON lines, each shorter than PIPE_BUF so lines of concurrent jobs never mix:
  `progress` events while running (`emit`), then `result` or `error`; the helper adds `exit` when it reaps the
  job's process, which tells a crash (or a kill by the memory limit) apart from an answer. A result too large
  for one line (an e-mail's headers, hundreds of attachments) is written to a file in the job's scratch folder
  and its line carries the path (`result_file`); the parent reads and removes it.
- The parent side is plain blocking code (a reader thread, queues, subprocess pipes). Under gevent's monkey
  patching those are all cooperative, so a worker waiting for a conversion keeps serving every other stream; it
  must then be called from a greenlet, not from the native thread pool (`runtime.offload`).

A task is a function `task(args: dict, emit: Callable[[dict], None]) -> JSON value`, named "module:function".
It may raise `ApiError` (relayed with its code and status); a `MemoryError` is reported as `memory`.
"""

from __future__ import annotations

from .parent import Sandbox, SandboxError

__all__ = ["Sandbox", "SandboxError"]
