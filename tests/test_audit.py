"""`inboxcrm audit` answers the incident questions from the trail alone."""

from __future__ import annotations

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.cli import cli


async def test_why_did_this_person_get_two_replies(env: StackClient, stack: Stack) -> None:
    email = unique_email("tworeplies")
    first = await env.deliver(message_from(email))
    await env.wait_state(first, "completed")
    # A day passes: the quiet period is over.
    await env.db.execute(
        "UPDATE followup_intents SET created_at = created_at - interval '25 hours' "
        "WHERE event_id = (SELECT event_id FROM inbound_events WHERE workflow_id = $1)", first)
    second = await env.deliver(message_from(email, subject="Still interested"))
    await env.wait_state(second, "completed")
    assert len(await env.emails_to(email)) == 2

    story = cli(stack, "audit", "--email", email)

    assert story.returncode == 0, story.stderr
    assert "2 inbound item(s); 2 follow-up(s) sent" in story.stdout
    assert "2 distinct intent(s)" in story.stdout
    assert first in story.stdout and second in story.stdout
    assert story.stdout.count("follow-up sent via") == 2


async def test_why_did_this_person_get_no_reply(env: StackClient, stack: Stack) -> None:
    email = unique_email("noreply")
    opt_out = await env.deliver(message_from(email, subject="unsubscribe",
                                             body="Please unsubscribe me.\n"))
    await env.wait_state(opt_out, "suppressed")
    inquiry = await env.deliver(message_from(email))
    await env.wait_state(inquiry, "suppressed")
    assert await env.emails_to(email) == []

    story = cli(stack, "audit", "--email", email, "--json")
    assert story.returncode == 0
    assert '"suppression_recorded"' in story.stdout
    readable = cli(stack, "audit", "--email", email).stdout
    assert "opt-out recorded" in readable
    assert "no follow-up planned: suppressed" in readable
    assert "0 follow-up(s) sent" in readable
    assert cli(stack, "audit", "--email", "not-an-address").returncode == 1
    assert cli(stack, "audit").returncode == 1
