"""Command line: `python -m gateway serve [--port 8000] [--host 127.0.0.1] [--workers N]` and
`python -m gateway create-admin USERNAME` (password from stdin or a prompt; for ALLOW_REGISTRATION=false)."""

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
    parser.add_argument(
        "--workers", type=int, default=None, help="uvicorn processes (default: GATEWAY_WORKERS)"
    )
    args = parser.parse_args(argv)

    from pydantic import ValidationError

    from gateway.settings import Settings

    try:
        if args.workers is not None:
            os.environ["GATEWAY_WORKERS"] = str(args.workers)
        settings = Settings()
    except ValidationError as exc:
        print(f"gateway: {exc.errors()[0]['msg']} ({exc.errors()[0]['loc'][0]})", file=sys.stderr)
        return 2
    workers = settings.gateway_workers
    if workers > 1:
        # Before anything imports prometheus_client: the processes share their metrics through files.
        from contract.metrics_dir import prepare_multiprocess_dir

        prepare_multiprocess_dir(workers, "gateway-metrics-")

    import uvicorn

    from contract.observe import configure, log_format
    from gateway.serving import PROTOCOL

    # Plain lines, or LOG_FORMAT=json: one object a line with the request's context (contract/observe.py).
    configure("gateway", args.log_level)
    json_logs = log_format() == "json"
    common = dict(
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        # The app reads X-Forwarded-* itself (gateway.proxy): only the right-most untrusted hop is believed.
        proxy_headers=False,
        # A request sent whole and then half-closed by its client is still read and answered (gateway/serving.py).
        http=PROTOCOL,
        timeout_graceful_shutdown=35,
        # JSON: uvicorn's lines go through the root logger's JSON handler, and its access line of raw paths
        # gives way to the gateway's own (route template, status, duration, request id).
        **({"log_config": None, "access_log": False} if json_logs else {}),
    )
    if workers == 1:
        from gateway.app import create_app

        uvicorn.run(create_app(settings), **common)
        return 0
    # Several processes on one port (the kernel hands each connection to one of them). Everything they must
    # agree on lives in the database: turn locks, stops and rejoins, running turns per user, rate limits,
    # failed logins, jobs and sync claims. The schema is brought up to date here, once, before they start.
    from gateway.db import Database

    db = Database(settings.resolved_database_url())
    try:
        version = db.migrate()
    finally:
        db.dispose()
    settings.resolved_jwt_secret()  # made once here rather than raced by the processes
    logging.getLogger("gateway").info("gateway database at schema version %d; %d processes", version, workers)
    os.environ["LOG_LEVEL"] = args.log_level  # each process configures its own logging from it
    uvicorn.run("gateway.serving:process_app", factory=True, workers=workers, **common)
    return 0


def read_password(prompt_tty: bool) -> str:
    """The new password: asked twice on a terminal, else the first line of stdin (scripts, `docker exec -i`)."""
    if prompt_tty:
        import getpass

        first = getpass.getpass("Password for the new administrator: ")
        if first != getpass.getpass("Repeat it: "):
            raise ValueError("the two passwords differ")
        return first
    return sys.stdin.readline().rstrip("\r\n")


def create_admin(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway create-admin",
        description="Create an administrator account in the gateway's database (DATABASE_URL / INDEX_STORE), "
        "e.g. the first one when ALLOW_REGISTRATION=false. The password is read from stdin, or asked for.",
    )
    parser.add_argument("username")
    args = parser.parse_args(argv)

    from pydantic import ValidationError

    from gateway.accounts import create_user
    from gateway.auth import hash_password
    from gateway.db import Database
    from gateway.errors import ApiError
    from gateway.schemas import Registration
    from gateway.settings import Settings

    try:
        password = read_password(sys.stdin.isatty())
        body = Registration.model_validate({"username": args.username, "password": password})
    except ValueError as exc:  # ValidationError included
        message = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        print(f"create-admin: {message}", file=sys.stderr)
        return 2
    db = Database(Settings().resolved_database_url())
    try:
        db.migrate()
        user = create_user(db, body.username, hash_password(body.password), admin=True)
    except ApiError as exc:
        print(f"create-admin: {exc.message}", file=sys.stderr)
        return 1
    finally:
        db.dispose()
    print(f"created administrator {user.username!r} (id {user.id})")
    return 0


USAGE = """usage: python -m gateway serve [--port 8000] [--host 127.0.0.1] [--workers N]
       python -m gateway create-admin USERNAME   (password on stdin or asked for)"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"serve": serve, "create-admin": create_admin}
    if not argv or argv[0] not in commands:
        print(USAGE, file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
