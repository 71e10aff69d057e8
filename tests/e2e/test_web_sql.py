"""A spreadsheet question in the real browser: the document card shows the query and the computed result table."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from rag_worker.pipeline.prompts import DEFAULTS
from tests.ollama_server import default_responder

pytestmark = pytest.mark.e2e

USER, PASSWORD = "sql-admin", "correct horse battery"
CSV = b"Ward,Cost\nNorth,$1200.50\nSouth,$800\nNorth,$950\n"
QUERY = "SELECT ward, SUM(cost) AS total_cost FROM costs GROUP BY ward ORDER BY ward"


def test_a_table_answer_shows_its_query_and_rows(page: Page, ollama, tmp_path):
    page.goto("/")
    page.get_by_role("button", name="Create an account").click()
    page.get_by_label("Username").fill(USER)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Create account").click()
    expect(page.locator(".user-name")).to_have_text(USER)

    page.get_by_role("link", name="Documents").click()
    page.locator("#new-index-name").fill("wards")
    page.get_by_role("button", name="Create index").click()
    sheet = tmp_path / "costs.csv"
    sheet.write_bytes(CSV)
    page.set_input_files("#upload-files", [str(sheet)])
    expect(page.locator(".upload-item", has_text="costs.csv")).to_have_class(
        re.compile(r"\bok\b"), timeout=120_000
    )

    def respond(model, messages, request):
        if messages and messages[0].get("content") == DEFAULTS["sql"]:
            return QUERY
        return default_responder(model, messages, request)

    ollama.responder = respond
    page.get_by_role("link", name="New chat", exact=True).click()
    box = page.locator("#composer-input")
    box.fill("What is the total cost per ward?")
    box.press("Enter")
    turn = page.locator(".message.assistant").last
    expect(turn).to_have_attribute("data-state", "done", timeout=90_000)
    expect(turn.locator(".step[data-step='sql']").first).to_be_visible()
    card = turn.locator(".doc-card.table-card")
    expect(card.locator(".sql-query")).to_have_text(QUERY)
    expect(card.locator(".result-table th")).to_have_text(["ward", "total_cost"])
    expect(card.locator(".result-table tbody tr").first.locator("td")).to_have_text(["North", "2150.5"])
    expect(turn.locator(".answer")).to_contain_text("2150.5")
