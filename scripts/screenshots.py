"""The README's screenshots, from a realistic session: nothing scripted, nothing faked.

    .venv/bin/python scripts/screenshots.py [--out docs/screenshots] [--question "How do I back up the data?"]

Starts the real stack with `run_system.py` on loopback in a throwaway folder (an empty store, so it builds the
`demo` index from README.md and docs/ as on a first start), with the embedded default model answering
(LLM_BACKEND=local: no Ollama, nothing reaches the network). Then, in Debian's Chromium driven by Playwright (the
harness of tests/e2e): registers the first account (which adopts `demo`), asks the README's question in a new
chat, waits for the real, cited answer, and captures it on a laptop (light), on a phone (dark), and with a
citation followed to its source card. Prints the answer, its model and its grounding, for the captions.

Needs what the e2e tests need: the `chromium` apt package and `npm ci --prefix web`; the embedded model in
MODEL_CACHE_DIR (default ./.cache/models; bash scripts/setup.sh puts it there).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from tests.servers import free_port  # noqa: E402

QUESTION = "How do I back up the data?"  # the README's example question
USER, PASSWORD = "ada", "a long enough passphrase"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


def start_stack(tmp: Path, timeout: float) -> tuple[subprocess.Popen, str]:
    worker_port, gateway_port = free_port(), free_port()
    env = {**os.environ}
    for name in ("WORKER_API_KEY", "OLLAMA_HOST", "DATABASE_URL", "OPENAI_BASE_URL"):
        env.pop(name, None)
    env.update(
        {
            "INDEX_STORE": str(tmp / "index_store"),
            "UPLOADS_DIR": str(tmp / "shared_uploads"),
            "LLM_BACKEND": "local",  # the embedded default model answers
            "MODEL_CACHE_DIR": os.environ.get("MODEL_CACHE_DIR", str(ROOT / ".cache" / "models")),
            "JWT_SECRET": secrets.token_hex(16),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
    )
    out = tmp / "run_system.out"
    args = [sys.executable, "run_system.py", "--logs-dir", str(tmp / "logs")]
    args += ["--worker-port", str(worker_port), "--gateway-port", str(gateway_port)]
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = out.read_text(errors="replace")
        if "Ready." in text:
            print(text.strip())
            return proc, f"http://127.0.0.1:{gateway_port}"
        if proc.poll() is not None:
            raise SystemExit(f"run_system.py exited with {proc.returncode}:\n{text}")
        time.sleep(1)
    stop_stack(proc)
    raise SystemExit(f"the stack was not ready within {timeout:.0f} s:\n{out.read_text(errors='replace')}")


def stop_stack(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: run_system.py stops both services
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def the_answer(base: str, cookies: list[dict], chat_id: str) -> dict:
    """The stored answer, as the gateway has it, for the captions."""
    session = next(c["value"] for c in cookies if c["name"] == "rag_session")
    req = urllib.request.Request(f"{base}/api/chats/{chat_id}", headers={"Cookie": f"rag_session={session}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        chat = json.loads(resp.read())
    message = [m for m in chat["messages"] if m["role"] == "assistant"][-1]
    return {"title": chat["title"], **message}


def capture(base: str, out_dir: Path, question: str, answer_timeout_s: float) -> dict:
    from playwright.sync_api import expect, sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport=DESKTOP, color_scheme="light", base_url=base)
        page = context.new_page()
        page.set_default_timeout(120_000)
        page.goto("/")
        page.get_by_role("button", name="Create an account").click()
        page.get_by_label("Username").fill(USER)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Create account").click()
        expect(page.locator(".welcome")).to_be_visible()
        box = page.locator("#composer-input")
        box.fill(question)
        box.press("Enter")
        turn = page.locator(".message.assistant").last
        expect(turn).to_have_class(re.compile(r"\bstreaming\b"))
        expect(turn).not_to_have_class(re.compile(r"\bstreaming\b"), timeout=answer_timeout_s * 1000)
        # The title comes from the model after the answer is stored.
        expect(page.locator("#chat-title")).not_to_have_text("New chat", timeout=answer_timeout_s * 1000)
        chat_hash = page.evaluate("location.hash")
        cookies = context.cookies()
        answer = the_answer(base, cookies, chat_hash.rsplit("/", 1)[-1])
        context.close()

        shots = [
            ("chat-desktop-light.png", DESKTOP, "light", 1, False),
            ("chat-phone-dark.png", PHONE, "dark", 2, False),
            ("chat-citation-desktop-dark.png", DESKTOP, "dark", 1, True),
        ]
        for name, viewport, scheme, scale, cite in shots:
            context = browser.new_context(
                viewport=viewport, color_scheme=scheme, base_url=base, device_scale_factor=scale
            )
            context.add_cookies(cookies)
            shot = context.new_page()
            shot.goto("/" + chat_hash)
            expect(shot.locator(".message.assistant .doc-card").first).to_be_visible()
            if cite and shot.locator(".answer a.cite").count():
                shot.locator(".answer a.cite").first.click()  # follows the citation to its source card
                expect(shot.locator(".doc-card.highlighted")).to_be_visible()
            else:
                shot.locator(".scroller").evaluate("el => el.scrollTop = el.scrollHeight")
            shot.wait_for_timeout(600)  # let card and theme transitions settle
            shot.screenshot(path=str(out_dir / name))
            print(f"wrote {out_dir / name}")
            context.close()
        browser.close()
    return answer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument(
        "--timeout", type=float, default=1800.0, help="seconds for the start and for the answer"
    )
    args = parser.parse_args(argv)
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="rag-screenshots-") as tmp:
        proc, base = start_stack(Path(tmp), args.timeout)
        try:
            answer = capture(base, args.out, args.question, args.timeout)
        finally:
            stop_stack(proc)
    grounding = (answer.get("details") or {}).get("grounding") or {}
    print(f"\nchat title: {answer['title']}\nquestion: {args.question}")
    print(f"model: {(answer.get('details') or {}).get('model')}  route: {answer['route']}")
    print(f"sources: {[d.get('filename') for d in answer['documents']]}")
    print(f"citations: {[c.get('ref') for c in answer['citations']]}")
    print(f"grounding: {json.dumps(grounding)[:400]}")
    print(f"answer:\n{answer['content']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
