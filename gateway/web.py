"""The web chat's files, served at `/`; a page that says what to run when its libraries are not installed.

The chat has no build step: its modules import marked and DOMPurify straight from `web/node_modules`. Without
them the browser shows a blank page, so until `npm ci --prefix web` has run every page answers 503 with the
command instead. Checked on each request (a few stat calls), so running the command and reloading is enough.
"""

from __future__ import annotations

import html
import json
import logging
from pathlib import Path

from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

log = logging.getLogger("gateway")

INSTALL = "npm ci --prefix web"


def missing_modules(web_dir: Path) -> list[str]:
    """The packages of web/package.json not installed in web/node_modules (empty when all are, or none needed)."""
    try:
        manifest = json.loads((web_dir / "package.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    names = manifest.get("dependencies") or {} if isinstance(manifest, dict) else {}
    return [
        f"node_modules/{n}" for n in names if not (web_dir / "node_modules" / n / "package.json").is_file()
    ]


def missing_page(web_dir: Path, missing: list[str]) -> str:
    items = "".join(f"<li><code>{html.escape(m)}</code></li>" for m in missing)
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>rag-chat: web chat not installed"
        "</title></head><body style='font-family:system-ui,sans-serif;max-width:40rem;margin:3rem auto'>"
        "<h1>The web chat's libraries are not installed</h1>"
        f"<p>From the project folder, run <code>{INSTALL}</code> (or <code>bash scripts/setup.sh</code>, which "
        "installs everything), then reload this page. The gateway's API works meanwhile.</p>"
        f"<p>Missing in <code>{html.escape(str(web_dir))}</code>:</p><ul>{items}</ul></body></html>"
    )


class WebFiles:
    """StaticFiles over the web folder, or the page above while index.html's imports are missing."""

    def __init__(self, web_dir: Path):
        self.web_dir = Path(web_dir)
        self.static = StaticFiles(directory=self.web_dir, html=True, check_dir=False)
        if missing := missing_modules(self.web_dir):
            log.warning(
                "the web chat's libraries are missing (%s): run `%s`; until then / explains this",
                ", ".join(missing),
                INSTALL,
            )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (missing := missing_modules(self.web_dir)):
            response = HTMLResponse(missing_page(self.web_dir, missing), status_code=503)
            await response(scope, receive, send)
            return
        await self.static(scope, receive, send)
