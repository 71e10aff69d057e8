"""The source viewer in the real browser: a citation opens the original beside the answer, at the passage.

One story on one stack and one tab: a text PDF (page 3 of docling's multi_page.pdf), a scanned PDF (OCR boxes)
and a spreadsheet row are cited and opened, each highlighted where the passage is; then what went wrong since
(a deleted file, a page past the end) is said in the viewer. The fake model cites the source that shares most
words with the question (tests/ollama_server.default_responder).
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.servers import SHARED

pytestmark = pytest.mark.e2e

MULTI_PAGE = SHARED / "fixtures" / "docling" / "sources" / "multi_page.pdf"
ONE_PAGE = SHARED / "fixtures" / "py-pdf-sample-files" / "001-trivial" / "minimal-document.pdf"
USER, PASSWORD = "viewer-reader", "correct horse battery"
SCAN_SENTENCE = "The heron audits seventeen lanterns every winter morning."
LEGAL_QUESTION = "Which word processors are tailored for legal professionals, like legal document processors?"
WORD = re.compile(r"[A-Za-z0-9]+")


def first_words(text: str, n: int = 3) -> list[str]:
    return WORD.findall(text)[:n]


def make_scan(path) -> None:
    """A three-page scanned PDF (images only): the sentence drawn on page 3, the others blank."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=40)
    pages = []
    for number in (1, 2, 3):
        image = Image.new("RGB", (1275, 1650), "white")  # US letter at 150 dpi
        if number == 3:
            ImageDraw.Draw(image).text((150, 900), SCAN_SENTENCE, fill="black", font=font)
        pages.append(image)
    pages[0].save(path, "PDF", resolution=150, save_all=True, append_images=pages[1:])


def make_sheet(path) -> None:
    import openpyxl

    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Wards"
    sheet.append(["ward", "beds", "nurse"])
    for i in range(60):
        sheet.append([f"ward{i}", i * 3, f"nurse{i} duty"])
    book.save(path)


def cited(page: Page, turn) -> dict:
    """The answer's first cited document, as the gateway stored it."""
    ref = turn.locator(".answer a.cite").first.text_content()
    chat_id = page.evaluate("location.hash").split("/")[2]
    chat = page.request.get(f"/api/chats/{chat_id}").json()
    answer = [m for m in chat["messages"] if m["role"] == "assistant"][-1]
    return next(d for d in answer["documents"] if d["ref"] == ref)


def ask(page: Page, text: str):
    box = page.locator("#composer-input")
    box.fill(text)
    box.press("Enter")
    turn = page.locator(".message.assistant").last
    expect(turn).to_have_attribute("data-state", "done", timeout=120_000)
    expect(page.locator(".send-button:not(.stop)")).to_be_visible()
    return turn


def open_citation(turn):
    turn.locator(".answer a.cite").first.click()


