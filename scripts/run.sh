#!/usr/bin/env bash
# Install, then run the whole system (worker + gateway + web) on its embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}"
exec .venv/bin/python run_system.py "$@"
