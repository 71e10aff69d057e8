"""Browser tests: Debian's Chromium driven by Playwright against the real gateway and worker (loopback),
with the fake Ollama as the only stand-in. Servers and the browser start once per test module.

Needs: the `chromium` apt package (/usr/bin/chromium) and `npm ci --prefix web` (marked, DOMPurify).
Never `playwright install`: the browser is the system's.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.ollama_server import OLLAMA_ENV, FakeOllama
from tests.servers import ROOT, gateway_process, worker_process

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = ROOT / "test-output" / "screenshots"
TOKEN_DELAY_S = 0.06  # slow enough that the answer visibly grows in several renders


@pytest.fixture(scope="module")
def fake_ollama():
    with FakeOllama(token_delay_s=TOKEN_DELAY_S) as fake:
        yield fake


@pytest.fixture
def ollama(fake_ollama):
    """The module's fake Ollama, put back to its defaults after a test that tweaks it."""
    yield fake_ollama
    fake_ollama.reset(token_delay_s=TOKEN_DELAY_S)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, fake_ollama):
    """The real worker and gateway; yields the gateway's URL."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    if not (ROOT / "web" / "node_modules" / "marked").exists():
        pytest.skip("web/node_modules is missing: run `npm ci --prefix web`")
    tmp = tmp_path_factory.mktemp("e2e")
    env = {
        "OLLAMA_HOST": fake_ollama.url,
        **OLLAMA_ENV,
        "SSE_KEEPALIVE_S": "2",
    }
    with worker_process(tmp, env=env) as worker, gateway_process(tmp, worker_url=worker.url) as gateway:
        yield gateway.url


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


# Every Content-Security-Policy violation on any page is logged as a console error (and so fails the test that
# caused it, see ConsoleLog); added before any page script runs, and not itself subject to the policy.
CSP_REPORTER = """document.addEventListener('securitypolicyviolation', (e) =>
  console.error(`CSP violation: ${e.violatedDirective} blocked ${e.blockedURI || 'inline'} at ${e.sourceFile}:${e.lineNumber}`));"""


class ConsoleLog:
    """Every console error and uncaught exception of the pages it watches."""

    def __init__(self):
        self.errors: list[str] = []
        self.expected: list[str] = []  # substrings of errors a test provokes on purpose (a refused upload)

    def watch(self, page) -> None:
        page.on(
            "console", lambda msg: msg.type == "error" and self.errors.append(f"{msg.text} @ {msg.location}")
        )
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(x in e for x in self.expected)]


@pytest.fixture(scope="module")
def console():
    return ConsoleLog()


@pytest.fixture(scope="module")
def page(browser, stack, console):
    """One desktop tab for the module's story (register → upload → chat → reload …), in order."""
    context = browser.new_context(viewport={"width": 1280, "height": 860}, base_url=stack)
    context.add_init_script(CSP_REPORTER)
    page = context.new_page()
    page.set_default_timeout(60_000)
    console.watch(page)
    yield page
    context.close()


@pytest.fixture(scope="module")
def screenshots():
    shutil.rmtree(SCREENSHOTS, ignore_errors=True)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
