"""Command line: `python -m rag_worker serve [--port 8001]`, `python -m rag_worker index FOLDER --index NAME` and
`python -m rag_worker sync FOLDER --index NAME`."""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "deploy" / "gunicorn.conf.py"


def serve(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rag_worker serve", description="Run the worker on gunicorn+gevent"
    )
    parser.add_argument("--host", default=os.environ.get("WORKER_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("WORKER_PORT", "8001")))
    parser.add_argument("--workers", type=int, default=int(os.environ.get("WORKER_WORKERS", "1")))
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="gunicorn config file (optional)")
    args = parser.parse_args(argv)

    from gunicorn.app.base import BaseApplication

    class WorkerApplication(BaseApplication):
        def load_config(self) -> None:
            if args.config and Path(args.config).is_file():
                for key, value in runpy.run_path(args.config).items():
                    if key in self.cfg.settings and value is not None:
                        self.cfg.set(key, value)
            # Command-line choices win over the file; the worker class is not negotiable (see runtime.py).
            self.cfg.set("bind", [f"{args.host}:{args.port}"])
            self.cfg.set("workers", args.workers)
            self.cfg.set("worker_class", "gevent")
            if not Path(args.config or "").is_file():
                self.cfg.set("timeout", 0)
                self.cfg.set("graceful_timeout", 10)
                self.cfg.set("accesslog", "-")

        def load(self):
            import platform

            import gevent

            from rag_worker.app import create_app
            from rag_worker.logs import configure_logging

            configure_logging()
            # Docling asks platform.processor() (a subprocess) from gevent's native thread pool, where gevent
            # cannot watch child processes; answering it once here, on the main loop, caches the answer.
            _ = platform.uname().processor
            app = create_app()
            # Before this process takes requests: the embedded model, when it is the one that answers (its load
            # holds the GIL for seconds; here it freezes nothing).
            app.extensions["rag"].preload_llm()
            # Load the embedder in the background so the first question doesn't wait for it.
            gevent.spawn(app.extensions["rag"].warm_up)
            return app

    from rag_worker.logs import configure_logging
    from rag_worker.preflight import run_preflight
    from rag_worker.security import open_bind_refusal
    from rag_worker.settings import Settings

    settings = Settings()
    refusal = open_bind_refusal(
        [f"{args.host}:{args.port}"],
        has_key=settings.worker_api_key is not None,
        allow_open=settings.allow_open,
    )
    if refusal:
        print(f"rag_worker: {refusal}", file=sys.stderr)
        return 2
    configure_logging()
    # Several processes share their metrics through files (prometheus_client's multi-process mode): the folder
    # is named before anything imports prometheus_client (the preflight may), and emptied of a previous run's.
    from rag_worker.metrics_dir import prepare_multiprocess_dir

    prepare_multiprocess_dir(args.workers)
    run_preflight(settings)
    WorkerApplication().run()
    return 0


def index(argv: list[str]) -> int:
    from rag_worker.ingest.cli import main

    return main(argv)


def sync(argv: list[str]) -> int:
    from rag_worker.ingest.sync import main

    return main(argv)


# What the worker writes (uploaded originals, LanceDB tables, overviews, the converted model) is readable by its
# own user only: folders 0700, files 0600. The gateway's container runs as the same user (deploy/Dockerfile.*).
PRIVATE_UMASK = 0o077


def main(argv: list[str] | None = None) -> int:
    os.umask(PRIVATE_UMASK)
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"serve": serve, "index": index, "sync": sync}
    if not argv or argv[0] not in commands:
        print("usage: python -m rag_worker {serve,index,sync} ...", file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
