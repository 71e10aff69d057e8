"""docs/configuration.md (which the README links to) names every setting both services read, so a newcomer finds
each one."""

from __future__ import annotations

import re

from tests.servers import ROOT


def documented() -> set[str]:
    text = (ROOT / "docs" / "configuration.md").read_text()
    rows = re.findall(r"^\| ([^|]+)\|", text, re.MULTILINE)  # the first cell of each table row
    return {name for cell in rows for name in re.findall(r"`([A-Z0-9_]+)`", cell)}


def test_every_worker_and_gateway_setting_is_in_the_configuration_tables():
    from gateway.settings import Settings as GatewaySettings
    from rag_worker.settings import Settings as WorkerSettings

    names = documented()
    for cls in (WorkerSettings, GatewaySettings):
        missing = {f.alias for f in cls.model_fields.values() if f.alias} - names
        assert not missing, f"{cls.__module__}: not in docs/configuration.md: {sorted(missing)}"


def test_process_level_variables_are_in_the_configuration_tables():
    names = documented()
    read_by_processes = {
        "WORKER_HOST",
        "WORKER_PORT",
        "WORKER_WORKERS",
        "GATEWAY_HOST",
        "GATEWAY_PORT",
        "LOG_LEVEL",
        # The observability layer's (contract/observe.py, */metrics.py, */telemetry.py).
        "LOG_FORMAT",
        "METRICS",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "PROMETHEUS_MULTIPROC_DIR",
    }
    gunicorn_conf = (ROOT / "deploy" / "gunicorn.conf.py").read_text()
    read_by_processes |= set(re.findall(r"_int\(\"([A-Z_]+)\"", gunicorn_conf))
    read_by_processes |= set(re.findall(r"environ.get\(\"([A-Z_]+)\"", gunicorn_conf))
    assert not read_by_processes - names, sorted(read_by_processes - names)


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)|\bsrc=\"([^\"]+)\"")


def anchors(path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", path.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_links_in_the_readme_and_docs_lead_somewhere():
    pages = [ROOT / "README.md", ROOT / "deploy" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for match in LINK.finditer(page.read_text()):
            target = match.group(1) or match.group(2)
            if re.match(r"[a-z]+:", target):  # http(s), mailto: not this test's business
                continue
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_quick_start_is_what_ci_runs():
    """The README's first two commands start the system and run the suite; CI runs exactly the second."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("## Quick start") :].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    assert commands[:2] == ["bash scripts/run.sh", "bash scripts/test.sh"], commands
    assert "exec bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