@pytest.mark.skipif(
    not MULTI_PAGE.exists(), reason="needs ../shared (fixtures/docling/sources/multi_page.pdf)"
)
def test_a_citation_opens_its_original_at_the_passage(page: Page, console, tmp_path):
    ranges: list[int] = []
    page.on("response", lambda r: "/download" in r.url and ranges.append(r.status))
    page.goto("/")
    page.get_by_role("button", name="Create an account").click()
    page.get_by_label("Username").fill(USER)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Create account").click()
    expect(page.locator(".user-name")).to_have_text(USER)

    page.get_by_role("link", name="Documents").click()
    page.locator("#new-index-name").fill("sources")
    page.get_by_role("button", name="Create index").click()
    scan, sheet = tmp_path / "scan.pdf", tmp_path / "wards.xlsx"
    make_scan(scan)
    make_sheet(sheet)
    page.set_input_files("#upload-files", [str(MULTI_PAGE), str(scan), str(sheet)])
    for name in ("multi_page.pdf", "scan.pdf", "wards.xlsx"):
        expect(page.locator(".upload-item", has_text=name)).to_have_class(
            re.compile(r"\bok\b"), timeout=180_000
        )

    page.get_by_role("link", name="New chat", exact=True).click()
    page.locator("label[for='force-rag']").click()  # a spreadsheet question must search, not compute
    viewer = page.locator(".source-viewer")

    # 1. Page 3 of a text PDF: PDF.js renders the page, the passage's boxes marked, its text-layer spans inside.
    turn = ask(page, LEGAL_QUESTION)
    doc = cited(page, turn)
    assert doc["filename"] == "multi_page.pdf" and doc["page"] == 3, doc
    expect(turn.locator(f".doc-card[data-ref='{doc['ref']}'] .doc-place")).to_contain_text("p. 3")
    open_citation(turn)
    expect(viewer).to_have_attribute("data-state", "ready", timeout=60_000)
    expect(viewer.locator(".source-title")).to_contain_text("multi_page.pdf")
    shown = viewer.locator(".pdf-page[data-page='3']")
    expect(shown).to_be_visible()
    expect(viewer.locator(".pdf-page-label")).to_have_text("Page 3 of 5 · cited")
    assert viewer.locator(".pdf-mark").count() >= 1
    highlighted = " ".join(viewer.locator(".textLayer span.passage").all_text_contents())
    words = first_words(doc["text"])
    assert " ".join(words) in " ".join(WORD.findall(highlighted)), (words, highlighted[:300])
    # the marks lie over the page where the passage's spans are (not merely somewhere on it)
    overlap = page.evaluate(
        """() => {
          const spans = [...document.querySelectorAll('.textLayer span.passage')].map(s => s.getBoundingClientRect());
          return [...document.querySelectorAll('.pdf-mark')].some(m => { const b = m.getBoundingClientRect();
            return spans.some(s => s.left < b.right && b.left < s.right && s.top < b.bottom && b.top < s.bottom); });
        }"""
    )
    assert overlap
    assert 206 in ranges, ranges  # the PDF was read in byte ranges
    assert not console.unexpected(), console.unexpected()

    # 2. A scanned PDF: no text layer of its own, so the OCR text is laid into Tesseract's boxes on page 3.
    turn = ask(page, "What does the heron audit every winter morning?")
    doc = cited(page, turn)
    assert doc["filename"] == "scan.pdf" and doc["page"] == 3 and doc["location"]["ocr"], doc
    open_citation(turn)
    expect(viewer.locator(".source-title")).to_contain_text("scan.pdf")
    expect(viewer).to_have_attribute("data-state", "ready", timeout=60_000)
    expect(viewer.locator(".pdf-page[data-page='3']")).to_be_visible()
    ocr_text = viewer.locator(".textLayer .passage").first.text_content()
    assert " ".join(first_words(SCAN_SENTENCE)).lower() in " ".join(WORD.findall(ocr_text)).lower(), ocr_text
    box = page.evaluate(
        """() => { const p = document.querySelector('.pdf-page').getBoundingClientRect();
          const m = document.querySelector('.pdf-mark').getBoundingClientRect();
          return [(m.left - p.left) / p.width, (m.top - p.top) / p.height]; }"""
    )
    # the sentence was drawn at (150, 900) px of a 1275 x 1650 px page
    assert box[0] == pytest.approx(150 / 1275, abs=0.03) and box[1] == pytest.approx(900 / 1650, abs=0.03), (
        box
    )

    # 3. A spreadsheet row: the cited rows as a small table, cited by sheet and rows, not "p. 1".
    turn = ask(page, "Which ward has nurse37 duty?")
    doc = cited(page, turn)
    assert doc["filename"] == "wards.xlsx" and doc["location"]["sheet"] == "Wards", doc
    first, last = doc["location"]["rows"]
    label = f"Sheet 'Wards', rows {first}–{last}"
    expect(turn.locator(f".doc-card[data-ref='{doc['ref']}'] .doc-place")).to_contain_text(label)
    open_citation(turn)
    expect(viewer.locator(".source-title")).to_contain_text("wards.xlsx")
    expect(viewer).to_have_attribute("data-state", "ready", timeout=60_000)
    expect(viewer.locator(".sheet-caption")).to_have_text(label)
    expect(viewer.locator(".source-table.passage table")).to_contain_text("nurse37 duty")
    assert first <= 39 <= last  # ward37 is on the sheet's row 39 (header, then ward0 on row 2)

    # 4. What happened since is said, never a blank pane: a deleted file, a page past the end.
    console.expected.append("404")
    origin = {"Origin": page.evaluate("location.origin")}  # a cookie-signed write names its page's origin
    index = page.request.get("/api/indexes").json()
    index = index[0] if isinstance(index, list) else index["indexes"][0]
    docs = {
        d["filename"]: d["id"] for d in page.request.get(f"/api/indexes/{index['id']}").json()["documents"]
    }
    deleted = page.request.delete(
        f"/api/indexes/{index['id']}/documents/{docs['wards.xlsx']}", headers=origin
    )
    assert deleted.status == 204, deleted.text()
    open_citation(turn)
    expect(viewer).to_have_attribute("data-state", "error")
    expect(viewer.locator(".source-error")).to_contain_text("'wards.xlsx' was deleted from the index")
    # The PDF replaced by a one-page file under the same name, uploaded by the page itself (as the browser does).
    status = page.evaluate(
        """async ([url, b64]) => {
          const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
          const form = new FormData();
          form.append("file", new Blob([bytes], { type: "application/pdf" }), "multi_page.pdf");
          return (await fetch(url, { method: "POST", body: form, credentials: "same-origin" })).status;
        }""",
        # ?wait=1: answered once indexed, so the citation below meets the replaced file.
        [f"/api/indexes/{index['id']}/documents?wait=1", base64.b64encode(ONE_PAGE.read_bytes()).decode()],
    )
    assert status == 201, status
    first_turn = page.locator(".message.assistant").first
    open_citation(first_turn)
    expect(viewer).to_have_attribute("data-state", "error", timeout=60_000)
    expect(viewer.locator(".source-error")).to_contain_text("cites page 3, but multi_page.pdf has 1 page now")
    expect(viewer.locator(".source-note")).to_contain_text("replaced")
    viewer.get_by_role("button", name="Close the source").click()
    expect(viewer).to_be_hidden()
    assert not console.unexpected(), console.unexpected()


