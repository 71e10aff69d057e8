"""Command line: `python -m gateway serve [--port 8000] [--host 127.0.0.1]` and
`python -m gateway create-admin USERNAME` (password from stdin or a prompt; for ALLOW_REGISTRATION=false)."""

from __future__ import annotations

import argparse
import os
import sys


def serve(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway serve", description="Run the gateway on uvicorn")
    parser.add_argument("--host", default=os.environ.get("GATEWAY_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GATEWAY_PORT", "8000")))
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "info").lower())
    args = parser.parse_args(argv)

    import uvicorn

    from contract.observe import configure, log_format
    from gateway.app import create_app
    from gateway.serving import PROTOCOL
    from gateway.settings import Settings

    # Plain lines, or LOG_FORMAT=json: one object a line with the request's context (contract/observe.py).
    configure("gateway", args.log_level)
    json_logs = log_format() == "json"
    # One process: turn locks, login throttling and the running-turn registry live in it (the turn lock is
    # also in the database, so replicas behind a load balancer stay correct).
    uvicorn.run(
        create_app(Settings()),
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


USAGE = """usage: python -m gateway serve [--port 8000] [--host 127.0.0.1]
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
