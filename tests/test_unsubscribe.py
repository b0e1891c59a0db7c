"""One-click unsubscribe (RFC 8058), end to end: the follow-up's List-Unsubscribe header as
the mail provider received it, POSTed to the relay, and what that changes in the store."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid

import httpx

from inboxcrm.domain.unsubscribe_links import make_token, read_token
from inboxcrm.platform.config import Settings
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email

ONE_CLICK = {"content": b"List-Unsubscribe=One-Click",
             "headers": {"content-type": "application/x-www-form-urlencoded"}}


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inboxcrm.cli", *args], env=stack.env,
                          capture_output=True, text=True, timeout=60, check=False)


async def suppressions(env: StackClient, email: str) -> int:
    return await env.count(
        "SELECT count(*) FROM suppressions WHERE tenant = 'acme' AND canonical_email = lower($1)",
        email)


async def contact_id(env: StackClient, email: str) -> uuid.UUID:
    value = await env.db.fetchval(
        "SELECT contact_id FROM contacts WHERE tenant = 'acme' AND canonical_email = lower($1)",
        email)
    assert value is not None
    return uuid.UUID(str(value))


def test_token_round_trip_names_no_address() -> None:
    cid = uuid.uuid4()
    token = make_token("s3cret", "acme", cid)
    assert read_token("s3cret", token) == ("acme", cid)
    assert "@" not in token and str(cid) not in token
    assert read_token("other", token) is None
    assert read_token("s3cret", token.replace("acme", "acmf", 1)) is None
    assert read_token("s3cret", token[:-2] + ("AA" if token[-2:] != "AA" else "BB")) is None
    assert read_token("s3cret", "garbage") is None


async def test_follow_up_carries_one_click_unsubscribe_that_suppresses_once(
    env: StackClient, stack: Stack,
) -> None:
    email = unique_email("unsub")
    workflow_id = await env.deliver(message_from(email))
    assert await env.wait_state(workflow_id, "completed") == ("completed", "followup_sent")
    [sent] = await env.emails_to(email)

    detail = (await env.http.get(f"{stack.sandbox_url}/emails/{sent['id']}")).json()
    headers = detail["headers"]
    assert headers["Auto-Submitted"] == "auto-replied"
    assert headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    match = re.fullmatch(r"<(https?://[^>]+)>", headers["List-Unsubscribe"])
    assert match is not None, headers["List-Unsubscribe"]
    url = match.group(1)
    assert url.startswith(f"{stack.relay_url}/v1/unsubscribe/")
    assert email not in url and email.split("@")[0] not in url

    page = await env.http.get(url)  # a link scanner or a browser: nothing changes
    assert page.status_code == 200 and "<form" in page.text
    assert await suppressions(env, email) == 0

    first = await env.http.post(url, **ONE_CLICK)
    second = await env.http.post(url, **ONE_CLICK)

    assert [first.status_code, second.status_code] == [200, 200], first.text
    assert first.json() == second.json() == {"status": "unsubscribed"}
    assert await suppressions(env, email) == 1
    cid = await contact_id(env, email)
    assert await env.db.fetchval("SELECT status FROM contacts WHERE contact_id = $1",
                                 cid) == "suppressed"
    assert await env.count(
        "SELECT count(*) FROM audit_log WHERE contact_id = $1 AND actor = 'unsubscribe'",
        cid) == 1

    # The same person asks again: no second email, and the reason is the suppression.
    again = await env.deliver(message_from(email, subject="Another question"))
    assert await env.wait_state(again, {"completed", "suppressed"}) == ("suppressed",
                                                                       "suppressed")
    assert len(await env.emails_to(email)) == 1
    assert await suppressions(env, email) == 1


async def test_unsubscribe_cancels_a_queued_follow_up(
    env: StackClient, stack: Stack, app_settings: Settings,
) -> None:
    email = unique_email("unsubq")
    assert app_settings.unsubscribe_secret is not None
    secret = app_settings.unsubscribe_secret.get_secret_value()
    assert cli(stack, "pause", "--tenant", "acme", "--scope", "send").returncode == 0
    try:
        workflow_id = await env.deliver(message_from(email))
        await env.wait_state(workflow_id, "send_pending")
        assert await env.state(workflow_id) == ("send_pending", "paused")
        token = make_token(secret, "acme", await contact_id(env, email))

        response = await env.http.post(f"{stack.relay_url}/v1/unsubscribe/{token}",
                                       **ONE_CLICK)

        assert response.status_code == 200, response.text
        assert await env.count(
            "SELECT count(*) FROM followup_intents i JOIN inbound_events e USING (event_id)"
            " WHERE e.workflow_id = $1 AND i.status = 'cancelled'"
            " AND i.cancel_reason = 'unsubscribed'", workflow_id) == 1
    finally:
        assert cli(stack, "resume", "--tenant", "acme", "--scope", "send").returncode == 0
    assert await env.wait_state(workflow_id, "suppressed") == ("suppressed",
                                                               "intent_cancelled")
    assert await env.emails_to(email) == []


async def test_forged_or_unknown_tokens_are_404_and_change_nothing(
    env: StackClient, stack: Stack, app_settings: Settings,
) -> None:
    assert app_settings.unsubscribe_secret is not None
    secret = app_settings.unsubscribe_secret.get_secret_value()
    email = unique_email("unsubforged")
    workflow_id = await env.deliver(message_from(email))
    await env.wait_state(workflow_id, "completed")
    real = make_token(secret, "acme", await contact_id(env, email))
    before = await env.count("SELECT count(*) FROM suppressions")

    tokens = [
        "garbage",
        real[:-1] + ("A" if real[-1] != "A" else "B"),          # tampered signature
        make_token("not-the-secret", "acme", await contact_id(env, email)),
        make_token(secret, "acme", uuid.uuid4()),               # no such contact
        make_token(secret, "rehearsal", await contact_id(env, email)),  # other tenant
    ]
    responses: list[httpx.Response] = [
        await env.http.post(f"{stack.relay_url}/v1/unsubscribe/{t}", **ONE_CLICK)
        for t in tokens
    ]

    assert [r.status_code for r in responses] == [404] * len(tokens)
    assert {r.json()["message"] for r in responses} == {"unknown unsubscribe link"}
    assert await env.count("SELECT count(*) FROM suppressions") == before
    assert await suppressions(env, email) == 0
