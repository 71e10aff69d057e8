"""The job kinds this gateway runs: importing a kind's module registers it (gateway/jobs/__init__.py)."""

from __future__ import annotations

from ..sync import kind as _sync  # noqa: F401  (registers "sync")
from . import rebuild, upload  # noqa: F401  (they register "rebuild" and "upload")
