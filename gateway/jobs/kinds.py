"""The job kinds this gateway runs: importing a kind's module registers it (gateway/jobs/__init__.py)."""

from __future__ import annotations

from . import rebuild, upload  # noqa: F401  (they register "rebuild" and "upload")