@pytest.mark.skipif(
    not MULTI_PAGE.exists(), reason="needs ../shared (fixtures/docling/sources/multi_page.pdf)"
)
def test_an_answer_is_rated_and_the_chat_exported_from_the_web(page: Page, console):
    """The same tab and chat as the story above: rate its first answer down with a reason, review it in Admin →
    Ratings, see it kept after a reload and changed to up, then export the chat as Markdown with its citations
    resolved."""
    first = page.locator(".message.assistant").first
    first.get_by_role("button", name="Bad answer").click()
    first.locator(".feedback-reason").select_option("bad_citation")
    first.locator(".feedback-comment").fill("cites the wrong paragraph")
    first.get_by_role("button", name="Send feedback").click()
    expect(first.locator(".feedback-status")).to_have_text("Thanks, your feedback is saved.")

    # The first account is the administrator: Admin → Ratings lists the rating with its question, reason and
    # comment, exports it as JSON lines, and a filter on "up" leaves it out.
    chat_hash = page.evaluate("location.hash")
    page.get_by_role("link", name="Admin", exact=True).click()
    page.get_by_role("tab", name="Ratings").click()
    item = page.locator(".rating-item")
    expect(item).to_have_count(1)
    expect(item).to_have_attribute("data-rating", "down")
    expect(item.locator(".rating-question")).to_have_text(LEGAL_QUESTION)
    expect(item.locator(".rating-reason")).to_have_text("Bad citation")
    expect(item.locator(".rating-comment")).to_have_text("cites the wrong paragraph")
    expect(item.locator(".rating-indexes")).to_have_text("sources")
    expect(item.locator(".rating-docs")).to_contain_text("multi_page.pdf — p. 3")
    with page.expect_download() as download:
        page.get_by_role("button", name="Export JSON lines").click()
    lines = Path(download.value.path()).read_text(encoding="utf-8").splitlines()
    assert [(r["rating"], r["reason"], r["comment"]) for r in map(json.loads, lines)] == [
        ("down", "bad_citation", "cites the wrong paragraph")
    ]
    page.locator("#ratings-rating").select_option("up")
    expect(page.locator(".rating-empty")).to_have_text("No ratings match these filters.")
    expect(item).to_have_count(0)
    page.goto(f"/{chat_hash}")
    page.reload()
    first = page.locator(".message.assistant").first
    expect(first.get_by_role("button", name="Bad answer")).to_have_attribute("aria-pressed", "true")
    first.get_by_role("button", name="Good answer").click()
    expect(first.get_by_role("button", name="Good answer")).to_have_attribute("aria-pressed", "true")
    chat_id = page.evaluate("location.hash").split("/")[2]
    ratings = page.request.get(f"/api/chats/{chat_id}/feedback").json()["feedback"]
    assert [r["rating"] for r in ratings.values()] == ["up"]

    page.locator(".export-menu > summary").click()
    with page.expect_download() as download:
        page.get_by_role("button", name="Markdown").click()
    markdown = Path(download.value.path()).read_text(encoding="utf-8")
    assert download.value.suggested_filename.endswith(".md")
    assert markdown.count("\n## ") == 3
    assert re.search(r"^- \[S\d+\] multi\\_page\.pdf — p\. 3", markdown, re.MULTILINE), markdown[:2000]
    assert "Sheet 'Wards', rows" in markdown and SCAN_SENTENCE.split()[1] in markdown
    assert not console.unexpected(), console.unexpected()
