"""Suite-wide safety net: a test reading a file under ../shared skips, saying so, when a checkout has none.

Tests that need ../shared say so with `needs_shared` (tests/servers.py); this catches any that do not, so a
bare clone's run reports them as skipped for that reason rather than failing with a FileNotFoundError.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.servers import SHARED, shared_absent_reason

# The fast tier (and every worker a test starts) runs the small embedded model; the tests of the 1.5B default
# ask for it by name (EMBEDDED_MODEL=qwen2.5-1.5b) and skip, saying why, when its parts are not installed.
os.environ.setdefault("EMBEDDED_MODEL", "smollm2")


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


def _timeout(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    return float(marker.args[0]) if marker and marker.args else 300.0  # pyproject.toml's default


def _heavy(item: pytest.Item) -> bool:
    """A test that takes minutes: an embedded-model run, a browser story, or one given a longer timeout."""
    return bool(item.get_closest_marker("slow") or item.get_closest_marker("e2e")) or _timeout(item) > 300


def pytest_collection_modifyitems(session, config, items):
    """Files holding heavy tests first (the longest timeout first), then the other files that start servers,
    unit tests last; each file's own order kept.

    scripts/test.sh runs the suite in parallel, one file per process at a time in collection order
    (`--dist loadfile --no-loadscope-reorder`); starting the long files first keeps one of them from being
    the last thing running on a single process while the others sit idle, and the many short unit files fill
    the gaps at the end. A serial run is only reordered.
    """
    heavy: dict[Path, float] = {}  # file -> its longest test timeout: the longest-running files start first
    for item in items:
        if _heavy(item):
            heavy[item.path] = max(heavy.get(item.path, 0.0), _timeout(item))
    unit = Path(__file__).parent / "unit"

    def rank(item: pytest.Item) -> tuple[int, float]:
        if item.path in heavy:
            return 0, -heavy[item.path]
        return (2 if unit in item.path.parents else 1), 0.0

    items.sort(key=rank)  # stable: the order within a file is kept


class _CpuLog:
    """TEST_CPU_LOG=path: each test file's CPU seconds (this process, then the servers it started and reaped) and
    wall seconds, appended as a line when the file's last teardown ends: where the suite's minutes go."""

    def __init__(self, path: str):
        self.path, self.start = path, {}

    @staticmethod
    def usage() -> tuple[float, float, float]:
        import resource
        import time

        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime, time.monotonic()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        self.start.setdefault(item.path, self.usage())

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item, nextitem):
        if nextitem is not None and nextitem.path == item.path:
            return
        start = self.start.pop(item.path, None)
        if start is None:
            return
        end = self.usage()
        with open(self.path, "a", encoding="utf-8") as log:
            log.write("\t".join(f"{e - s:.1f}" for e, s in zip(end, start, strict=True)) + f"\t{item.path}\n")


def pytest_configure(config):
    if os.environ.get("TEST_CPU_LOG"):
        config.pluginmanager.register(_CpuLog(os.environ["TEST_CPU_LOG"]), "cpu-log")
