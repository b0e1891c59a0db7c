"""The conversation in the CRM (docs/architecture.md §5): the inbound email and our sent
follow-up logged as the CRM's email activities on the contact's record, each its own
operation (`crm-email`, `crm-sent`), with subject and snippet as the tenant's policy says
(`crm_email_text`, default `snippet`); a reply in the thread is logged on the same record
and not acknowledged. Counted in the sandbox (`/_sandbox/state` `activities`)."""

from __future__ import annotations

import uuid
from typing import Any

from inboxcrm.domain.policy import get_policy
from inboxcrm.verify.probe import StackClient, unique_email
from inboxcrm.verify.signing import sample_message

SUBJECT = "Pricing for 20 seats"
BODY = ("Hi, could you send me pricing for 20 seats?\n\nThanks,\nJane Doe\nExample Corp\n\n"
        "On Mon, 30 Nov 2026 at 09:00, Sales <sales@acme.test> wrote:\n> an older message\n")


def _message(email: str, *, answers: str | None = None, subject: str = SUBJECT,
             message_id: str | None = None) -> str:
    raw = sample_message(sender=f"Jane Doe <{email}>", subject=subject, body=BODY,
                         message_id=message_id or f"<{uuid.uuid4().hex}@example.com>")
    return (f"In-Reply-To: {answers}\r\nReferences: {answers}\r\n" + raw) if answers else raw


async def _activities_of(env: StackClient, email: str) -> tuple[str, list[dict[str, Any]]]:
    [record] = await env.crm_records_for(email)
    state = await env.sandbox_state()
    return record["id"], [a for a in state["activities"] if record["id"] in a["records"]]


def _emails(activities: list[dict[str, Any]], direction: str) -> list[dict[str, Any]]:
    return [a for a in activities if a["type"] == "email" and a["direction"] == direction]


async def test_the_inbound_email_and_the_followup_are_in_the_crm(env: StackClient) -> None:
    email = unique_email("conversation")
    workflow_id = await env.deliver(_message(email))
    assert await env.wait_state(workflow_id, "completed") == ("completed", "followup_sent")

    record_id, activities = await _activities_of(env, email)
    [inbound] = _emails(activities, "INCOMING_EMAIL")
    [outbound] = _emails(activities, "EMAIL")
    assert inbound["subject"] == SUBJECT
    # The policy's snippet: the writer's own text on one line, no quoted history.
    assert inbound["text"] == get_policy("acme").crm_text(
        "Hi, could you send me pricing for 20 seats?\n\nThanks,\nJane Doe\nExample Corp")
    assert "older message" not in inbound["text"]
    [sent] = await env.emails_to(email)
    assert outbound["subject"] == sent["subject"]
    assert outbound["text"] and len(outbound["text"]) <= 200
    assert [a["type"] for a in activities].count("note") == 1  # the note stays as it was
    ops = {r["action"]: r["status"] for r in await env.db.fetch(
        "SELECT action, status FROM operations WHERE workflow_id = $1", workflow_id)}
    assert ops == {"crm-upsert": "completed", "crm-note": "completed",
                   "crm-email": "completed", "send": "completed", "crm-sent": "completed"}


async def test_a_timeout_after_the_email_activity_committed_logs_it_once(
        env: StackClient) -> None:
    email = unique_email("convtimeout")
    await env.inject("crm.email", "timeout_after_commit")
    workflow_id = await env.deliver(_message(email))
    assert await env.wait_state(workflow_id, "completed", timeout=120) == (
        "completed", "followup_sent")
    _, activities = await _activities_of(env, email)
    assert len(_emails(activities, "INCOMING_EMAIL")) == 1
    assert len(_emails(activities, "EMAIL")) == 1
    attempts = await env.db.fetchval(
        "SELECT attempts FROM operations WHERE op_key = $1", f"{workflow_id}:crm-email")
    assert attempts >= 2  # the fault was met, and the retry found the committed activity


async def test_a_reply_is_logged_on_the_same_record_and_not_acknowledged(
        env: StackClient) -> None:
    email = unique_email("convreply")
    first = await env.deliver(_message(email))
    assert await env.wait_state(first, "completed") == ("completed", "followup_sent")
    ours = await env.db.fetchval(
        "SELECT i.message_id FROM followup_intents i JOIN inbound_events e USING (event_id) "
        "WHERE e.workflow_id = $1", first)
    reply = await env.deliver(_message(email, answers=ours, subject=f"Re: {SUBJECT}"))
    assert await env.wait_state(reply, "completed") == ("completed", "thread_reply")

    record_id, activities = await _activities_of(env, email)
    assert [a["subject"] for a in _emails(activities, "INCOMING_EMAIL")] == [
        SUBJECT, f"Re: {SUBJECT}"]
    assert len(_emails(activities, "EMAIL")) == 1   # one follow-up, logged once
    assert len(await env.emails_to(email)) == 1
