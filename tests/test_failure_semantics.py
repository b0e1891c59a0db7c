"""Failure semantics (docs/architecture.md §4): each scenario injects the fault for real — sandbox
fault injection or kill -9 of the real worker process — and counts records on the
destination side. Nothing duplicated, nothing lost, nothing silently repeated."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

import pytest

from inboxcrm.domain.unsubscribe_links import make_token
from inboxcrm.platform.config import Settings
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.cli import add_reviewer, as_reviewer, cli

CRM_KEY = "{}:crm-upsert"
SEND_KEY = "{}:send"
ONE_CLICK = {"content": b"List-Unsubscribe=One-Click",
             "headers": {"content-type": "application/x-www-form-urlencoded"}}


@pytest.fixture
def restart_worker(stack: Stack):  # type: ignore[no-untyped-def]
    """kill -9 the running worker process; return a function that starts a new one."""
    def kill_and_restart() -> None:
        stack.processes["worker"].kill()
        stack.start_worker()
    yield kill_and_restart
    if not stack.processes["worker"].alive():
        stack.start_worker()


@pytest.fixture
def resumed(stack: Stack):  # type: ignore[no-untyped-def]
    yield
    for tenant in ("acme", "rehearsal"):
        cli(stack, "resume", "--tenant", tenant, "--scope", "all")


async def test_crm_rate_limit_honours_retry_after(env: StackClient) -> None:
    email = unique_email("ratelimited")
    await env.inject("crm.upsert", "rate_limit", count=2, retry_after=2)

    workflow_id = await env.deliver(message_from(email))

    await env.wait_state(workflow_id, "completed")
    assert len(await env.crm_records_for(email)) == 1
    calls = [c for c in await env.calls("crm.upsert")][-3:]
    assert [c["outcome"] for c in calls] == ["rate_limit", "rate_limit", "ok"]
    gaps = [(datetime.fromisoformat(b["at"]) - datetime.fromisoformat(a["at"])).total_seconds()
            for a, b in zip(calls, calls[1:], strict=False)]
    assert all(gap >= 1.9 for gap in gaps), gaps  # the provider's delay, not our 1 s backoff
    op = await env.operation(CRM_KEY.format(workflow_id))
    assert op is not None and op["attempts"] == 3 and op["status"] == "completed"


async def test_invalid_field_blocks_after_one_attempt_then_reviewer_retry(
    env: StackClient, stack: Stack,
) -> None:
    email = unique_email("invalid")
    await env.inject("crm.upsert", "invalid_field")
    before = len(await env.calls("crm.upsert"))

    workflow_id = await env.deliver(message_from(email))

    state, reason = await env.wait_state(workflow_id, "blocked")
    assert reason == "http_400:VALIDATION_ERROR"
    await asyncio.sleep(2)  # a permanent error is never retried on its own
    assert len(await env.calls("crm.upsert")) - before == 1
    assert await env.crm_records_for(email) == []
    queue = cli(stack, "queue", "--json")
    assert workflow_id in queue.stdout

    result = cli(stack, "review", "retry", workflow_id, "--reviewer", "dana",
                 "--note", "fixed the field mapping")
    assert result.returncode == 0, result.stderr

    await env.wait_state(workflow_id, "completed")
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1
    assert workflow_id not in cli(stack, "queue", "--json").stdout


async def test_expired_credential_blocks(env: StackClient, stack: Stack) -> None:
    email = unique_email("expired")
    await env.inject("crm.upsert", "unauthorized")

    workflow_id = await env.deliver(message_from(email))

    state, reason = await env.wait_state(workflow_id, "blocked")
    assert reason == "http_401:INVALID_AUTHENTICATION"
    assert await env.crm_records_for(email) == []
    assert await env.emails_to(email) == []
    cli(stack, "review", "reject", workflow_id, "--reviewer", "dana", "--note", "rotate key")
    assert (await env.wait_state(workflow_id, "rejected"))[0] == "rejected"
    assert await env.emails_to(email) == []


async def test_retries_exhausted_is_a_visible_state(env: StackClient, stack: Stack) -> None:
    email = unique_email("exhausted")
    await env.inject("crm.upsert", "rate_limit", count=6, retry_after=0)

    workflow_id = await env.deliver(message_from(email))

    assert await env.wait_state(workflow_id, "blocked") == ("blocked", "retries_exhausted")
    op = await env.operation(CRM_KEY.format(workflow_id))
    assert op is not None and op["attempts"] == op["max_attempts"] == 6
    assert op["status"] == "waiting" and op["last_error_category"] == "transient"

    cli(stack, "review", "retry", workflow_id, "--reviewer", "dana")
    await env.wait_state(workflow_id, "completed")
    assert len(await env.crm_records_for(email)) == 1
    op = await env.operation(CRM_KEY.format(workflow_id))
    assert op is not None and op["attempts"] == 7 and op["attempts"] <= op["max_attempts"]


async def test_crm_timeout_after_successful_write(env: StackClient) -> None:
    email = unique_email("crmtimeout")
    await env.inject("crm.upsert", "timeout_after_commit")

    workflow_id = await env.deliver(message_from(email))

    await env.wait_state(workflow_id, "completed")
    assert len(await env.crm_records_for(email)) == 1
    op = await env.operation(CRM_KEY.format(workflow_id))
    assert op is not None and op["destination_id"] == (await env.crm_records_for(email))[0]["id"]


async def test_mail_timeout_after_successful_send(env: StackClient) -> None:
    email = unique_email("mailtimeout")
    await env.inject("mail.send", "timeout_after_commit")

    workflow_id = await env.deliver(message_from(email))

    await env.wait_state(workflow_id, "completed")
    assert len(await env.emails_to(email)) == 1


async def test_search_index_lag_during_reconciliation(env: StackClient) -> None:
    email = unique_email("lagging")
    await env.sandbox_config(search_lag_seconds=120)
    await env.inject("crm.upsert", "timeout_after_commit")

    workflow_id = await env.deliver(message_from(email))

    await env.wait_state(workflow_id, "completed")
    # The search index still does not show the record...
    search = await env.http.post(
        f"{env.endpoints.sandbox_url}/crm/v3/objects/contacts/search",
        json={"filterGroups": [{"filters": [
            {"propertyName": "email", "operator": "EQ", "value": email}]}]})
    assert search.json()["total"] == 0
    # ...and yet there is exactly one record: a lagging "not found" never creates a second.
    assert len(await env.crm_records_for(email)) == 1


@pytest.mark.slow
async def test_worker_killed_inside_the_crm_call(env: StackClient, restart_worker) -> None:  # type: ignore[no-untyped-def]
    email = unique_email("killedcall")
    await env.sandbox_config(hang_seconds=30)
    await env.inject("crm.upsert", "timeout_before_commit")

    workflow_id = await env.deliver(message_from(email))
    await env.wait_operation(CRM_KEY.format(workflow_id), "in_progress")
    restart_worker()

    await env.wait_state(workflow_id, "completed", timeout=90)
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1


@pytest.mark.slow
async def test_worker_killed_after_crm_commit_before_ledger_write(
    env: StackClient, restart_worker,  # type: ignore[no-untyped-def]
) -> None:
    email = unique_email("killedcommit")
    await env.sandbox_config(hang_seconds=30)
    await env.inject("crm.upsert", "timeout_after_commit")
    before = len(await env.calls("crm.upsert"))

    workflow_id = await env.deliver(message_from(email))
    await env.wait_for(lambda: env.crm_records_for(email), what="CRM commit")
    op = await env.operation(CRM_KEY.format(workflow_id))
    assert op is not None and op["status"] == "in_progress"  # ...our ledger has not
    restart_worker()

    await env.wait_state(workflow_id, "completed", timeout=90)
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.calls("crm.upsert")) - before == 1  # reconciled, not re-sent
    assert len(await env.emails_to(email)) == 1


@pytest.mark.slow
async def test_worker_killed_after_provider_accepted_email(
    env: StackClient, restart_worker,  # type: ignore[no-untyped-def]
) -> None:
    email = unique_email("killedsend")
    await env.sandbox_config(hang_seconds=30)
    await env.inject("mail.send", "timeout_after_commit")

    workflow_id = await env.deliver(message_from(email))
    await env.wait_for(lambda: env.emails_to(email), what="provider accepted the email")
    restart_worker()

    state, _ = await env.wait_state(workflow_id, {"completed", "ambiguous"}, timeout=90)
    assert len(await env.emails_to(email)) == 1  # one email or ambiguous, never two
    assert state == "completed"  # the same key inside its window: reconciled by repeating


@pytest.mark.slow
async def unsubscribe_while_the_worker_is_dead(env: StackClient, stack: Stack, email: str,
                                               secret: str) -> None:
    """kill -9 the worker in the middle of the send, then the person's one-click unsubscribe;
    the caller starts a worker again."""
    stack.processes["worker"].kill()
    contact_id = await env.db.fetchval(
        "SELECT contact_id FROM contacts WHERE tenant = 'acme' AND canonical_email = lower($1)",
        email)
    link = f"{stack.relay_url}/v1/unsubscribe/{make_token(secret, 'acme', contact_id)}"

    async def unsubscribed() -> bool:
        # The relay waits (≤ 30 s a request) for the dead attempt's send lease to run out.
        response = await env.http.post(link, timeout=40, **ONE_CLICK)  # type: ignore[arg-type]
        return response.status_code == 200
    await env.wait_for(unsubscribed, timeout=90, what="the unsubscribe recorded")


async def test_a_repeat_that_finds_the_person_opted_out_is_held(
    env: StackClient, stack: Stack, app_settings: Settings, restart_worker,  # type: ignore[no-untyped-def]
) -> None:
    """The provider accepted the email, the worker died before hearing so, and the person
    used the unsubscribe link before the send was repeated. Repeating could write to someone
    who asked not to be written to (had the first attempt not gone out) and nothing else
    confirms it: the item is held `ambiguous` for a person, never sent again, and never
    reported `suppressed` while an email may have gone out."""
    email = unique_email("optedoutrepeat")
    assert app_settings.unsubscribe_secret is not None
    secret = app_settings.unsubscribe_secret.get_secret_value()
    await env.sandbox_config(hang_seconds=30)
    await env.inject("mail.send", "timeout_after_commit")

    workflow_id = await env.deliver(message_from(email))
    await env.wait_for(lambda: env.emails_to(email), what="provider accepted the email")
    await unsubscribe_while_the_worker_is_dead(env, stack, email, secret)
    stack.start_worker()

    state, _ = await env.wait_state(workflow_id, {"completed", "ambiguous", "suppressed"},
                                    timeout=90)
    op = await env.operation(SEND_KEY.format(workflow_id))
    assert state == "ambiguous"
    assert op is not None and op["status"] == "ambiguous", dict(op or {})
    assert len(await env.emails_to(email)) == 1  # the first attempt's, and no other
    assert await env.count("SELECT count(*) FROM suppressions WHERE tenant = 'acme' "
                           "AND canonical_email = lower($1)", email) == 1


async def test_an_unconfirmed_send_then_an_opt_out_is_settled_by_a_person(
    env: StackClient, stack: Stack, app_settings: Settings, restart_worker,  # type: ignore[no-untyped-def]
) -> None:
    """The send hung before the provider committed it, the worker died, and the person
    unsubscribed before the send was repeated: held `ambiguous` (`unconfirmed_then_
    suppressed`). Nothing can make the repeat eligible, so a retry holds again and sends
    nothing (the card says so); the person's answer is `reject` (no follow-up) when the
    provider has no email. (A chaos run once retried such an item six times.)"""
    email = unique_email("unconfirmedoptout")
    lead = add_reviewer(stack, f"lee-{email.split('@')[0][-6:]}", "lead")
    assert app_settings.unsubscribe_secret is not None
    secret = app_settings.unsubscribe_secret.get_secret_value()
    await env.sandbox_config(hang_seconds=30)
    hung_before = [c for c in await env.calls("mail.send")
                   if c["outcome"] == "timeout_before_commit"]
    await env.inject("mail.send", "timeout_before_commit")

    workflow_id = await env.deliver(message_from(email))

    async def send_hanging() -> bool:
        calls = await env.calls("mail.send")
        return len([c for c in calls if c["outcome"] == "timeout_before_commit"]) > len(
            hung_before)
    await env.wait_for(send_hanging, timeout=60, what="the send hanging at the provider")
    await unsubscribe_while_the_worker_is_dead(env, stack, email, secret)
    await env.reset_faults()
    stack.start_worker()

    op_key = SEND_KEY.format(workflow_id)
    state, reason = await env.wait_state(workflow_id, {"completed", "ambiguous", "suppressed"},
                                         timeout=90)
    op = await env.operation(op_key)
    assert (state, reason) == ("ambiguous", "outcome_unconfirmed")
    assert op is not None and op["last_error"] == "unconfirmed_then_suppressed", dict(op or {})
    assert await env.emails_to(email) == []
    card = json.loads(cli(stack, "review", "show", workflow_id, "--json").stdout)
    warning = card["ambiguous"]["warning"]
    assert "(suppressed)" in warning and "`reject`" in warning and "`resolve`" in warning

    # A lead's retry is accepted, repeats nothing, and the item is held again.
    attempts = op["attempts"]
    retried = as_reviewer(stack, lead, "review", "retry", workflow_id, "--reviewer", "lee")
    assert retried.returncode == 0, retried.stdout + retried.stderr

    async def held_again() -> bool:
        again = await env.operation(op_key)
        return (again is not None and again["attempts"] > attempts
                and again["status"] == "ambiguous")
    await env.wait_for(held_again, timeout=60, what="the retry held again")
    assert (await env.wait_state(workflow_id, "ambiguous", timeout=60))[0] == "ambiguous"
    assert await env.emails_to(email) == []

    # Not at the provider: the person rejects; nothing is sent, the intent is cancelled.
    rejected = as_reviewer(stack, lead, "review", "reject", workflow_id, "--reviewer", "lee",
                           "--note", "not at the provider; opted out since")
    assert rejected.returncode == 0, rejected.stdout + rejected.stderr
    await env.wait_state(workflow_id, "rejected", timeout=60)
    assert await env.emails_to(email) == []
    intent = await env.db.fetchrow(
        "SELECT i.status, i.cancel_reason, i.lease_owner FROM followup_intents i "
        "JOIN inbound_events e USING (event_id) WHERE e.workflow_id = $1", workflow_id)
    assert dict(intent or {}) == {"status": "cancelled", "cancel_reason": "rejected_unconfirmed",
                                  "lease_owner": None}
    assert (await env.operation(op_key) or {})["status"] == "cancelled"


async def test_opt_out_cancels_a_queued_intent_while_sends_are_paused(
    env: StackClient, stack: Stack, resumed: None,
) -> None:
    email = unique_email("optout")
    assert cli(stack, "pause", "--tenant", "acme", "--scope", "send").returncode == 0

    first = await env.deliver(message_from(email))
    await env.wait_state(first, "send_pending")
    assert await env.state(first) == ("send_pending", "paused")
    opt_out = await env.deliver(message_from(
        email, subject="unsubscribe", body="Please unsubscribe me from all emails.\n"))
    assert (await env.wait_state(opt_out, "suppressed"))[0] == "suppressed"

    assert cli(stack, "resume", "--tenant", "acme", "--scope", "send").returncode == 0
    # The opt-out's transaction cancelled the queued intent; the send re-read it and stopped.
    assert await env.wait_state(first, "suppressed") == ("suppressed", "intent_cancelled")
    assert await env.emails_to(email) == []
    assert len(await env.crm_records_for(email)) == 1
    assert await env.count(
        "SELECT count(*) FROM followup_intents i JOIN inbound_events e USING (event_id)"
        " WHERE e.workflow_id = $1 AND i.status = 'cancelled'", first) == 1


async def test_unrelated_new_event_for_existing_contact_is_processed(env: StackClient) -> None:
    email = unique_email("returning")
    first = await env.deliver(message_from(email))
    await env.wait_state(first, "completed")

    second = await env.deliver(message_from(email, subject="Another question"))

    assert await env.wait_state(second, "completed") == ("completed", "quiet_period")
    op = await env.operation(CRM_KEY.format(second))
    assert op is not None and op["status"] == "completed"  # the CRM was updated again
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1  # one acknowledgment per quiet period


async def test_pause_holds_everything_until_resume(
    env: StackClient, stack: Stack, resumed: None,
) -> None:
    email = unique_email("paused")
    assert cli(stack, "pause", "--tenant", "acme", "--scope", "all").returncode == 0
    before = len(await env.calls("crm.upsert"))

    workflow_id = await env.deliver(message_from(email))
    await env.wait_state(workflow_id, "crm_pending")
    await asyncio.sleep(6)  # at least one pause re-check

    assert await env.state(workflow_id) == ("crm_pending", "paused")
    assert len(await env.calls("crm.upsert")) == before
    assert await env.emails_to(email) == []
    assert cli(stack, "resume", "--tenant", "acme", "--scope", "all").returncode == 0
    await env.wait_state(workflow_id, "completed")
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1


async def test_replay_of_a_terminated_run_repeats_no_completed_step(
    env: StackClient, stack: Stack, resumed: None,
) -> None:
    email = unique_email("replayed")
    cli(stack, "pause", "--tenant", "acme", "--scope", "send")
    workflow_id = await env.deliver(message_from(email))
    await env.wait_state(workflow_id, "send_pending")
    client = await env.temporal()
    await client.get_workflow_handle(workflow_id).terminate("operator test")
    crm_calls = len(await env.calls("crm.upsert"))

    refused = cli(stack, "replay", "inbound/acme/standard/sales@acme.test/none", "--reviewer",
                  "dana", "--reason", "x")
    assert refused.returncode == 1
    result = cli(stack, "replay", workflow_id, "--reviewer", "dana", "--reason", "terminated")
    assert result.returncode == 0, result.stderr
    cli(stack, "resume", "--tenant", "acme", "--scope", "send")

    await env.wait_state(workflow_id, "completed")
    assert len(await env.calls("crm.upsert")) == crm_calls  # completed CRM op not repeated
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1
    again = cli(stack, "replay", workflow_id, "--reviewer", "dana", "--reason", "again")
    assert again.returncode == 1 and "only failed or terminated" in again.stderr


async def test_crm_note_is_a_side_effect_of_its_own(env: StackClient) -> None:
    """Logging the email on the contact has its own key: a timeout after the note was
    written is reconciled, and retrying the note never repeats the contact upsert."""
    email = unique_email("noted")
    await env.inject("crm.note", "timeout_after_commit")
    upserts_before = len(await env.calls("crm.upsert"))

    workflow_id = await env.deliver(message_from(email))

    await env.wait_state(workflow_id, "completed")
    [record] = await env.crm_records_for(email)
    notes = [n for n in (await env.sandbox_state())["notes"]
             if n["associations"]["contacts"] == [record["id"]]]
    assert len(notes) == 1
    assert len(await env.calls("crm.upsert")) - upserts_before == 1
    op = await env.operation(f"{workflow_id}:crm-note")
    assert op is not None and (op["status"], op["destination_id"]) == ("completed", notes[0]["id"])


async def test_opt_out_during_an_in_flight_send_is_recorded_after_it(
    env: StackClient,
) -> None:
    """The email is on the wire (the provider committed it, our client timed out) when the
    opt-out arrives: the opt-out waits for the send's lease instead of being recorded before
    an email that then shows up after it. Found by the chaos run."""
    email = unique_email("racing")
    await env.sandbox_config(hang_seconds=6)
    await env.inject("mail.send", "timeout_after_commit")
    first = await env.deliver(message_from(email))
    await env.wait_for(lambda: env.emails_to(email), what="provider accepted the email")

    opt_out = await env.deliver(message_from(
        email, subject="unsubscribe", body="Please unsubscribe me from all emails.\n"))

    assert (await env.wait_state(opt_out, "suppressed", timeout=90))[0] == "suppressed"
    assert (await env.wait_state(first, {"completed"}, timeout=90))[0] == "completed"
    assert len(await env.emails_to(email)) == 1
    row = await env.db.fetchrow(
        "SELECT s.created_at AS suppressed_at, i.sent_at FROM suppressions s, followup_intents i"
        " JOIN inbound_events e USING (event_id)"
        " WHERE s.canonical_email = lower($1) AND e.workflow_id = $2", email, first)
    assert row["sent_at"] < row["suppressed_at"]  # recorded in the order it happened
    timed_out = await env.count(  # precondition: the send's outcome really was unknown
        "SELECT count(*) FROM audit_log WHERE workflow_id = $1 AND action = 'attempt_failed'",
        first)
    assert timed_out >= 1


async def test_a_transient_send_failure_does_not_hold_the_intent(env: StackClient) -> None:
    """A 429 leaves nothing on the wire: the next attempt may send at once (the lease is
    released), so one rate limit costs one retry, not the whole attempt budget."""
    email = unique_email("send429")
    await env.inject("mail.send", "rate_limit", retry_after=1)

    workflow_id = await env.deliver(message_from(email))

    await env.wait_state(workflow_id, "completed", timeout=30)
    op = await env.operation(f"{workflow_id}:send")
    assert op is not None and op["attempts"] == 2
    assert len(await env.emails_to(email)) == 1
