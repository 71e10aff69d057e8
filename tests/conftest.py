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


def _heavy(item: pytest.Item) -> bool:
    """A test that takes minutes: an embedded-model run, a browser story, or one given a longer timeout."""
    if item.get_closest_marker("slow") or item.get_closest_marker("e2e"):
        return True
    timeout = item.get_closest_marker("timeout")
    return bool(timeout and timeout.args and timeout.args[0] > 300)


def pytest_collection_modifyitems(session, config, items):
    """Files holding heavy tests first, each file's own order kept.

    scripts/test.sh runs the suite in parallel, one file per process at a time in collection order
    (`--dist loadfile --no-loadscope-reorder`); starting the long files first keeps one of them from being
    the last thing running on a single process while the others sit idle. A serial run is only reordered.
    """
    heavy_files = {item.path for item in items if _heavy(item)}
    items.sort(key=lambda item: item.path not in heavy_files)  # stable: the order within a file is kept
