"""The README's configuration tables name every setting both services read, so a newcomer finds each one."""

from __future__ import annotations

import re

from tests.servers import ROOT


def documented() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Configuration") : text.index("## Calling the worker directly")]
    rows = re.findall(r"^\| ([^|]+)\|", section, re.MULTILINE)  # the first cell of each table row
    return {name for cell in rows for name in re.findall(r"`([A-Z0-9_]+)`", cell)}


def test_every_worker_and_gateway_setting_is_in_the_readme():
    from gateway.settings import Settings as GatewaySettings
    from rag_worker.settings import Settings as WorkerSettings

    names = documented()
    for cls in (WorkerSettings, GatewaySettings):
        missing = {f.alias for f in cls.model_fields.values() if f.alias} - names
        assert not missing, f"{cls.__module__}: not in README's configuration tables: {sorted(missing)}"


def test_process_level_variables_are_in_the_readme():
    names = documented()
    read_by_processes = {
        "WORKER_HOST",
        "WORKER_PORT",
        "WORKER_WORKERS",
        "GATEWAY_HOST",
        "GATEWAY_PORT",
        "LOG_LEVEL",
    }
    gunicorn_conf = (ROOT / "deploy" / "gunicorn.conf.py").read_text()
    read_by_processes |= set(re.findall(r"_int\(\"([A-Z_]+)\"", gunicorn_conf))
    read_by_processes |= set(re.findall(r"environ.get\(\"([A-Z_]+)\"", gunicorn_conf))
    assert not read_by_processes - names, sorted(read_by_processes - names)
