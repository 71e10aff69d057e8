#!/usr/bin/env bash
# Start a throwaway PostgreSQL on loopback (for tests and CI) and print its URL for the gateway.
#
#   eval "$(scripts/start_postgres.sh)"        # exports TEST_DATABASE_URL and PG_TEST_DIR
#   .venv/bin/pytest tests/integration/gateway tests/integration/ops/test_postgres.py -q
#   scripts/start_postgres.sh --stop "$PG_TEST_DIR"
#
# Installs Debian's `postgresql` with apt-get when no server binaries are found (needs root or sudo). The cluster
# lives in a temporary folder, listens on 127.0.0.1 only, trusts local connections (test use only) and runs
# as the `postgres` user when this script runs as root (PostgreSQL refuses to run as root).
# Environment: PGPORT (default: a free port), PG_TEST_DB (default rag_test), PG_TEST_DIR (default: mktemp).
# Human messages go to stderr; stdout is only the `export` lines, so `eval` is safe.
set -euo pipefail

say() { echo "start_postgres: $*" >&2; }

find_bin() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [[ -n "$dir" && -x "$dir/pg_ctl" ]]; then echo "$dir"; return; fi
    if command -v pg_ctl >/dev/null 2>&1; then dirname "$(command -v pg_ctl)"; fi
}

as_db_user() {
    if [[ $(id -u) -eq 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

if [[ "${1:-}" == "--stop" ]]; then
    dir=${2:?usage: start_postgres.sh --stop DIR}
    bin=$(find_bin)
    if [[ -f "$dir/data/postmaster.pid" ]]; then
        as_db_user "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
    fi
    rm -rf "$dir"
    say "stopped and removed $dir"
    exit 0
fi

bin=$(find_bin)
if [[ -z "$bin" ]]; then
    say "no PostgreSQL server found: installing Debian's postgresql"
    sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends postgresql >&2
    bin=$(find_bin)
    [[ -n "$bin" ]] || { say "postgresql installed but pg_ctl not found"; exit 1; }
fi

port=${PGPORT:-}
if [[ -z "$port" ]]; then
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
           2>/dev/null || echo 55432)
fi
db=${PG_TEST_DB:-rag_test}
dir=${PG_TEST_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/rag-pg.XXXXXX")}
mkdir -p "$dir"
if [[ $(id -u) -eq 0 ]]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir "$dir" postgres
    chown postgres: "$dir"
fi

say "initialising a cluster in $dir/data with $bin"
as_db_user "$bin/initdb" -D "$dir/data" -U postgres --auth=trust --encoding=UTF8 --no-locale --no-sync >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; exit 1; }
# fsync off: a test database that dies with the machine loses nothing anyone needs, and runs faster.
as_db_user "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$dir -c fsync=off -c full_page_writes=off" \
    start >&2 || { cat "$dir/postgres.log" >&2; exit 1; }
as_db_user "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres "$db"

say "PostgreSQL on 127.0.0.1:$port, database $db; stop with: scripts/start_postgres.sh --stop $dir"
echo "export TEST_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:$port/$db"
echo "export PG_TEST_DIR=$dir"
