"""The turn lifecycle in a real browser: an upload shows its indexing stages, Stop stops the answer
(the model call included) and the chat takes the next message at once, and a reload mid-answer rejoins the
running turn so the answer keeps growing. One story, in order; no console errors throughout.
"""

from __future__ import annotations

import re
import shutil
import time

import pytest
from playwright.sync_api import Page, expect

from tests.ollama_server import default_responder
from tests.servers import SHARED

pytestmark = pytest.mark.e2e

DUCK = SHARED / "fixtures" / "docling" / "sources" / "duck.md"
USER, PASSWORD = "lifecycle", "correct horse battery"
EXTRA_WORDS = 80

# Every text an upload row's status showed, in order (text nodes keep their text once replaced).
STATUS_RECORDER = """() => {
  window.__statuses = [];
  new MutationObserver((records) => {
    for (const r of records) {
      if (!(r.target.closest && r.target.closest('.upload-status'))) continue;
      for (const n of r.addedNodes) window.__statuses.push(n.textContent);
    }
  }).observe(document.body, {subtree: true, childList: true});
}"""


def last_turn(page: Page):
    return page.locator(".message.assistant").last


def ask(page: Page, text: str) -> None:
    box = page.locator("#composer-input")
    box.fill(text)
    box.press("Enter")


@pytest.fixture
def long_answers(ollama):
    """Streamed answers with EXTRA_WORDS more words after the grounded sentence."""

    def respond(model: str, messages: list[dict], body: dict) -> str:
        text = default_responder(model, messages, body)
        if body.get("stream") is not False:
            text += " " + " ".join(f"more{i}" for i in range(EXTRA_WORDS))
        return text

    ollama.responder = respond
    return ollama


@pytest.fixture(autouse=True)
def no_console_errors(console):
    before = len(console.unexpected())
    yield
    assert console.unexpected()[before:] == []


def test_an_upload_shows_its_indexing_stages_and_chunk_count(page: Page):
    page.goto("/")
    page.get_by_role("button", name="Create an account").click()
    page.get_by_label("Username").fill(USER)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Create account").click()
    expect(page.locator(".user-name")).to_have_text(USER)

    page.get_by_role("link", name="Documents").click()
    page.locator("#new-index-name").fill("birds")
    page.get_by_role("button", name="Create index").click()
    expect(page.locator(".index-title")).to_have_text("birds")
    page.evaluate(STATUS_RECORDER)
    page.locator("#upload-dataset").fill("ducks")
    page.set_input_files("#upload-files", [str(DUCK)])
    duck = page.locator(".upload-item", has_text="duck.md")
    expect(duck).to_have_class(re.compile(r"\bok\b"), timeout=120_000)
    expect(duck.locator(".upload-status")).to_contain_text(re.compile(r"Indexed · \d+ chunks"))
    expect(duck.locator("progress")).to_have_attribute("value", "100")
    shown = page.evaluate("window.__statuses")
    stages = [
        s
        for s in shown
        if s in ("Converting…", "Splitting into passages…", "Embedding…", "Writing to the index…")
    ]
    assert stages == ["Converting…", "Splitting into passages…", "Embedding…", "Writing to the index…"], shown


def test_a_rebuild_shows_per_file_progress_and_keeps_the_documents(page: Page):
    page.evaluate(
        """() => {
          window.__builds = [];
          new MutationObserver((records) => {
            for (const r of records) {
              if (!(r.target.closest && r.target.closest('.build-status'))) continue;
              for (const n of r.addedNodes) window.__builds.push(n.textContent);
            }
          }).observe(document.body, {subtree: true, childList: true});
        }"""
    )
    page.get_by_role("button", name="Rebuild").click()
    status = page.locator(".build-status")
    expect(status).to_contain_text(re.compile(r"Rebuilt · \d+ chunks"), timeout=120_000)
    shown = page.evaluate("window.__builds")
    assert any(re.match(r"Rebuilding · \d+ / 1 files · ducks/duck\.md: \w+", s) for s in shown), shown
    expect(page.locator(".doc-table tbody tr[data-filename='duck.md']")).to_be_visible()
    expect(page.get_by_role("button", name="Rebuild")).to_be_enabled()


