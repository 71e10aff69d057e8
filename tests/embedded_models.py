"""What the tests of the packaged embedded models share: the skip for a machine without the Qwen parts."""

from __future__ import annotations

import pytest

from rag_worker.llm.embedded import MODELS, QWEN, _package_dir

# The 1.5B default's tests run where its 22 part packages are installed (the README's test command installs them,
# as scripts/run.sh does); elsewhere they are skipped, saying why.
requires_qwen = pytest.mark.skipif(
    any(_package_dir(p) is None for p in MODELS[QWEN].packages),
    reason="the Qwen2.5-1.5B part packages are not installed (bash scripts/setup.sh installs them)",
)
