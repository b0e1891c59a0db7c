"""The review desk's decisions: each answers one open wait (a wait ID), as an update that is
accepted or refused at once, or as a signal bound to the wait open when it arrived.

The follow-up tenant here is `approvals` (tests/fixtures/policies): follow-ups to new
prospects need a reviewer's approval of that intent."""

from __future__ import annotations

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.cli import cli
from tests.helpers.messages import no_sender_message

APPROVALS = {"tenant": "approvals", "mailbox": "sales@approvals.test"}


def to_approvals(raw: str) -> str:
    return raw.replace("sales@acme.test", APPROVALS["mailbox"])


async def open_wait(env: StackClient, workflow_id: str) -> str:
    status = await env.query_status(workflow_id)
    assert status["review"] is not None, status
    return str(status["review"]["wait_id"])


async def stale_signals(env: StackClient, workflow_id: str) -> int:
    return await env.count(
        "SELECT count(*) FROM audit_log WHERE workflow_id = $1 AND action LIKE 'signal_%' "
        "AND detail->>'ignored_reason' = 'stale'", workflow_id)


async def test_a_second_approve_never_approves_the_followup(
    env: StackClient, stack: Stack,
) -> None:
    """Double click on approve (two signals): the first answers the review; the second is
    stale at the follow-up wait, so nothing is sent until someone approves that intent."""
    email = unique_email("double")
    workflow_id = await env.deliver(to_approvals(no_sender_message()), **APPROVALS)
    await env.wait_state(workflow_id, "awaiting_review")
    first_wait = await open_wait(env, workflow_id)
    approve = {"reviewer": "dana", "corrections": {"sender_email": email}}
    await env.signal(workflow_id, "approve", approve)
    await env.signal(workflow_id, "approve", approve)

    status = await env.wait_for(lambda: _followup_wait(env, workflow_id), what="follow-up wait")
    assert status["reason"] == "followup_approval_required"
    assert status["review"]["wait_id"] != first_wait
    assert status["review"]["intent_id"]
    await env.wait_for(lambda: stale_signals(env, workflow_id), what="stale approve recorded")
    assert len(await env.crm_records_for(email)) == 1
    assert await env.emails_to(email) == []  # the second approve did not approve the send
    assert await env.count(
        "SELECT count(*) FROM followup_intents i JOIN inbound_events e USING (event_id) "
        "WHERE e.workflow_id = $1 AND i.status = 'awaiting_approval'", workflow_id) == 1

    # An update naming the first wait is refused; naming the open one is accepted.
    stale = cli(stack, "review", "approve", workflow_id, "--reviewer", "dana",
                "--wait-id", first_wait)
    assert stale.returncode == 1 and "is not the open one" in stale.stderr
    assert await env.emails_to(email) == []
    done = cli(stack, "review", "approve", workflow_id, "--reviewer", "erin")
    assert done.returncode == 0, done.stderr
    await env.wait_state(workflow_id, "completed")
    assert len(await env.emails_to(email)) == 1
    assert await env.count(
        "SELECT count(*) FROM followup_intents i JOIN inbound_events e USING (event_id) "
        "WHERE e.workflow_id = $1 AND i.approved_by = 'erin'", workflow_id) == 1


async def _followup_wait(env: StackClient, workflow_id: str) -> dict | None:  # type: ignore[type-arg]
    status = await env.query_status(workflow_id)
    review = status.get("review")
    return status if review and review["reason"] == "followup_approval_required" else None


async def test_approve_without_the_followup_sends_nothing(
    env: StackClient, stack: Stack,
) -> None:
    email = unique_email("nofollowup")
    workflow_id = await env.deliver(to_approvals(message_from(email)), **APPROVALS)
    await env.wait_for(lambda: _followup_wait(env, workflow_id), what="follow-up wait")
    answer = cli(stack, "review", "approve", workflow_id, "--reviewer", "dana",
                 "--no-send-followup")
    assert answer.returncode == 0, answer.stderr
    assert await env.wait_state(workflow_id, "completed") == ("completed", "followup_declined")
    assert len(await env.crm_records_for(email)) == 1
    assert await env.emails_to(email) == []
    assert await env.count(
        "SELECT count(*) FROM operations WHERE op_key = $1 AND status = 'cancelled'",
        f"{workflow_id}:send") == 1