def test_stop_stops_the_answer_and_the_chat_takes_the_next_message(page: Page, ollama, long_answers):
    ollama.token_delay_s = 0.2
    page.get_by_role("link", name="New chat", exact=True).click()
    expect(page.locator(".welcome")).to_be_visible()
    ask(page, "What does the duck like to eat?")
    turn = last_turn(page)
    expect(turn.locator(".answer")).to_contain_text("According", timeout=90_000)
    page.get_by_role("button", name="Stop answering").click()
    expect(turn).to_have_attribute("data-state", "stopped")
    expect(turn.locator(".turn-status")).to_contain_text("Stopped")
    kept = turn.locator(".answer").text_content()
    assert f"more{EXTRA_WORDS - 1}" not in kept

    # The model call itself was closed: it stops producing well before its answer's end.
    entry = [r for r in ollama.requests if r["path"] == "/api/chat" and r["body"].get("stream") is not False][
        -1
    ]
    last, since = entry["pieces_sent"], time.monotonic()
    while time.monotonic() - since < 1.5 and not entry["finished"]:
        time.sleep(0.1)
        if entry["pieces_sent"] != last:
            last, since = entry["pieces_sent"], time.monotonic()
    assert entry["finished"] is False

    # The stopped answer is stored as it was shown, marked stopped.
    page.reload()
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-state", "stopped")
    expect(turn.locator(".answer")).to_have_text(kept)

    # And the chat takes the next message at once.
    ollama.token_delay_s = 0.0
    ask(page, "Where do ducks live?")
    expect(page.locator(".message.user")).to_have_count(2)
    expect(last_turn(page)).to_have_attribute("data-state", "done", timeout=90_000)


def test_a_reload_mid_answer_rejoins_the_turn_and_the_answer_keeps_growing(page: Page, ollama, long_answers):
    ollama.token_delay_s = 0.15
    page.get_by_role("link", name="New chat", exact=True).click()
    expect(page.locator(".welcome")).to_be_visible()
    ask(page, "What does the duck like to eat?")
    expect(last_turn(page).locator(".answer")).to_contain_text("According", timeout=90_000)
    page.reload()

    # The question and the answer so far are back, and the answer goes on growing.
    expect(page.locator(".message.user")).to_have_text(["What does the duck like to eat?"])
    turn = last_turn(page)
    expect(turn).to_have_class(re.compile(r"\bstreaming\b"))
    expect(page.get_by_role("button", name="Stop answering")).to_be_visible()
    expect(turn.locator(".answer")).to_contain_text("According")
    first = len(turn.locator(".answer").text_content())
    page.wait_for_function(
        "(n) => [...document.querySelectorAll('.message.assistant .answer')].pop().textContent.length > n",
        arg=first,
        timeout=90_000,
    )
    expect(turn).to_have_attribute("data-state", "done", timeout=120_000)
    expect(turn.locator(".answer")).to_contain_text(f"more{EXTRA_WORDS - 1}")
    expect(turn.locator(".doc-card").first).to_be_visible()
    expect(page.locator(".send-button:not(.stop)")).to_be_visible()


@pytest.mark.skipif(
    shutil.which("tesseract") is None, reason="tesseract is not installed (scripts/setup.sh --dev)"
)
def test_a_scanned_upload_shows_each_page_as_ocr_reads_it(page: Page, tmp_path):
    from tests.unit.test_ocr import text_image

    scan = tmp_path / "ledger-scan.pdf"
    pages = [text_image(p) for p in ("The otter files ledgers.", "A kettle hums.", "Owls guard the archive.")]
    pages[0].save(scan, "PDF", save_all=True, append_images=pages[1:], resolution=200)

    page.get_by_role("link", name="Documents").click()
    page.locator("#new-index-name").fill("scans")
    page.get_by_role("button", name="Create index").click()
    expect(page.locator(".index-title")).to_have_text("scans")
    page.evaluate(STATUS_RECORDER)
    page.set_input_files("#upload-files", [str(scan)])
    row = page.locator(".upload-item", has_text="ledger-scan.pdf")
    expect(row).to_have_class(re.compile(r"\bok\b"), timeout=180_000)
    shown = page.evaluate("window.__statuses")
    reading = [s for s in shown if s.startswith("Reading scanned page")]
    assert reading == [f"Reading scanned page {n} of 3…" for n in (1, 2, 3)], shown
    assert shown.index("Converting…") < shown.index(reading[0]) < shown.index("Splitting into passages…")


