"""Threads (migration 073, docs/architecture.md §5 "Threads"): our follow-up answers the
inbound message (In-Reply-To, References) under a Message-ID recorded with its intent; a
reply naming it, or an earlier inbound message of the tenant, is logged to the same CRM
record and never acknowledged again (`completed`, `thread_reply`). Counted at the sandbox.

The first follow-up's intent is aged past the quiet period before the reply arrives, so
what stops a second acknowledgment is the thread, not the quiet period."""

from __future__ import annotations

import json
import uuid
from typing import Any

from inboxcrm.verify.probe import StackClient, unique_email
from inboxcrm.verify.signing import sample_message

BODY = "Hi, could you send me pricing for 20 seats?\n\nThanks,\nJane Doe\nExample Corp\n"


def _message(email: str, message_id: str, *, answers: str | None = None,
             references: str | None = None, subject: str = "Pricing for 20 seats") -> str:
    raw = sample_message(sender=f"Jane Doe <{email}>", subject=subject, body=BODY,
                         message_id=message_id)
    head = ""
    if answers:
        head += f"In-Reply-To: {answers}\r\n"
    if references:
        head += f"References: {references}\r\n"
    return head + raw


async def _sent_headers(env: StackClient, email: str) -> dict[str, str]:
    [sent] = await env.emails_to(email)
    response = await env.http.get(f"{env.endpoints.sandbox_url}/emails/{sent['id']}")
    response.raise_for_status()
    return dict(response.json()["headers"])


async def _notes_on(env: StackClient, record_id: str) -> list[dict[str, Any]]:
    return [n for n in (await env.sandbox_state())["notes"]
            if record_id in n["associations"]["contacts"]]


async def _first_inquiry(env: StackClient, email: str, message_id: str) -> str:
    workflow_id = await env.deliver(_message(email, message_id))
    assert await env.wait_state(workflow_id, "completed") == ("completed", "followup_sent")
    # Past the quiet period: only the thread can stop a second acknowledgment now.
    await env.db.execute(
        "UPDATE followup_intents SET created_at = now() - interval '30 days' "
        "WHERE event_id = (SELECT event_id FROM inbound_events WHERE workflow_id = $1)",
        workflow_id)
    return workflow_id


async def test_our_followup_answers_the_message_and_a_reply_is_not_acknowledged(
        env: StackClient) -> None:
    email = unique_email("thread")
    inbound_id = f"<{uuid.uuid4().hex}@example.com>"
    first = await _first_inquiry(env, email, inbound_id)

    headers = await _sent_headers(env, email)
    recorded = await env.db.fetchval(
        "SELECT i.message_id FROM followup_intents i JOIN inbound_events e USING (event_id) "
        "WHERE e.workflow_id = $1", first)
    assert headers["Message-ID"] == recorded
    assert recorded.endswith("@acme.test>")
    assert headers["In-Reply-To"] == inbound_id
    assert headers["References"] == inbound_id

    reply = await env.deliver(_message(
        email, f"<{uuid.uuid4().hex}@example.com>", answers=recorded,
        references=f"{inbound_id} {recorded}", subject="Re: Danke / thanks"))
    assert await env.wait_state(reply, "completed") == ("completed", "thread_reply")

    assert len(await env.emails_to(email)) == 1          # no second acknowledgment
    [record] = await env.crm_records_for(email)          # the same record
    assert len(await _notes_on(env, record["id"])) == 2  # both messages logged on it
    detail = _json(await env.db.fetchval(
        "SELECT a.detail FROM audit_log a JOIN inbound_events e USING (event_id) "
        "WHERE e.workflow_id = $1 AND a.action = 'followup_not_planned'", reply))
    assert detail["reason"] == "thread_reply"
    assert detail["answers"] == "followup"
    assert detail["thread_event_id"] == str(await env.db.fetchval(
        "SELECT event_id FROM inbound_events WHERE workflow_id = $1", first))


async def test_a_message_answering_an_earlier_inbound_one_is_the_same_thread(
        env: StackClient) -> None:
    """The customer writes again in their own thread (their client names their first
    message, not our follow-up): still the conversation, not a new inquiry."""
    email = unique_email("ownthread")
    inbound_id = f"<{uuid.uuid4().hex}@example.com>"
    await _first_inquiry(env, email, inbound_id)
    again = await env.deliver(_message(email, f"<{uuid.uuid4().hex}@example.com>",
                                       answers=inbound_id, references=inbound_id))
    assert await env.wait_state(again, "completed") == ("completed", "thread_reply")
    assert len(await env.emails_to(email)) == 1


async def test_a_thread_of_another_tenant_is_not_ours(env: StackClient) -> None:
    """A Message-ID known to one tenant means nothing to another: a message of `rehearsal`
    naming `acme`'s messages is a new inquiry there."""
    email = unique_email("elsewhere")
    inbound_id = f"<{uuid.uuid4().hex}@example.com>"
    await _first_inquiry(env, email, inbound_id)
    fresh = await env.deliver(_message(email, f"<{uuid.uuid4().hex}@example.com>",
                                       answers=inbound_id, references=inbound_id),
                              tenant="rehearsal", mailbox="inbox@rehearsal.test")
    state, reason = await env.wait_state(fresh, {"completed", "awaiting_review"})
    assert reason != "thread_reply"


def _json(value: Any) -> dict[str, Any]:
    return dict(json.loads(value) if isinstance(value, str) else value)
