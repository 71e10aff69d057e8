"""The web in French: a browser whose language is French (navigator.languages and Accept-Language, as
Chromium's --lang=fr-FR gives them) gets French labels, <html lang="fr"> and dates formatted by Intl in French;
the switch in Settings turns the interface to English, and the choice is remembered across reloads.

Only the gateway runs (these pages never ask the worker). No console errors throughout."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.conftest import CHROMIUM, CSP_REPORTER
from tests.servers import ROOT, free_port, gateway_process

pytestmark = pytest.mark.e2e

USER, PASSWORD = "francoise", "cheval correct agrafe"
# The French abbreviated month names (CLDR, as Intl.DateTimeFormat("fr", {dateStyle: "medium"}) writes them).
FR_MONTHS = [
    "janv.",
    "févr.",
    "mars",
    "avr.",
    "mai",
    "juin",
    "juil.",
    "août",
    "sept.",
    "oct.",
    "nov.",
    "déc.",
]
EN_MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    if not (ROOT / "web" / "node_modules" / "marked").exists():
        pytest.skip("web/node_modules is missing: run `npm ci --prefix web`")
    tmp = tmp_path_factory.mktemp("e2e-french")
    with gateway_process(tmp, worker_url=f"http://127.0.0.1:{free_port()}") as gateway:
        yield gateway.url


@pytest.fixture(scope="module")
def page(browser, stack, console):
    """A tab of a browser set to French first (then English), as a French user's would be."""
    context = browser.new_context(
        viewport={"width": 1280, "height": 860},
        base_url=stack,
        locale="fr-FR",
        extra_http_headers={"Accept-Language": "fr-FR,fr;q=0.9,en;q=0.5"},
    )
    context.add_init_script(CSP_REPORTER)
    page = context.new_page()
    page.set_default_timeout(60_000)
    console.watch(page)
    yield page
    context.close()


@pytest.fixture(autouse=True)
def no_console_errors(console):
    before = len(console.unexpected())
    yield
    assert console.unexpected()[before:] == []


def test_a_french_browser_gets_the_interface_in_french(page: Page):
    assert page.evaluate("navigator.languages")[0].startswith("fr")
    page.goto("/")
    expect(page.locator("html")).to_have_attribute("lang", "fr")
    expect(page.get_by_role("heading", name="Bon retour")).to_be_visible()
    expect(page.locator(".skip-link")).to_have_text("Aller au contenu")
    page.get_by_role("button", name="Créer un compte").click()
    page.get_by_label("Nom d’utilisateur").fill(USER)
    page.get_by_label("Mot de passe").fill(PASSWORD)
    page.get_by_role("button", name="Créer le compte").click()
    expect(page.locator(".user-name")).to_have_text(USER)
    expect(page.get_by_role("link", name="Nouvelle discussion")).to_be_visible()
    expect(page.get_by_role("link", name="Paramètres")).to_be_visible()
    expect(page.get_by_role("heading", name="Que voulez-vous savoir ?")).to_be_visible()
    expect(page.get_by_placeholder("Posez une question sur vos documents…")).to_be_visible()
    assert page.title().endswith("· RAG Chat") and page.title().startswith("Nouvelle discussion")


def test_dates_are_french(page: Page):
    page.get_by_role("link", name="Clés d’API").click()
    expect(page.get_by_role("heading", name="Nouvelle clé d’API")).to_be_visible()
    page.get_by_label("Nom", exact=True).fill("tableau de bord")
    page.get_by_label("Expire").select_option("30")
    page.get_by_role("button", name="Créer la clé").click()
    page.get_by_role("button", name="C’est fait, je l’ai conservée").click()
    row = page.locator(".keys-table tbody tr[data-key-name='tableau de bord']")
    expect(row).to_contain_text("à l’instant")  # created: Intl.RelativeTimeFormat's French, via the catalogue
    expect(row).to_contain_text("jamais")  # never used
    expires = row.locator("td time[datetime]").last
    when = datetime.fromisoformat(expires.get_attribute("datetime").replace("Z", "+00:00")).astimezone()
    # "1 janv. 2027": day, French month, year, in that order (the English would be "Jan 1, 2027").
    expect(expires).to_have_text(f"{when.day} {FR_MONTHS[when.month - 1]} {when.year}")
    headers = page.locator(".keys-table thead th")
    expect(headers.nth(0)).to_have_text("Nom")
    expect(headers.nth(4)).to_have_text("Dernière utilisation")


