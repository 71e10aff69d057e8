#!/usr/bin/env bash
# Install everything the tests need, then lint and run the whole suite (unit, integration, browser, slow).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev --ray  # the Ray engine's two-node test runs in CI too
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# The embedded LLM's one-off GGUF conversion is cached here, under a folder this run creates.
export MODEL_CACHE_DIR="${MODEL_CACHE_DIR:-$PWD/.cache/models}"
mkdir -p "$MODEL_CACHE_DIR" test-output

.venv/bin/ruff check .
.venv/bin/ruff format --check contract rag_worker gateway tests bench launcher run_system.py

if [ -z "${TEST_DATABASE_URL:-}" ]; then
  # A throwaway PostgreSQL on loopback so the gateway's suite also runs against it (scale-out path).
  if pg_env=$(bash scripts/start_postgres.sh); then
    eval "$pg_env"
    trap 'bash scripts/start_postgres.sh --stop "$PG_TEST_DIR" >/dev/null 2>&1 || true' EXIT
  else
    echo "PostgreSQL could not be started: gateway tests run on SQLite only" >&2
  fi
fi

# In parallel (pytest-xdist): most of the suite waits on server start-ups and subprocesses, so more processes
# than cores pay off on CI's two. One test file per process at a time (--dist loadfile): a module's servers
# start once; files with slow tests go first (tests/conftest.py). TEST_WORKERS=0 (or `-n 0`) runs it serially.
.venv/bin/python -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder "$@"
