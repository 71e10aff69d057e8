"""gunicorn settings for the worker (`python -m rag_worker serve` loads this file; flags given there win).

Every value comes from the environment so that the same file serves a laptop, a container and a replica set.
"""

from __future__ import annotations

import contextlib
import logging
import os


def _int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


# WORKER_BIND takes "host:port"; WORKER_HOST / WORKER_PORT are the simpler pair the CLI also reads.
bind = [
    os.environ.get("WORKER_BIND")
    or f"{os.environ.get('WORKER_HOST', '127.0.0.1')}:{_int('WORKER_PORT', 8001)}"
]

# gevent: one process serves many slow SSE streams; CPU-bound model calls go to gevent's native thread pool
# (rag_worker/runtime.py). Each process loads its own models (~1 GB with the embedded LLM), so scale with
# replicas behind a load balancer rather than with many processes per container.
worker_class = "gevent"
workers = _int("WORKER_WORKERS", 1)
worker_connections = _int("WORKER_CONNECTIONS", 1000)

# A chat stream may legitimately last minutes. With async workers the timeout is a heartbeat of the worker
# process, not a request limit, but a model load that holds the GIL can still miss it: 0 disables it.
timeout = _int("WORKER_TIMEOUT", 0)
# On SIGTERM, streams in flight get this long to finish before the process is killed.
graceful_timeout = _int("WORKER_GRACEFUL_TIMEOUT", 20)
# Longer than a load balancer's idle timeout toward us would be pointless; nginx defaults to 60 s. Keep it above
# the gateway's pool expiry (5 s): a client must drop an idle connection before the server closes it, or a request
# sent on it as it closes is lost before any answer (the gateway retries only the idempotent ones).
keepalive = _int("WORKER_KEEPALIVE", 75)

# Logs go to stdout/stderr: run_system.py writes them to logs/worker.log, Docker to its log driver.
accesslog = os.environ.get("WORKER_ACCESSLOG", "-") or None
errorlog = "-"
loglevel = os.environ.get("LOG_LEVEL", "info").lower()
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms'
if os.environ.get("LOG_FORMAT", "").strip().lower() == "json":
    # JSON lines throughout: gunicorn's own lines in the same shape as the app's (contract/observe.py), and
    # no access log of raw paths (the app writes one line per request with its route template instead).
    accesslog = None
    logconfig_dict = {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": "contract.observe.ContextFilter", "service": "rag_worker"}},
        "formatters": {"json": {"()": "contract.observe.JsonFormatter"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "filters": ["context"],
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": loglevel.upper()},
        "loggers": {
            "gunicorn.error": {"handlers": ["stderr"], "level": loglevel.upper(), "propagate": False},
            "gunicorn.access": {"handlers": ["stderr"], "level": loglevel.upper(), "propagate": False},
        },
    }

# Models are loaded lazily per process; preloading the app in the master would share nothing useful
# across a fork with torch threads and would make the master heavy.
preload_app = False
# Trust X-Forwarded-* from the load balancer only when told to (scale-out example sets it).
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")


def on_starting(server) -> None:
    # The same refusal as `python -m rag_worker serve`, for gunicorn started with this file by other means.
    from rag_worker.security import open_bind_refusal
    from rag_worker.settings import Settings

    settings = Settings()
    refusal = open_bind_refusal(
        list(server.cfg.bind), has_key=settings.worker_api_key is not None, allow_open=settings.allow_open
    )
    if refusal:
        raise SystemExit(f"rag_worker: {refusal}")


def when_ready(server) -> None:
    server.log.info(
        "worker listening on %s with %s gevent process(es)", ", ".join(server.cfg.bind), server.cfg.workers
    )


def post_fork(server, worker) -> None:
    server.log.info("worker process %s started", worker.pid)


def child_exit(server, worker) -> None:
    # prometheus_client's multi-process mode: a process that is gone no longer counts in the live gauges.
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


def worker_exit(server, worker) -> None:
    # Spans still queued for the OTLP exporter go out before the process ends.
    from rag_worker.telemetry import shutdown_tracing

    shutdown_tracing()
    # A clean exit (its streams finished, or the graceful timeout ended them) skips the interpreter's teardown:
    # finalising a loaded llama.cpp model, torch and their thread pools took 2-3 s on 2 cores (10 s under load)
    # and frees nothing the kernel does not. The atexit handlers and the log handlers still run first. Any other
    # exit (a boot error, an exception) keeps its code and its normal teardown, so the arbiter sees what failed.
    import atexit
    import sys

    failure = sys.exc_info()[1]
    if isinstance(failure, SystemExit) and failure.code in (0, None):
        atexit._run_exitfuncs()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed or broken pipe: nothing left to say there
                stream.flush()
        os._exit(0)


def worker_abort(worker) -> None:
    worker.log.warning("worker process %s aborted (timeout or SIGABRT)", worker.pid)
