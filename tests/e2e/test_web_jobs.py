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


def scan(path):
    from tests.unit.test_ocr import text_image

    pages = [text_image(f"Ledger page {n}: the otter counted {n * 11} reeds.") for n in range(1, PAGES + 1)]
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
