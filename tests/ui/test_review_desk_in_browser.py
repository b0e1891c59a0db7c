"""The review desk itself in a browser (headless Chromium, no JavaScript needed by the page):
a reviewer signs in with their personal token, finds the item in their queue, decides on the
card's form and reads the workflow's answer; the other tenant's card is "not found"; and a
page on another origin that posts a forged decision with the reviewer's own cookie is refused.
Screenshots of each step in test-artifacts/ui/."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import quote

from inboxcrm.verify.probe import StackClient, unique_email
from tests.helpers.cli import cli
from tests.helpers.messages import GLOBEX, no_sender_message, to_globex
from tests.helpers.ui import ARTIFACTS, UI_TIMEOUT_MS

if TYPE_CHECKING:
    from playwright.async_api import Page

    from inboxcrm.stack.stack import Stack


@contextmanager
def attacker_page(target: str, wait_id: str) -> Iterator[str]:
    """Another origin (same site: another loopback port) serving a form that posts a
    decision to the desk as soon as it loads, as a forged cross-site request would."""
    html = (f"<!doctype html><form id='f' method='post' action='{escape(target, quote=True)}'>"
            "<input name='action' value='approve'>"
            f"<input name='wait_id' value='{escape(wait_id, quote=True)}'>"
            "<input name='sender_email' value='attacker@evil.test'>"
            "<input name='csrf' value='guessed'></form>"
            "<script>document.getElementById('f').submit()</script>").encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(html)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


async def test_a_reviewer_decides_on_the_desk_and_forgery_is_refused(
    ui_env: StackClient, ui_stack: Stack, page: Page,
) -> None:
    from playwright.async_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    name = f"dana-{uuid.uuid4().hex[:6]}"
    added = cli(ui_stack, "reviewer", "add", name, "--tenant", "acme", "--json")
    assert added.returncode == 0, added.stderr
    token = json.loads(added.stdout)["token"]
    workflow_id = await ui_env.deliver(no_sender_message())
    other = await ui_env.deliver(to_globex(no_sender_message()), **GLOBEX)
    await ui_env.wait_state(workflow_id, "awaiting_review")
    await ui_env.wait_state(other, "awaiting_review")
    wait_id = (await ui_env.query_status(workflow_id))["review"]["wait_id"]
    relay = ui_stack.relay_url
    card_url = f"{relay}/review/{quote(workflow_id, safe='')}"

    await page.context.clear_cookies()
    await page.goto(f"{relay}/review/")
    await page.get_by_label("Review token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    queue = page.locator("#queue")
    await expect(queue.get_by_role("link", name=workflow_id)).to_be_visible()
    await expect(queue.get_by_role("link", name=other)).to_have_count(0)
    await expect(page.locator("#who")).to_contain_text(f"reviewer:{name}")
    await page.screenshot(path=ARTIFACTS / "desk-1-queue.png", full_page=True)

    # The other tenant's card does not exist for this reviewer.
    answer = await page.goto(f"{relay}/review/{quote(other, safe='')}")
    assert answer is not None and answer.status == 404

    # A forged decision from another origin, with the reviewer's own cookie: refused.
    with attacker_page(card_url, wait_id) as evil:
        await page.goto(evil)
        await expect(page.get_by_text("Cross-site request refused")).to_be_visible()
        await page.screenshot(path=ARTIFACTS / "desk-2-forged-refused.png", full_page=True)
    assert (await ui_env.state(workflow_id))[0] == "awaiting_review"
    assert await ui_env.count("SELECT count(*) FROM audit_log WHERE workflow_id = $1 AND "
                              "action ~ '^(signal|update)_'", workflow_id) == 0

    # The decision on the card's form: answered by the workflow, attributed to the reviewer.
    # A second tab keeps the card as it was, for a second (stale) decision below.
    stale = await page.context.new_page()
    await stale.goto(card_url)
    await queue_link(page, relay, workflow_id)
    form = page.locator("#decide-approve")
    email = unique_email("desk-ui")
    await form.get_by_label("Your name (label)").fill("mallory")
    await form.get_by_label("Sender email", exact=False).fill(email)
    await page.screenshot(path=ARTIFACTS / "desk-3-card-form.png", full_page=True)
    await form.get_by_role("button", name="Approve").click()
    await expect(page.locator("#answer")).to_contain_text(f"accepted: approve at wait {wait_id}")
    await page.screenshot(path=ARTIFACTS / "desk-4-answer.png", full_page=True)
    assert (await ui_env.wait_state(workflow_id, "completed", timeout=UI_TIMEOUT_MS / 1000)
            )[0] == "completed"
    assert len(await ui_env.crm_records_for(email)) == 1
    assert len(await ui_env.emails_to(email)) == 1
    decided = await ui_env.db.fetchrow(
        "SELECT actor, detail FROM audit_log WHERE workflow_id = $1 AND action = "
        "'update_approve'", workflow_id)
    assert decided["actor"] == f"reviewer:{name}"
    assert (decided["detail"]["path"], decided["detail"]["authenticated"],
            decided["detail"]["typed_reviewer"]) == ("desk", True, "mallory")

    # Deciding again on the stale tab: the workflow's refusal is shown, nothing changes.
    try:
        await stale.locator("#decide-reject").get_by_role("button", name="Reject").click()
        await expect(stale.locator("#answer")).to_contain_text("refused")
        await stale.screenshot(path=ARTIFACTS / "desk-5-refused.png", full_page=True)
    finally:
        await stale.close()
    assert (await ui_env.state(workflow_id))[0] == "completed"


async def queue_link(page: Page, relay: str, workflow_id: str) -> None:
    """Back to the queue and into the item, as a person would."""
    from playwright.async_api import expect

    await page.goto(f"{relay}/review/")
    await page.locator("#queue").get_by_role("link", name=workflow_id).click()
    await expect(page.locator("#decide-approve")).to_be_visible()
