"""The per-index table store: one Parquet file and one JSON card per sheet under `index_store/tables/<index>/`."""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path

from ..names import check_name
from .build import build_table
from .cells import identifier
from .model import Sheet, Table

log = logging.getLogger(__name__)

# SQL keywords a table may not be named after (the prompt and the validator stay unambiguous).
_RESERVED = {"select", "from", "where", "group", "order", "table", "index", "limit", "values", "user"}


def tables_dir(settings, index: str) -> Path:
    return settings.index_store / "tables" / check_name(index, "index")


def list_tables(settings, index: str) -> list[Table]:
    folder = tables_dir(settings, index)
    if not folder.is_dir():
        return []
    cards = []
    for path in sorted(folder.glob("*.json")):
        try:
            card = Table.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable table card %s: %s", path, exc)
            continue
        if (folder / f"{card.name}.parquet").exists():
            cards.append(card)
    return cards


def _table_base(dataset: str, filename: str, sheet: str, sheets: int) -> str:
    stem = identifier(Path(filename).stem, "table")
    base = stem if dataset == "default" else f"{identifier(dataset, 'dataset')}_{stem}"
    if sheets > 1:
        base = f"{base}_{identifier(sheet, 'sheet')}"
    return base[:60]


def replace_tables(settings, index: str, dataset: str, filename: str, sheets: list[Sheet]) -> list[Table]:
    """Write a file's sheets as tables, replacing the tables the same (dataset, filename) had.

    Called under the index's write lock. Each Parquet file and card is written to a temporary name and moved
    into place, so a reader sees the old table or the new one, never half of one.
    """
    import pyarrow.parquet as pq

    folder = tables_dir(settings, index)
    folder.mkdir(parents=True, exist_ok=True)
    existing = list_tables(settings, index)
    mine = [t for t in existing if (t.dataset, t.filename) == (dataset, filename)]
    taken = {t.name for t in existing} - {t.name for t in mine}
    built: list[Table] = []
    for sheet in sheets:
        base = _table_base(dataset, filename, sheet.name, len(sheets))
        name, n = base, 2
        while name in taken or name in _RESERVED:
            name, n = f"{base}_{n}", n + 1
        result = build_table(sheet, name=name, dataset=dataset, filename=filename)
        if result is None:
            continue
        taken.add(name)
        card, arrow = result
        tmp = folder / f".{name}.{uuid.uuid4().hex}.tmp"
        pq.write_table(arrow, tmp)
        os.replace(tmp, folder / f"{name}.parquet")
        tmp_card = folder / f".{name}.{uuid.uuid4().hex}.json.tmp"
        tmp_card.write_text(json.dumps(card.to_dict(), default=str), encoding="utf-8")
        os.replace(tmp_card, folder / f"{name}.json")
        built.append(card)
    for old in mine:
        if old.name not in {t.name for t in built}:
            _remove(folder, old.name)
    return built


def remove_tables(settings, index: str, dataset: str, filename: str) -> int:
    folder = tables_dir(settings, index)
    gone = 0
    for card in list_tables(settings, index):
        if (card.dataset, card.filename) == (dataset, filename):
            _remove(folder, card.name)
            gone += 1
    return gone


def drop_tables(settings, index: str) -> None:
    import shutil

    folder = tables_dir(settings, index)
    if folder.is_dir():
        shutil.rmtree(folder, ignore_errors=True)


def _remove(folder: Path, name: str) -> None:
    (folder / f"{name}.json").unlink(missing_ok=True)
    (folder / f"{name}.parquet").unlink(missing_ok=True)


def store_sheets(settings, index: str, prepared) -> list[str]:
    """Replace the prepared file's tables (under the index lock); the tables' one-line descriptions."""
    if prepared.sheets is None:
        return []
    try:
        cards = replace_tables(settings, index, prepared.dataset, prepared.filename, prepared.sheets)
    except Exception:
        log.exception("loading the tables of %s failed", prepared.filename)
        remove_tables(settings, index, prepared.dataset, prepared.filename)
        return []
    return [card.describe() for card in cards]
