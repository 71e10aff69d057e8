"""Uploads are the gateway's jobs (issue 30) in the real browser: a multi-page scan is sent, the page is left
while OCR reads it (its request goes with the page), and coming back shows the same upload still in progress,
from the index's jobs, to its end: "Indexed". A second device signed in as the same user sees it too.
"""

from __future__ import annotations

import re
import shutil

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.conftest import CSP_REPORTER

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        shutil.which("tesseract") is None, reason="tesseract is not installed (scripts/setup.sh --dev)"
    ),
]

USER, PASSWORD = "jobs-e2e", "correct horse battery"
PAGES = 6


@pytest.fixture(autouse=True)
def no_console_errors(console):
    before = len(console.unexpected())
    yield
    assert console.unexpected()[before:] == []


def scan(path, animal: str = "otter", count: int = PAGES):
    from tests.unit.test_ocr import text_image

    pages = [
        text_image(f"Ledger page {n}: the {animal} counted {n * 11} reeds.") for n in range(1, count + 1)
    ]
    pages[0].save(path, "PDF", save_all=True, append_images=pages[1:], resolution=200)
    return path


def sign_in(page: Page) -> None:
    page.goto("/")
    page.get_by_label("Username").fill(USER)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator(".user-name")).to_have_text(USER)


def test_an_upload_left_mid_scan_shows_its_progress_on_return_and_elsewhere_and_ends_done(
    page: Page, browser, stack, console, tmp_path
):
    page.goto("/")
    page.get_by_role("button", name="Create an account").click()
    page.get_by_label("Username").fill(USER)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Create account").click()
    expect(page.locator(".user-name")).to_have_text(USER)
    page.get_by_role("link", name="Documents").click()
    page.locator("#new-index-name").fill("ledgers")
    page.get_by_role("button", name="Create index").click()
    expect(page.locator(".index-title")).to_have_text("ledgers")

    page.set_input_files("#upload-files", [str(scan(tmp_path / "ledger-scan.pdf"))])
    row = page.locator(".upload-item", has_text="ledger-scan.pdf")
    expect(row.locator(".upload-status")).to_contain_text("Reading scanned page", timeout=120_000)

    # Leave: a whole other page loads (the upload's request, and this page's state, go with it).
    page.goto("about:blank")

    # Another device, signed in as the same user, sees the upload being indexed.
    other = browser.new_context(viewport={"width": 1000, "height": 800}, base_url=stack)
    other.add_init_script(CSP_REPORTER)
    elsewhere = other.new_page()
    elsewhere.set_default_timeout(60_000)
    console.watch(elsewhere)
    try:
        sign_in(elsewhere)
        elsewhere.get_by_role("link", name="Documents").click()
        expect(elsewhere.locator(".index-title")).to_have_text("ledgers")
        there = elsewhere.locator(".upload-item", has_text="ledger-scan.pdf")
        expect(there).to_be_visible()

        # Come back: the progress is there, from the job, and ends in "Indexed".
        page.goto("/")
        expect(page.locator(".user-name")).to_have_text(USER)
        page.get_by_role("link", name="Documents").click()
        expect(page.locator(".index-title")).to_have_text("ledgers")
        back = page.locator(".upload-item", has_text="ledger-scan.pdf")
        expect(back).to_be_visible()
        status = back.locator(".upload-status")
        expect(status).to_have_text(re.compile(r"Reading scanned page \d+ of 6…|Splitting|Embedding|Writing"))
        expect(back).to_have_class(re.compile(r"\bok\b"), timeout=240_000)
        expect(status).to_have_text(re.compile(r"Indexed · \d+ chunks?"))
        expect(back.locator("progress")).to_have_attribute("value", "100")
        expect(page.locator(".doc-table tbody tr[data-filename='ledger-scan.pdf']")).to_be_visible()

        expect(there).to_have_class(re.compile(r"\bok\b"), timeout=60_000)
        expect(there.locator(".upload-status")).to_have_text(re.compile(r"Indexed · \d+ chunks?"))
        # One upload, one row on each side: the job was not shown twice.
        expect(page.locator(".upload-item", has_text="ledger-scan.pdf")).to_have_count(1)
        expect(elsewhere.locator(".upload-item", has_text="ledger-scan.pdf")).to_have_count(1)
    finally:
        other.close()


def test_uploads_cancelled_while_queued_or_being_read_show_cancelled_and_index_nothing(
    browser, stack, console, tmp_path
):
    # A browser of its own: the module's page is signed in as the first test's user.
    context = browser.new_context(viewport={"width": 1000, "height": 800}, base_url=stack)
    context.add_init_script(CSP_REPORTER)
    page = context.new_page()
    page.set_default_timeout(60_000)
    console.watch(page)
    try:
        cancel_two_uploads(page, tmp_path)
    finally:
        context.close()


def cancel_two_uploads(page: Page, tmp_path) -> None:
    page.goto("/")
    page.get_by_role("button", name="Create an account").click()
    page.get_by_label("Username").fill("jobs-cancel-e2e")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Create account").click()
    expect(page.locator(".user-name")).to_have_text("jobs-cancel-e2e")
    page.get_by_role("link", name="Documents").click()
    page.locator("#new-index-name").fill("drafts")
    page.get_by_role("button", name="Create index").click()
    expect(page.locator(".index-title")).to_have_text("drafts")

    # Two scans: the index's jobs run one at a time, so while the first (long: it is cancelled long before its
    # end) is read, the second waits, queued.
    first = scan(tmp_path / "first-scan.pdf", "heron", 60)
    second = scan(tmp_path / "second-scan.pdf", "beaver")
    page.set_input_files("#upload-files", [str(first)])
    reading = page.locator(".upload-item", has_text="first-scan.pdf")
    expect(reading.locator(".upload-status")).to_contain_text("Reading scanned page", timeout=120_000)
    page.set_input_files("#upload-files", [str(second)])
    waiting = page.locator(".upload-item", has_text="second-scan.pdf")
    expect(waiting.locator(".upload-status")).to_have_text("Waiting to be indexed…")  # sent, queued
    expect(reading.locator(".upload-status")).to_contain_text("Reading scanned page")  # still the first

    waiting.get_by_role("button", name="Cancel the upload of second-scan.pdf").click()
    expect(waiting.locator(".upload-status")).to_have_text("Cancelled")
    reading.get_by_role("button", name="Cancel the upload of first-scan.pdf").click()
    expect(reading.locator(".upload-status")).to_have_text("Cancelled", timeout=30_000)
    expect(reading).not_to_have_class(re.compile(r"\b(ok|failed)\b"))
    expect(reading.get_by_role("button", name=re.compile("Cancel the upload"))).to_be_hidden()
    expect(page.locator(".empty-table")).to_have_text("No documents in this index yet.")

    # Away and back: the uploads that ended meanwhile show with their outcome, and nothing was indexed.
    page.goto("about:blank")
    page.goto("/")
    page.get_by_role("link", name="Documents").click()
    expect(page.locator(".index-title")).to_have_text("drafts")
    for name in ("first-scan.pdf", "second-scan.pdf"):
        expect(page.locator(".upload-item", has_text=name).locator(".upload-status")).to_have_text(
            "Cancelled"
        )
    expect(page.locator(".upload-item")).to_have_count(2)
    expect(page.locator(".empty-table")).to_have_text("No documents in this index yet.")
