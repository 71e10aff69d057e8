"""The web chat in a real browser, as a user meets it: one story, in order, against the real gateway and worker.

register → create an index → upload (file picker and drag and drop, one refused file) → ask → steps, then
cards, then a growing answer → a citation highlights its card → reload → scope to one dataset → lose the
stream mid-answer → stop a turn → hostile markdown stays inert → screenshots. No console errors throughout.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.conftest import CSP_REPORTER
from tests.ollama_server import default_responder
from tests.servers import ROOT

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).parent / "fixtures"
DUCK = ROOT / "tests" / "fixtures" / "duck.md"  # a copy of shared/fixtures/docling/sources/duck.md
USER, PASSWORD = "alice", "correct horse battery"

# Records what the newest assistant message shows each time the page changes: steps, cards, answer length.
RECORDER = """() => {
  window.__frames = [];
  const snap = () => {
    const turns = document.querySelectorAll('.message.assistant');
    const turn = turns[turns.length - 1];
    if (!turn) return;
    const frame = {
      steps: turn.querySelectorAll('.step').length,
      cards: turn.querySelectorAll('.doc-card').length,
      answer: turn.querySelector('.answer').textContent.length,
      streaming: turn.classList.contains('streaming'),
    };
    const last = window.__frames[window.__frames.length - 1];
    if (!last || JSON.stringify(last) !== JSON.stringify(frame)) window.__frames.push(frame);
  };
  new MutationObserver(snap).observe(document.body, {subtree: true, childList: true, characterData: true,
                                                     attributes: true, attributeFilter: ['class']});
}"""


def last_turn(page: Page):
    return page.locator(".message.assistant").last


def ask(page: Page, text: str) -> None:
    box = page.locator("#composer-input")
    box.fill(text)
    box.press("Enter")


def wait_turn_end(page: Page) -> None:
    expect(last_turn(page)).not_to_have_class(re.compile(r"\bstreaming\b"), timeout=90_000)
    expect(page.locator(".send-button:not(.stop)")).to_be_visible()


def new_chat(page: Page) -> None:
    page.get_by_role("link", name="New chat", exact=True).click()
    expect(page.locator(".welcome")).to_be_visible()


def drop_file(page: Page, selector: str, path: Path) -> None:
    """A real drop event carrying a real File, as when a file is dragged from the desktop."""
    data = page.evaluate_handle(
        """([name, text]) => {
          const dt = new DataTransfer();
          dt.items.add(new File([text], name, {type: 'text/markdown'}));
          return dt;
        }""",
        [path.name, path.read_text()],
    )
    page.dispatch_event(selector, "dragenter", {"dataTransfer": data})
    page.dispatch_event(selector, "drop", {"dataTransfer": data})


@pytest.fixture(autouse=True)
def no_console_errors(console):
    before = len(console.unexpected())
    yield
    assert console.unexpected()[before:] == []


def test_register_and_reach_an_empty_chat(page: Page):
    page.goto("/")
    expect(page.get_by_role("heading", name="Welcome back")).to_be_visible()
    page.get_by_role("button", name="Create an account").click()
    page.get_by_label("Username").fill(USER)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Create account").click()
    expect(page.locator(".user-name")).to_have_text(USER)
    expect(page.locator(".welcome")).to_be_visible()
    # The first account is the admin: it sees Settings.
    expect(page.get_by_role("link", name="Settings")).to_be_visible()


def test_create_index_and_upload_files(page: Page, console):
    page.get_by_role("link", name="Documents").click()
    page.locator("#new-index-name").fill("pets")
    page.get_by_role("button", name="Create index").click()
    expect(page.locator(".index-title")).to_have_text("pets")

    # Two files through the picker into "birds": one indexes, one is refused with the gateway's reason.
    console.expected.append("status of 415")  # the refused upload's response, logged by Chromium
    page.locator("#upload-dataset").fill("birds")
    page.set_input_files("#upload-files", [str(DUCK), str(FIXTURES / "refused.exe")])
    duck = page.locator(".upload-item", has_text="duck.md")
    refused = page.locator(".upload-item", has_text="refused.exe")
    expect(duck).to_have_class(re.compile(r"\bok\b"), timeout=120_000)
    expect(duck.locator(".upload-status")).to_contain_text(re.compile(r"Indexed · \d+ chunks"))
    expect(duck.locator("progress")).to_have_attribute("value", "100")
    expect(refused).to_have_class(re.compile(r"\bfailed\b"))
    expect(refused.locator(".upload-status")).to_contain_text("unsupported file type '.exe'")

    # A third by drag and drop into "cats".
    page.locator("#upload-dataset").fill("cats")
    drop_file(page, ".dropzone", FIXTURES / "cats.md")
    cats = page.locator(".upload-item", has_text="cats.md")
    expect(cats).to_have_class(re.compile(r"\bok\b"), timeout=120_000)

    rows = page.locator(".doc-table tbody tr")
    expect(rows).to_have_count(2)
    expect(page.locator(".doc-table tbody tr[data-filename='duck.md'] .tag")).to_have_text("birds")
    expect(page.locator(".doc-table tbody tr[data-filename='cats.md'] .tag")).to_have_text("cats")
    expect(page.locator(".index-stats")).to_contain_text("2 documents")


def test_a_turn_shows_steps_then_cards_then_a_growing_answer(page: Page):
    new_chat(page)
    page.evaluate(RECORDER)
    ask(page, "What does the duck like to eat?")
    # The user's message is on screen while the answer is still being worked on.
    expect(page.locator(".message.user").last).to_have_text("What does the duck like to eat?")
    expect(last_turn(page)).to_have_class(re.compile(r"\bstreaming\b"))
    wait_turn_end(page)

    frames = page.evaluate("window.__frames")
    live = [f for f in frames if f["streaming"]]
    first_step = next(i for i, f in enumerate(live) if f["steps"])
    first_card = next(i for i, f in enumerate(live) if f["cards"])
    first_text = next(i for i, f in enumerate(live) if f["answer"])
    assert first_step < first_card < first_text, live
    growth = sorted({f["answer"] for f in live if f["answer"]})
    assert len(growth) >= 3, f"the answer did not grow token by token: {growth}"

    turn = last_turn(page)
    expect(turn).to_have_attribute("data-state", "done")
    expect(turn.locator(".step.route .step-label")).to_have_text("Search your documents")
    expect(turn.locator(".steps-summary-text")).to_contain_text(re.compile(r"Finished in [\d.]+ (ms|s)"))
    assert turn.locator(".step[data-step='retrieving'] .step-time").text_content().strip()
    expect(turn.locator(".answer")).to_contain_text("According to the sources")

    card = turn.locator(".doc-card").first
    expect(card.locator(".doc-name")).to_have_text("duck.md")
    expect(card.locator(".doc-place")).to_contain_text("birds")
    expect(card.locator(".doc-scores")).to_contain_text(re.compile(r"retrieved #1 · used \d+%"))
    assert card.locator(".doc-snippet").text_content().strip()

    # Screen readers hear the answer.
    expect(page.locator("#announcer")).to_contain_text("Answer: According to the sources")
    # The title arrives after the first turn, in the list and the header.
    expect(page.locator(".chat-link[aria-current='page'] .chat-title")).not_to_have_text("New chat")
    expect(page.locator("#chat-title")).not_to_have_text("New chat")


def test_a_citation_highlights_its_card_by_keyboard(page: Page):
    turn = last_turn(page)
    cite = turn.locator(".answer a.cite").first
    ref = cite.text_content()
    cite.focus()
    # Focus is visible on the link, then Enter follows it like a click would.
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"
    page.keyboard.press("Enter")
    card = turn.locator(f".doc-card[data-ref='{ref}']")
    expect(card).to_have_class(re.compile(r"\bhighlighted\b"))
    expect(card).to_be_focused()
    assert page.evaluate("location.hash").startswith("#/chats/"), "a citation must not change the route"


def test_a_card_shows_a_code_passage_without_its_fences(page: Page):
    """A chunk cut from a long code block carries its own fences, so that it reads as code in a prompt; the card's
    one-line snippet shows the code and the prose around it, not the fence markers."""
    snippet = """async (text) => {
        const module = await import(new URL("js/markdown.js", document.baseURI).href);
        return module.snippet(text);
    }"""
    code = "Intro.\n```python\ndef f(x):\n    return x * 11\n```\nAfter.\n~~~\nmore\n~~~"
    assert page.evaluate(snippet, code) == "Intro. def f(x): return x * 11 After. more"
    assert page.evaluate(snippet, "word " * 100) == ("word " * 100).strip()[:280] + "…"


def test_reload_finds_the_chat_intact(page: Page):
    title = page.locator("#chat-title").text_content()
    answer = last_turn(page).locator(".answer").text_content()
    cards = last_turn(page).locator(".doc-card").count()
    page.reload()
    expect(page.locator("#chat-title")).to_have_text(title)
    expect(page.locator(".message.user")).to_have_text(["What does the duck like to eat?"])
    turn = last_turn(page)
    expect(turn.locator(".answer")).to_have_text(answer)
    expect(turn.locator(".doc-card")).to_have_count(cards)
    expect(turn.locator(".doc-card").first.locator(".doc-scores")).to_contain_text(re.compile(r"used \d+%"))
    expect(turn.locator(".answer a.cite").first).to_be_visible()


def test_a_rewritten_follow_up_says_so(page: Page, ollama):
    def responder(model, messages, body):
        last = str(messages[-1].get("content") or "") if messages else ""
        if "as a standalone question" in last:
            return "What do ducks eat?"
        return default_responder(model, messages, body)

    ollama.responder = responder
    new_chat(page)
    ask(page, "Hello!")  # small talk: answered directly, so the follow-up has no documents to reuse
    wait_turn_end(page)
    expect(last_turn(page).locator(".step.route .step-label")).to_have_text("Answer directly")
    expect(last_turn(page).locator(".sources")).to_be_hidden()
    ask(page, "And what do they eat?")
    wait_turn_end(page)
    turn = last_turn(page)
    expect(turn.locator(".rewritten-notice")).to_have_text(
        "Your question was rewritten as: What do ducks eat?"
    )
    expect(turn.locator(".step[data-step='rewriting'] .step-detail")).to_have_text(
        "Searching for: What do ducks eat?"
    )


def test_scoping_a_chat_to_one_dataset(page: Page):
    new_chat(page)
    page.locator(".chip-button").click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_label("pets")).to_be_checked()
    dialog.get_by_label("cats").check()
    dialog.get_by_role("button", name="Save").click()
    expect(page.locator(".chip-button")).to_have_text("Dataset: cats")

    ask(page, "What do ducks and cats eat?")
    wait_turn_end(page)
    places = last_turn(page).locator(".doc-card .doc-place").all_text_contents()
    assert places and all(p.startswith("cats") for p in places), places

    # The choice is the chat's: it is still there after a reload.
    page.reload()
    expect(page.locator(".chip-button")).to_have_text("Dataset: cats")


def test_a_lost_stream_keeps_the_partial_answer(page: Page, ollama):
    new_chat(page)
    ollama.fail_after_tokens = 4
    ask(page, "What does the duck like to eat?")
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-state", "interrupted", timeout=90_000)
    partial = turn.locator(".answer").text_content()
    assert partial.startswith("According"), partial
    expect(turn.locator(".turn-status")).to_contain_text("Interrupted")
    expect(turn.locator(".doc-card").first).to_be_visible()  # documents already shown stay

    page.reload()
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-state", "interrupted")
    expect(turn.locator(".answer")).to_have_text(partial)
    expect(turn.locator(".doc-card").first).to_be_visible()


def test_the_stop_button_cancels_the_turn(page: Page, ollama):
    new_chat(page)
    ollama.token_delay_s = 0.4
    ask(page, "What does the duck like to eat?")
    turn = last_turn(page)
    expect(turn.locator(".answer")).not_to_be_empty(timeout=90_000)
    page.get_by_role("button", name="Stop answering").click()
    expect(turn).to_have_attribute("data-state", "stopped")
    expect(turn.locator(".turn-status")).to_contain_text("Stopped")
    kept = turn.locator(".answer").text_content()
    assert kept.startswith("According")
    page.wait_for_timeout(1500)  # tokens still in flight must not be painted after the stop
    assert turn.locator(".answer").text_content() == kept
    expect(page.locator("#composer-input")).to_be_focused()


def test_an_invented_answer_is_flagged_and_its_sentences_marked(page: Page, ollama):
    invented = (
        "Ducks migrate to the moon every winter on rockets [S1]. "
        "They pay their taxes in gold coins to the king of Sweden [S1]."
    )

    def responder(model, messages, body):
        asks_yes_no = any("answer yes or no" in str(m.get("content") or "").lower() for m in messages)
        return (
            invented
            if model.startswith("qwen3:8b") and not asks_yes_no
            else default_responder(model, messages, body)
        )

    ollama.responder = responder
    new_chat(page)
    ask(page, "What does the duck like to eat?")
    wait_turn_end(page)
    turn = last_turn(page)
    # Ollama's default policy is `flag`: the answer stays, each unsupported sentence is marked, a banner says so.
    expect(turn.locator(".grounding-badge")).to_have_text("grounded 0/2 sentences")
    expect(turn.locator(".grounding-note")).to_have_text(
        "2 sentences are not supported by the sources and are marked."
    )
    marks = turn.locator(".answer mark.ungrounded")
    expect(marks).to_have_count(2)
    expect(marks.first).to_contain_text("Ducks migrate to the moon")
    expect(turn.locator(".answer a.cite")).to_have_count(2)  # citations still link inside the marked text
    # The stored message keeps the check: a reload shows the same marks.
    page.reload()
    turn = last_turn(page)
    expect(turn.locator(".grounding-badge")).to_have_text("grounded 0/2 sentences")
    expect(turn.locator(".answer mark.ungrounded")).to_have_count(2)


def test_hostile_markup_renders_inert(page: Page, ollama):
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    hostile = (
        'Try [this link](javascript:window.__pwned=1) or <a href="javascript:window.__pwned=2">that</a>.\n\n'
        '<img src=x onerror="window.__pwned=3"> <script>window.__pwned=4</script> **bold** [S1]'
    )

    def responder(model, messages, body):
        return hostile if model.startswith("qwen3:8b") else default_responder(model, messages, body)

    ollama.responder = responder
    new_chat(page)
    # No documents for this chat: the turn goes straight to the answer model, which replies with the markup.
    page.locator(".chip-button").click()
    page.get_by_role("dialog").get_by_label("pets").uncheck()
    page.get_by_role("dialog").get_by_role("button", name="Save").click()
    expect(page.locator(".chip-button")).to_have_text("No documents")
    message = "<script>window.__pwned=5</script> hi [x](javascript:alert(1)) <img src=x onerror=alert(1)>"
    ask(page, message)
    wait_turn_end(page)

    # The user's text is shown as typed, never interpreted.
    expect(page.locator(".message.user").last).to_have_text(message)
    answer = last_turn(page).locator(".answer")
    expect(answer.locator("strong")).to_have_text("bold")
    expect(answer).to_contain_text("<script>window.__pwned=4</script>")  # shown as text
    assert page.locator(".messages script, .messages img, .messages [onerror]").count() == 0
    hrefs = answer.locator("a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert all(h is None or h.startswith("#card-") for h in hrefs), hrefs
    answer.locator("a", has_text="this link").click()
    page.wait_for_timeout(300)
    assert page.evaluate("window.__pwned") is None
    assert dialogs == []


def test_an_admin_changes_the_turn_defaults(page: Page):
    page.get_by_role("link", name="Settings").click()
    hyde = page.get_by_label("HyDE", exact=True)
    expect(hyde).to_have_value("")  # "Default (off)": the worker's own default
    hyde.select_option("on")
    page.get_by_label("Passages per answer").fill("4")
    # What users may choose per turn: a model besides the worker's own, and a prompt preset.
    page.get_by_label("Models users may choose").fill("llama3.2:1b")
    presets = page.get_by_label("Presets (JSON)")
    presets.fill('{"brief": {"system": "Answer in one sentence."')
    page.get_by_role("button", name="Save settings").click()
    expect(page.locator(".settings-form .save-status")).to_contain_text("not valid JSON")
    presets.fill('{"brief": {"system": "Answer in one sentence."}}')
    page.get_by_role("button", name="Save settings").click()
    expect(page.locator(".settings-form .save-status")).to_have_text("Saved. New turns use these settings.")
    page.reload()
    expect(page.get_by_label("HyDE", exact=True)).to_have_value("on")
    expect(page.get_by_label("Passages per answer")).to_have_value("4")
    expect(page.get_by_label("Models users may choose")).to_have_value("llama3.2:1b")
    expect(page.get_by_label("Presets (JSON)")).to_have_value(re.compile("Answer in one sentence"))
    # Back to the defaults, so the screenshots show a fresh install.
    page.get_by_label("HyDE", exact=True).select_option("")
    page.get_by_label("Passages per answer").fill("")
    page.get_by_label("Models users may choose").fill("")
    page.get_by_label("Presets (JSON)").fill("")
    page.get_by_role("button", name="Save settings").click()
    expect(page.locator(".settings-form .save-status")).to_have_text("Saved. New turns use these settings.")


def test_an_admin_charts_the_turns_from_the_step_log(page: Page):
    page.get_by_role("link", name="Admin").click()
    page.get_by_role("tab", name="Statistics").click()
    latency = page.locator("svg.latency-chart")
    expect(latency).to_be_visible()
    points = latency.locator("circle.point")
    # Every turn of this story so far is a point; the note counts the same turns.
    expect(page.locator(".stats-note")).to_have_text(re.compile(r"^\d+ turns? answered"))
    count = int(page.locator(".stats-note").inner_text().split()[0])
    assert count >= 3 and points.count() == count
    stages = page.locator("svg.stage-chart")
    expect(stages.locator("text", has_text="Retrieve")).to_have_count(1)
    expect(stages.locator("text", has_text="Generate")).to_have_count(1)
    assert stages.locator("rect.bar").count() >= 3
    assert "median" in (stages.get_attribute("aria-label") or "").lower()
    page.get_by_label("Window", exact=True).select_option(label="Last week")
    expect(page.locator(".stats-note")).to_have_text(re.compile(rf"^{count} turns? answered"))


VIEWS = {
    "login": None,
    "chat": "chat",
    "documents": "#/documents",
    "settings": "#/settings",
}


def test_screenshots_of_the_main_views(browser, stack, page: Page, console, screenshots):
    # The session is the gateway's HttpOnly cookie: page script cannot see it, a new tab shares it.
    assert page.evaluate("document.cookie") == ""
    stored = "[...Object.keys(sessionStorage), ...Object.keys(localStorage)].filter(k => /token|user|session/i.test(k))"
    assert page.evaluate(stored) == []
    cookies = page.context.cookies()
    assert [(c["name"], c["httpOnly"], c["sameSite"]) for c in cookies] == [("rag_session", True, "Strict")]
    chat_hash = (
        "#/chats/"
        + page.evaluate("[...document.querySelectorAll('.chat-link')].map(a => a.hash.split('/').pop())")[-1]
    )  # the oldest chat: the duck question with its follow-up
    sizes = {"desktop": {"width": 1280, "height": 860}, "phone": {"width": 390, "height": 844}}
    for size, viewport in sizes.items():
        for scheme in ("light", "dark"):
            context = browser.new_context(
                viewport=viewport,
                color_scheme=scheme,
                base_url=stack,
                device_scale_factor=1 if size == "desktop" else 2,
            )
            context.add_init_script(CSP_REPORTER)
            shot = context.new_page()
            console.watch(shot)
            shot.goto("/#/login")
            expect(shot.locator(".login-card")).to_be_visible()
            shot.screenshot(path=str(screenshots / f"login-{size}-{scheme}.png"))
            context.add_cookies(cookies)
            shot.reload()  # the page learns who is signed in from the cookie when it loads
            expect(shot.locator(".user-name")).to_have_text(USER)
            for view, target in VIEWS.items():
                if target is None:
                    continue
                shot.goto("/" + (chat_hash if view == "chat" else target))
                if view == "chat":
                    expect(shot.locator(".message.assistant .doc-card").first).to_be_visible()
                    shot.locator(".scroller").evaluate("el => el.scrollTop = el.scrollHeight")
                elif view == "documents":
                    expect(shot.locator(".doc-table")).to_be_visible()
                else:
                    expect(shot.locator(".settings-form")).to_be_visible()
                shot.wait_for_timeout(400)  # let card and theme transitions settle
                shot.screenshot(path=str(screenshots / f"{view}-{size}-{scheme}.png"))
            if size == "phone" and scheme == "light":
                shot.goto("/" + chat_hash)
                expect(shot.locator(".message.assistant").first).to_be_visible()
                shot.get_by_role("button", name="Open menu").click()
                expect(shot.locator(".sidebar.open")).to_be_visible()
                shot.wait_for_timeout(300)
                shot.screenshot(path=str(screenshots / "menu-phone-light.png"))
            context.close()
    assert len(list(screenshots.glob("*.png"))) == 17


def test_the_whole_story_ran_under_a_strict_content_security_policy(page: Page, console):
    """Every view above (uploads, streamed turns, cards with their bars, markdown, settings) ran with
    `script-src 'self'` and no inline script or style attribute: not one violation was reported."""
    response = page.goto("/")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    expect(page.locator(".user-name")).to_have_text(USER)
    assert [e for e in console.errors if "CSP violation" in e or "Content Security Policy" in e] == []
    # The reporter works, and the policy is enforced: an injected inline script does not run.
    console.expected.extend(["CSP violation", "Content Security Policy"])
    page.evaluate("""() => { const s = document.createElement('script');
                             s.textContent = 'window.__inline = 1'; document.body.append(s); }""")
    for _ in range(100):  # the report is an event: wait for it to arrive
        if any("CSP violation: script-src" in e for e in console.errors):
            break
        page.wait_for_timeout(100)
    assert any("CSP violation: script-src" in e for e in console.errors), console.errors
    assert page.evaluate("window.__inline") is None


def test_change_password_then_sign_out_ends_the_session(browser, stack, page: Page, console):
    other = browser.new_context(base_url=stack)  # a second device signed in as the same user
    other.add_init_script(CSP_REPORTER)
    second = other.new_page()
    console.watch(second)
    other.add_cookies(page.context.cookies())
    second.goto("/#/chats")
    expect(second.locator(".user-name")).to_have_text(USER)

    page.get_by_role("link", name="Settings").click()
    page.get_by_label("Current password").fill("not my password")
    page.get_by_label("New password", exact=True).fill("a brand new passphrase")
    page.get_by_label("Repeat new password").fill("a brand new passphrase")
    console.expected.append("status of 403")  # a wrong current password: the caller did not prove who it is
    page.get_by_role("button", name="Change password").click()
    expect(page.locator(".password-form .save-status")).to_have_text("The current password is wrong.")
    page.get_by_label("Current password").fill(PASSWORD)
    page.get_by_role("button", name="Change password").click()
    expect(page.locator(".password-form .save-status")).to_have_text(
        "Password changed. Your other sessions were signed out."
    )
    # This tab carries on; the other device is signed out at its next request.
    page.reload()
    expect(page.locator(".user-name")).to_have_text(USER)
    console.expected.append("status of 401")
    second.get_by_role("link", name="Documents").click()
    expect(second.get_by_role("heading", name="Welcome back")).to_be_visible()
    expect(second.locator(".notice")).to_have_text("Your session has ended. Please sign in again.")
    other.close()

    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Welcome back")).to_be_visible()
    page.reload()
    expect(page.get_by_role("heading", name="Welcome back")).to_be_visible()
    page.get_by_label("Username").fill(USER)
    page.get_by_label("Password").fill("a brand new passphrase")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator(".user-name")).to_have_text(USER)


def test_an_admin_disables_an_account_in_settings(browser, stack, page: Page, console):
    other = browser.new_context(base_url=stack)
    other.add_init_script(CSP_REPORTER)
    bob = other.new_page()
    console.watch(bob)
    bob.goto("/")
    bob.get_by_role("button", name="Create an account").click()
    bob.get_by_label("Username").fill("bob")
    bob.get_by_label("Password").fill("bobs own passphrase")
    bob.get_by_role("button", name="Create account").click()
    expect(bob.locator(".user-name")).to_have_text("bob")
    # Not an admin: Settings has the account, not the server's accounts or turn defaults.
    bob.get_by_role("link", name="Settings").click()
    expect(bob.get_by_role("button", name="Change password")).to_be_visible()
    expect(bob.locator(".accounts-table")).to_have_count(0)
    expect(bob.locator(".settings-form")).to_have_count(0)

    page.get_by_role("link", name="Settings").click()
    row = page.locator(".accounts-table tr[data-username='bob']")
    expect(row.locator(".account-state")).to_have_text("active")
    row.get_by_role("button", name="Disable bob").click()
    page.get_by_role("dialog").get_by_role("button", name="Disable").click()
    expect(row.locator(".account-state")).to_have_text("disabled")

    console.expected.append("status of 401")
    bob.get_by_role("link", name="Documents").click()
    expect(bob.get_by_role("heading", name="Welcome back")).to_be_visible()
    # Signing in to a disabled account answers exactly as a wrong password does (no oracle for guessers).
    bob.get_by_label("Username").fill("bob")
    bob.get_by_label("Password").fill("bobs own passphrase")
    bob.get_by_role("button", name="Sign in").click()
    expect(bob.locator(".form-error")).to_have_text("Wrong username or password, or the account is disabled.")
    other.close()
