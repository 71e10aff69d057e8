"""Suite-wide safety net: a test reading a file under ../shared skips, saying so, when a checkout has none.

Tests that need ../shared say so with `needs_shared` (tests/servers.py); this catches any that do not, so a
bare clone's run reports them as skipped for that reason rather than failing with a FileNotFoundError.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.servers import SHARED, shared_absent_reason


def _missing_shared_file(exc: FileNotFoundError) -> Path | None:
    name = str(exc.filename or "")
    if SHARED.exists() or not name.startswith(str(SHARED)):
        return None
    return Path(name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    try:
        return (yield)
    except FileNotFoundError as exc:
        if (path := _missing_shared_file(exc)) is None:
            raise
        pytest.skip(shared_absent_reason(path))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except FileNotFoundError as exc:
        if (path := _missing_shared_file(exc)) is None:
            raise
        pytest.skip(shared_absent_reason(path))
