"""`inboxcrm audit` answers the incident questions from the trail alone."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.cli import cli
from tests.helpers.messages import GLOBEX, to_globex


def cli_as(environment: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI with another environment than the stack's (a reviewer's token)."""
    return subprocess.run([sys.executable, "-m", "inboxcrm.cli", *args], env=environment,
                          capture_output=True, text=True, timeout=60, check=False)


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


async def test_a_person_is_found_in_every_tenant_the_caller_may_read(
    env: StackClient, stack: Stack,
) -> None:
    """`audit --email` searches every tenant with a policy (the operator), or the tenants of
    INBOXCRM_REVIEWER_TOKEN's reviewer; `--tenant` narrows it; there is no demo default."""
    email = unique_email("twotenants")
    at_acme = await env.deliver(message_from(email))
    at_globex = await env.deliver(to_globex(message_from(email)), **GLOBEX)
    await env.wait_state(at_acme, "completed")
    await env.wait_state(at_globex, {"completed", "awaiting_review"})

    everywhere = cli(stack, "audit", "--email", email, "--json")
    assert everywhere.returncode == 0, everywhere.stderr
    assert {e["workflow_id"] for e in json.loads(everywhere.stdout)} == {at_acme, at_globex}
    assert {e["tenant"] for e in json.loads(everywhere.stdout)} == {"acme", "globex"}

    only_globex = cli(stack, "audit", "--email", email, "--tenant", "globex", "--json")
    assert {e["workflow_id"] for e in json.loads(only_globex.stdout)} == {at_globex}
    unknown = cli(stack, "audit", "--email", email, "--tenant", "nobody")
    assert unknown.returncode == 1 and "unknown tenant 'nobody'" in unknown.stderr

    added = cli(stack, "reviewer", "add", f"audit-{uuid.uuid4().hex[:6]}", "--tenant", "acme",
                "--json")
    assert added.returncode == 0, added.stderr
    as_reviewer = stack.env | {"INBOXCRM_REVIEWER_TOKEN": json.loads(added.stdout)["token"]}
    theirs = cli_as(as_reviewer, "audit", "--email", email, "--json")
    assert theirs.returncode == 0, theirs.stderr
    assert {e["workflow_id"] for e in json.loads(theirs.stdout)} == {at_acme}
    refused = cli_as(as_reviewer, "audit", "--email", email, "--tenant", "globex")
    assert refused.returncode == 1 and "not one you may read" in refused.stderr
