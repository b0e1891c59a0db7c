"""Bounces and abuse reports of our follow-ups, on the real stack: the report is ignored as
mail, and the reported address gets no further follow-up (counted at the mail sandbox)."""

from __future__ import annotations

from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.reports import arf_complaint, dsn_bounce


async def suppression_reason(env: StackClient, email: str) -> str | None:
    value = await env.db.fetchval(
        "SELECT reason FROM suppressions WHERE tenant = 'acme' AND canonical_email = lower($1)",
        email)
    return str(value) if value is not None else None


async def first_followup(env: StackClient, email: str) -> None:
    workflow_id = await env.deliver(message_from(email))
    assert await env.wait_state(workflow_id, "completed") == ("completed", "followup_sent")
    assert len(await env.emails_to(email)) == 1


async def test_hard_bounce_of_our_followup_stops_the_next_one(env: StackClient) -> None:
    email = unique_email("bounced")
    await first_followup(env, email)

    bounce = await env.deliver(dsn_bounce(email))
    state, _ = await env.wait_state(bounce, "ignored")
    assert state == "ignored"
    assert await suppression_reason(env, email) == "bounced"

    again = await env.deliver(message_from(email, subject="Still interested in pricing"))
    assert await env.wait_state(again, "suppressed") == ("suppressed", "suppressed")
    assert len(await env.emails_to(email)) == 1


async def test_abuse_report_of_our_followup_records_a_complaint(env: StackClient) -> None:
    email = unique_email("complained")
    await first_followup(env, email)

    report = await env.deliver(arf_complaint(email))
    assert (await env.wait_state(report, "ignored"))[0] == "ignored"
    assert await suppression_reason(env, email) == "complaint"

    again = await env.deliver(message_from(email, subject="Another question"))
    assert await env.wait_state(again, "suppressed") == ("suppressed", "suppressed")
    assert len(await env.emails_to(email)) == 1


async def test_bounce_for_an_address_we_never_mailed_suppresses_nothing(
    env: StackClient,
) -> None:
    """Anyone can write a bounce: a forged one must not silence a stranger's address."""
    email = unique_email("stranger")
    bounce = await env.deliver(dsn_bounce(email))
    assert (await env.wait_state(bounce, "ignored"))[0] == "ignored"
    assert await suppression_reason(env, email) is None

    inquiry = await env.deliver(message_from(email))
    assert await env.wait_state(inquiry, "completed") == ("completed", "followup_sent")
    assert len(await env.emails_to(email)) == 1