def test_the_admin_shares_an_index_with_a_group_and_a_member_asks_it_but_cannot_change_it(
    page: Page, browser, stack, console
):
    """Teams: the administrator (this story's first account) puts a member in a group and shares "birds" with it;
    the member finds it under "Shared with me" with its owner, asks it and gets a cited answer, sees no upload or
    delete control; the admin's audit log shows the share."""
    import httpx

    from tests.e2e.conftest import CSP_REPORTER

    with httpx.Client(base_url=stack, timeout=60) as client:
        r = client.post("/api/auth/register", json={"username": "member1", "password": PASSWORD})
        assert r.status_code == 201, r.text

    page.goto("/#/admin/groups")
    page.locator("#new-group-name").fill("support")
    page.get_by_role("button", name="Create group").click()
    card = page.locator(".group-card[data-group='support']")
    card.get_by_label("Add a member to support").fill("member1")
    card.get_by_role("button", name="Add member").click()
    expect(card.locator(".member[data-member='member1']")).to_be_visible()

    page.get_by_role("link", name="Documents").click()
    page.locator(".index-link", has_text="birds").click()
    expect(page.locator(".index-title")).to_have_text("birds")
    page.get_by_role("button", name="Share").click()
    dialog = page.locator("dialog.modal")
    dialog.locator("#share-kind").select_option("group")
    dialog.locator("#share-group").select_option(label="support")
    dialog.get_by_role("button", name="Share", exact=True).click()
    expect(dialog.locator(".grant-row[data-subject='support']")).to_be_visible()
    dialog.get_by_role("button", name="Done").click()

    context = browser.new_context(viewport={"width": 1280, "height": 860}, base_url=stack)
    context.add_init_script(CSP_REPORTER)
    member = context.new_page()
    member.set_default_timeout(60_000)
    console.watch(member)
    try:
        member.goto("/")
        member.get_by_label("Username").fill("member1")
        member.get_by_label("Password").fill(PASSWORD)
        member.get_by_role("button", name="Sign in").click()
        expect(member.locator(".user-name")).to_have_text("member1")
        expect(member.get_by_role("link", name="Admin")).to_have_count(0)

        member.get_by_role("link", name="Documents").click()
        expect(member.locator(".pane-subtitle")).to_have_text(["Shared with me"])
        shared = member.locator(".index-link", has_text="birds")
        expect(shared.locator(".index-owner")).to_have_text(USER)
        shared.click()
        expect(member.locator(".index-title")).to_have_text("birds")
        expect(member.locator(".index-access")).to_have_text(f"Owner: {USER} · You can ask (group support)")
        expect(member.locator(".doc-table tbody tr[data-filename='duck.md']")).to_be_visible()
        # A reader: no upload, no rebuild, no delete, no share.
        expect(member.locator(".dropzone")).to_have_count(0)
        expect(member.locator("#upload-files")).to_have_count(0)
        expect(member.get_by_role("button", name="Delete index")).to_have_count(0)
        expect(member.get_by_role("button", name="Delete duck.md")).to_have_count(0)
        expect(member.get_by_role("button", name="Share")).to_have_count(0)
        expect(member.get_by_role("button", name="Rebuild")).to_be_hidden()

        member.get_by_role("link", name="New chat", exact=True).click()
        expect(member.locator(".welcome")).to_be_visible()
        ask(member, "What does the duck like to eat?")
        turn = last_turn(member)
        expect(turn).to_have_attribute("data-state", "done", timeout=120_000)
        expect(turn.locator(".answer")).to_contain_text("According to the sources")
        expect(turn.locator(".doc-card").first).to_be_visible()
    finally:
        context.close()

    page.goto("/#/admin/audit")
    grant = page.locator(".audit-row[data-action='index.grant']").first
    expect(grant).to_contain_text("shared “birds” with support as reader")
    expect(grant).to_contain_text(USER)
    page.locator("#audit-action").select_option("group.")
    expect(page.locator(".audit-row").first).to_contain_text("added member1 to support")


def test_an_index_made_in_korean_says_so_in_the_list(page: Page, stack):
    """The create form's language and embedder go to the worker's table, and the index list shows them."""
    import httpx

    page.goto("/#/documents")
    page.locator("#new-index-name").fill("hangul")
    page.get_by_label("Language of its documents").select_option("ko")
    page.get_by_role("button", name="Create index").click()
    expect(page.locator(".index-title")).to_have_text("hangul")
    link = page.locator(".index-link", has_text="hangul")
    expect(link.locator(".index-settings")).to_have_text("Korean · MiniLM (English)")
    # The first index, made with the defaults, says those.
    expect(page.locator(".index-link", has_text="birds").locator(".index-settings")).to_have_text(
        "English · MiniLM (English)"
    )
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    with httpx.Client(base_url=stack, timeout=60, cookies=cookies) as client:
        made = [i for i in client.get("/api/indexes").json() if i["name"] == "hangul"]
    assert [(i["language"], i["embedder"]) for i in made] == [("ko", "default")]