def test_the_switch_to_english_works_and_is_remembered(page: Page):
    page.get_by_role("link", name="Paramètres").click()
    choice = page.get_by_label("Langue de l’interface")
    expect(choice).to_have_value("fr")
    with page.expect_navigation():
        choice.select_option("en")
    expect(page.locator("html")).to_have_attribute("lang", "en")
    expect(page.get_by_role("link", name="New chat")).to_be_visible()
    expect(page.get_by_role("heading", name="Settings", exact=True)).to_be_visible()
    expect(page.get_by_label("Interface language")).to_have_value("en")

    # Remembered: the browser still prefers French, the interface stays English after a reload.
    page.get_by_role("link", name="API keys").click()
    page.reload()
    expect(page.locator("html")).to_have_attribute("lang", "en")
    row = page.locator(".keys-table tbody tr[data-key-name='tableau de bord']")
    expires = row.locator("td time[datetime]").last
    when = datetime.fromisoformat(expires.get_attribute("datetime").replace("Z", "+00:00")).astimezone()
    expect(expires).to_have_text(f"{EN_MONTHS[when.month - 1]} {when.day}, {when.year}")
    expect(row).to_contain_text("never")

    # And back to French from the switch.
    page.get_by_role("link", name="Settings").click()
    with page.expect_navigation():
        page.get_by_label("Interface language").select_option("fr")
    expect(page.get_by_role("link", name="Nouvelle discussion")).to_be_visible()


def test_the_index_list_names_languages_in_french(page: Page):
    page.get_by_role("link", name="Documents").click()
    expect(page.get_by_label("Langue de ses documents")).to_have_value("en")
    page.locator("#new-index-name").fill("manuel")
    page.get_by_role("button", name="Créer l’index").click()
    expect(page.locator(".index-title")).to_have_text("manuel")
    # Intl.DisplayNames names the index's language in the interface's language.
    expect(page.locator(".index-link", has_text="manuel").locator(".index-settings")).to_have_text(
        "anglais · MiniLM (anglais)"
    )
    expect(page.locator(".index-stats")).to_contain_text("0 document")


def test_a_turn_carries_the_interface_language(page: Page, console):
    """Each turn sends the interface's locale as `options.language`, so the worker answers "merci ?" (too short to
    detect) in French. Only the gateway runs here: the request is what is checked, the turn itself then fails."""
    import json

    console.expected.extend(["status of 50", "Failed to load resource"])  # no worker behind this gateway
    page.get_by_role("link", name="Nouvelle discussion").click()
    box = page.get_by_placeholder("Posez une question sur vos documents…")
    box.fill("merci ?")
    with page.expect_request(lambda r: r.url.endswith("/messages/stream") and r.method == "POST") as sent:
        box.press("Enter")
    body = json.loads(sent.value.post_data)
    assert body["message"] == "merci ?" and body["options"]["language"] == "fr", body
    # The turn ends (failed: no worker) and the composer takes messages again.
    expect(page.locator(".send-button:not(.stop)")).to_be_visible(timeout=90_000)


def test_a_known_refusal_is_shown_in_french(browser, stack, console):
    """The gateway's errors are English; a refusal with a known `code` (here `username_taken`) is shown from the
    web's catalogue, in French, instead of the server's text."""
    import httpx

    taken = httpx.post(stack + "/api/auth/register", json={"username": "deja_pris", "password": PASSWORD})
    assert taken.status_code == 201, taken.text
    console.expected.append("status of 409")  # the refused registration's response, logged by Chromium
    context = browser.new_context(base_url=stack, locale="fr-FR")
    try:
        page = context.new_page()
        console.watch(page)
        page.goto("/")
        page.get_by_role("button", name="Créer un compte").click()
        page.get_by_label("Nom d’utilisateur").fill("deja_pris")
        page.get_by_label("Mot de passe").fill(PASSWORD)
        page.get_by_role("button", name="Créer le compte").click()
        expect(page.get_by_text("Ce nom d’utilisateur est déjà pris.")).to_be_visible()
        expect(page.get_by_text("this username is taken")).to_have_count(0)
    finally:
        context.close()