async def test_every_refusal_exits_non_zero_and_holds_keep_the_deadline(
    env: StackClient, stack: Stack,
) -> None:
    email = unique_email("refusals")
    workflow_id = await env.deliver(no_sender_message())
    await env.wait_state(workflow_id, "awaiting_review")
    wait_id = await open_wait(env, workflow_id)
    before = await env.db.fetchval(
        "SELECT escalate_at FROM review_tasks WHERE workflow_id = $1", workflow_id)

    def refused(*args: str) -> str:
        answer = cli(stack, "review", *args)
        assert answer.returncode == 1, (args, answer.stdout, answer.stderr)
        return answer.stderr

    assert "reviewer" in refused("approve", workflow_id, "--reviewer", " ")
    assert "allowed: approve, hold, reject" in refused("retry", workflow_id, "--reviewer", "d")
    assert "corrections.sender_email" in refused("approve", workflow_id, "--reviewer", "d")
    assert "is not the open one" in refused("approve", workflow_id, "--reviewer", "d",
                                            "--wait-id", "w9-review")
    assert "resolve" in refused("resolve", workflow_id, "--reviewer", "d", "--evidence", "x")

    held = cli(stack, "review", "hold", workflow_id, "--reviewer", "dana")
    assert held.returncode == 0 and "is now held" in held.stdout, held.stdout
    status = await env.query_status(workflow_id)
    assert status["state"] == "held" and status["review"]["wait_id"] == wait_id
    after = await env.db.fetchval(
        "SELECT escalate_at FROM review_tasks WHERE workflow_id = $1 AND status = 'open'",
        workflow_id)
    assert after == before  # a hold does not postpone the escalation

    approved = cli(stack, "review", "approve", workflow_id, "--reviewer", "dana",
                   "--set", f"sender_email={email}")
    assert approved.returncode == 0, approved.stderr
    await env.wait_state(workflow_id, "completed")
    assert "not running" in refused("approve", workflow_id, "--reviewer", "dana")
    assert len(await env.crm_records_for(email)) == 1


async def test_resolve_without_evidence_and_no_open_wait_are_refused(
    env: StackClient, stack: Stack,
) -> None:
    email = unique_email("noevidence")
    await env.inject("crm.upsert", "invalid_field")
    workflow_id = await env.deliver(message_from(email))
    await env.wait_state(workflow_id, "blocked")
    status = await env.query_status(workflow_id)
    assert status["review"]["error"] and "400" in status["review"]["error"]
    missing = cli(stack, "review", "resolve", workflow_id, "--reviewer", "dana")
    assert missing.returncode == 1 and "resolve needs evidence" in missing.stderr

    # While a step runs (here: parked by a pause) no wait is open: a decision is refused.
    assert cli(stack, "pause", "--tenant", "acme", "--scope", "crm").returncode == 0
    try:
        assert cli(stack, "review", "retry", workflow_id, "--reviewer", "dana").returncode == 0
        await env.wait_for(lambda: _paused(env, workflow_id), what="parked by the pause")
        idle = cli(stack, "review", "approve", workflow_id, "--reviewer", "dana",
                   "--wait-id", "w1-recovery")
        assert idle.returncode == 1 and "nothing is waiting" in idle.stderr
    finally:
        assert cli(stack, "resume", "--tenant", "acme", "--scope", "crm").returncode == 0
    await env.wait_state(workflow_id, "completed")
    assert len(await env.crm_records_for(email)) == 1


async def _paused(env: StackClient, workflow_id: str) -> bool:
    return (await env.state(workflow_id)) == ("crm_pending", "paused")
