"""The API keys page and the Admin area's Users tab in a real browser. A user creates a key and sees its
secret once (copied with the button), it works on /v1/models, it is gone from the page after, and once revoked
it no longer works; the administrator makes another account an admin, resets its password and disables it.

Neither page needs the worker, so this module's gateway runs without one (a closed port): one gateway boot, no
worker boot. No console errors throughout."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.e2e.conftest import CHROMIUM
from tests.servers import ROOT, free_port, gateway_process

pytestmark = pytest.mark.e2e

USER, PASSWORD = "keyholder", "correct horse battery"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The real gateway alone (the conftest's stack starts a worker too, which these pages never ask)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    if not (ROOT / "web" / "node_modules" / "marked").exists():
        pytest.skip("web/node_modules is missing: run `npm ci --prefix web`")
    tmp = tmp_path_factory.mktemp("e2e-keys")
    with gateway_process(tmp, worker_url=f"http://127.0.0.1:{free_port()}") as gateway:
        yield gateway.url


@pytest.fixture(autouse=True)
def no_console_errors(console):
    before = len(console.unexpected())
    yield
    assert console.unexpected()[before:] == []


def models(stack: str, key: str) -> httpx.Response:
    return httpx.get(f"{stack}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_a_key_is_shown_once_works_and_stops_working_once_revoked(page: Page, stack):
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=stack)
    page.goto("/")
    page.get_by_role("button", name="Create an account").click()
    page.get_by_label("Username").fill(USER)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Create account").click()
    expect(page.locator(".user-name")).to_have_text(USER)

    page.get_by_role("link", name="API keys").click()
    expect(page.locator(".empty-keys")).to_be_visible()
    page.get_by_label("Name").fill("nightly report")
    page.get_by_role("button", name="Create key").click()
    secret_box = page.locator("#key-secret")
    expect(secret_box).to_be_visible()
    secret = secret_box.input_value()
    assert secret.startswith("rag_") and len(secret) > 40
    page.get_by_role("button", name="Copy").click()
    expect(page.locator(".key-secret-row [role=status]")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == secret
    row = page.locator(".keys-table tbody tr[data-key-name='nightly report']")
    expect(row.locator(".key-prefix")).to_have_text(f"{secret[:12]}…")
    expect(row).to_contain_text("full")

    # The key works as a program would use it.
    r = models(stack, secret)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "direct"

    # Shown once: gone when dismissed, and nowhere after a reload.
    page.get_by_role("button", name="Done, I have stored it").click()
    expect(secret_box).to_have_count(0)
    page.reload()
    expect(row).to_be_visible()
    expect(row).to_contain_text("just now")  # last used: the request above
    assert secret not in page.content()

    # A read-only key with an expiry shows as such.
    page.get_by_label("Name").fill("dashboard")
    page.get_by_label("Expires").select_option("30")
    page.get_by_text("Read-only: it can ask").click()
    page.get_by_role("button", name="Create key").click()
    expect(page.locator("#key-secret")).to_be_visible()
    reader = page.locator(".keys-table tbody tr[data-key-name='dashboard']")
    expect(reader).to_contain_text("read-only")
    expect(reader.locator("time[datetime]").last).to_be_visible()

    # Revoked: off the list, and refused.
    row.get_by_role("button", name="Revoke nightly report").click()
    page.locator("dialog").get_by_role("button", name="Revoke").click()
    expect(row).to_have_count(0)
    r = models(stack, secret)
    assert (r.status_code, r.json()["error"]["code"]) == (401, "key_revoked")


def test_the_administrator_manages_users_on_their_page(page: Page, stack):
    # keyholder registered first: the administrator. Another account signs up on its own.
    r = httpx.post(
        f"{stack}/api/auth/register", json={"username": "newcomer", "password": PASSWORD}, timeout=30
    )
    assert r.status_code == 201
    page.get_by_role("link", name="Admin").click()
    page.get_by_role("tab", name="Users").click()
    row = page.locator(".users-table tbody tr[data-username='newcomer']")
    expect(row.locator(".account-role")).to_have_text("user")

    row.get_by_role("button", name="Make admin newcomer").click()
    page.locator("dialog").get_by_role("button", name="Make admin").click()
    expect(row.locator(".account-role")).to_have_text("admin")

    row.get_by_role("button", name="Reset the password of newcomer").click()
    page.get_by_label("New password (at least 8 characters)").fill("set by the admin")
    page.locator("dialog").get_by_role("button", name="Set password").click()
    expect(page.locator(".users-view [role=status]").first).to_contain_text(
        "A new password is set for newcomer"
    )
    login = {"username": "newcomer", "password": "set by the admin"}
    assert httpx.post(f"{stack}/api/auth/login", json=login, timeout=30).status_code == 200

    row.get_by_role("button", name="Disable newcomer").click()
    page.locator("dialog").get_by_role("button", name="Disable").click()
    expect(row.locator(".account-state")).to_have_text("disabled")
    assert httpx.post(f"{stack}/api/auth/login", json=login, timeout=30).status_code == 401
    # The administrator's own row offers nothing to lock themself out with.
    mine = page.locator(f".users-table tbody tr[data-username='{USER}']")
    expect(mine.get_by_role("button")).to_have_count(0)
