"""Command line: `python -m gateway serve [--port 8000] [--host 127.0.0.1]`."""

from __future__ import annotations

import argparse
import logging
import os
import sys


def serve(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway serve", description="Run the gateway on uvicorn")
    parser.add_argument("--host", default=os.environ.get("GATEWAY_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GATEWAY_PORT", "8000")))
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "info").lower())
    args = parser.parse_args(argv)

    import uvicorn

    from gateway.app import create_app
    from gateway.settings import Settings

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # One process: turn locks, login throttling and the running-turn registry live in it (the turn lock is
    # also in the database, so replicas behind a load balancer stay correct).
    uvicorn.run(
        create_app(Settings()),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        proxy_headers=True,
        timeout_graceful_shutdown=35,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "serve":
        print("usage: python -m gateway serve [--port 8000] [--host 127.0.0.1]", file=sys.stderr)
        return 2
    return serve(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
