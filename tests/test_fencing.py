"""Fencing of the operation ledger: two attempts of one operation overlap (a slow local
activity outlives its step and its re-run starts), against the real sandbox behind a gate.
Whatever order they finish in: one destination effect, and a settled row stays settled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from inboxcrm.activities.crm import CrmActivities
from inboxcrm.activities.review import ReviewActivities
from inboxcrm.activities.send import SendActivities
from inboxcrm.adapters.factory import build_crm, build_mail
from inboxcrm.platform.config import Settings
from inboxcrm.schemas.models import OperationInput, OperationResult, RetryGrant
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.cli import cli
from tests.helpers.outbox import (
    Gate,
    GatedCrm,
    GatedMail,
    PlannedItem,
    UnsearchableMail,
    planned_item,
    step_env,
)

CAP = 30.0


@pytest.fixture
async def clients(app_settings: Settings) -> AsyncIterator[dict[str, Any]]:
    crm, mail = build_crm(app_settings), build_mail(app_settings)
    # The stack's settings: its unsubscribe secret signs the follow-ups' opt-out links.
    yield {"crm": crm, "mail": mail, "settings": app_settings}
    await crm.aclose()
    await mail.aclose()


def _attempt(fn: Any, op: OperationInput) -> asyncio.Task[OperationResult]:
    return asyncio.create_task(step_env().run(fn, op))


async def _row(db: asyncpg.Pool, op_key: str) -> asyncpg.Record:
    row = await db.fetchrow(
        "SELECT status, attempts, destination_id FROM operations WHERE op_key = $1", op_key)
    assert row is not None
    return row


async def _audits(db: asyncpg.Pool, planned: PlannedItem, action: str) -> list[Any]:
    rows = await db.fetch("SELECT detail FROM audit_log WHERE workflow_id = $1 AND action = $2",
                          planned.item.workflow_id, action)
    return [r["detail"] for r in rows]


@pytest.mark.parametrize("lose_answer", [True, False], ids=["lost-answer", "late-answer"])
async def test_overlapping_crm_attempts_make_one_record_and_the_row_stays_completed(
        env: StackClient, db: asyncpg.Pool, clients: dict[str, Any], lose_answer: bool) -> None:
    planned = await planned_item(db)
    op = planned.op("crm-upsert")
    gate = Gate()
    slow = CrmActivities(db, GatedCrm(clients["crm"], gate, lose_answer=lose_answer), CAP)
    rerun = CrmActivities(db, clients["crm"], CAP)

    first = _attempt(slow.upsert_contact_in_crm, op)
    await asyncio.wait_for(gate.entered.wait(), 10)   # the record exists; attempt 1 stalls
    second = await step_env().run(rerun.upsert_contact_in_crm, op)
    assert second.status == "completed" and second.reconciled
    gate.opened.set()
    late = await first

    assert late.status == "completed" and late.destination_id == second.destination_id
    row = await _row(db, op.op_key)
    assert (row["status"], row["destination_id"]) == ("completed", second.destination_id)
    assert len(await env.crm_records_for(planned.email)) == 1
    assert len(await _audits(db, planned, "crm_upserted")) == 1
    if lose_answer:
        assert [d["fenced"] for d in await _audits(db, planned, "attempt_failed")] == [True]


@pytest.mark.parametrize("lose_answer", [True, False], ids=["lost-answer", "late-answer"])
async def test_overlapping_send_attempts_send_one_email_and_the_row_stays_completed(
        env: StackClient, db: asyncpg.Pool, clients: dict[str, Any], lose_answer: bool) -> None:
    planned = await planned_item(db)
    op = planned.op("send")
    gate = Gate()
    slow = SendActivities(db, GatedMail(clients["mail"], gate, lose_answer=lose_answer), CAP,
                          clients["settings"])
    rerun = SendActivities(db, clients["mail"], CAP, clients["settings"])

    first = _attempt(slow.submit_followup_email, op)
    await asyncio.wait_for(gate.entered.wait(), 10)   # the provider took it; attempt 1 stalls
    second = await step_env().run(rerun.submit_followup_email, op)
    # Resend cannot be searched: the re-run repeats the identical request with the same key
    # (its reconciliation), and the provider answers the first email's ID.
    assert second.status == "completed"
    gate.opened.set()
    late = await first

    assert late.status == "completed"
    row = await _row(db, op.op_key)
    assert (row["status"], row["destination_id"]) == ("completed", second.destination_id)
    assert len(await env.emails_to(planned.email)) == 1
    assert len(await _audits(db, planned, "followup_sent")) == 1
    intent = await db.fetchrow("SELECT status, provider_message_id FROM followup_intents "
                               "WHERE intent_id = $1::uuid", planned.intent_id)
    assert intent is not None and intent["status"] == "sent"


async def test_a_send_refuses_an_intent_already_sent(
        env: StackClient, db: asyncpg.Pool, clients: dict[str, Any]) -> None:
    """The intent says `sent` (an overlapping attempt's mirror, a person's resolve) while the
    row was left retryable: the next attempt reports the stored message, it sends nothing."""
    planned = await planned_item(db)
    await db.execute("UPDATE followup_intents SET status = 'sent', provider_message_id = 'm-1' "
                     "WHERE intent_id = $1::uuid", planned.intent_id)
    await db.execute("UPDATE operations SET status = 'waiting', attempts = 1, "
                     "last_error_category = 'transient' WHERE op_key = $1",
                     planned.op("send").op_key)
    send = SendActivities(db, clients["mail"], CAP, clients["settings"])

    result = await step_env().run(send.submit_followup_email, planned.op("send"))

    assert (result.status, result.destination_id) == ("completed", "m-1")
    assert await env.emails_to(planned.email) == []


async def test_a_cancelled_send_stays_cancelled(
        env: StackClient, db: asyncpg.Pool, clients: dict[str, Any]) -> None:
    """A re-run after the attempt that cancelled it (a suppression) must not say `completed`."""
    planned = await planned_item(db)
    await db.execute("UPDATE operations SET status = 'cancelled', attempts = 1 "
                     "WHERE op_key = $1", planned.op("send").op_key)
    send = SendActivities(db, clients["mail"], CAP, clients["settings"])

    result = await step_env().run(send.submit_followup_email, planned.op("send"))

    assert result.status == "cancelled"
    assert (await _row(db, planned.op("send").op_key))["status"] == "cancelled"
    assert await env.emails_to(planned.email) == []


@pytest.fixture
def send_resumed(stack: Stack):  # type: ignore[no-untyped-def]
    yield
    cli(stack, "resume", "--tenant", "acme", "--scope", "send")


async def test_a_send_cancelled_before_a_crash_ends_suppressed(
        env: StackClient, db: asyncpg.Pool, stack: Stack, send_resumed: None) -> None:
    """The attempt that found the suppression cancelled the operation, then its worker died
    before the workflow heard of it: the re-run must end `suppressed`, not `followup_sent`."""
    email = unique_email("cancelledcrash")
    assert cli(stack, "pause", "--tenant", "acme", "--scope", "send").returncode == 0
    workflow_id = await env.deliver(message_from(email))
    await env.wait_state(workflow_id, "send_pending")
    # What the cancelling attempt committed before the crash (send.py, one transaction).
    async with db.acquire() as conn, conn.transaction():
        await conn.execute("INSERT INTO suppressions (tenant, canonical_email, reason, source) "
                           "VALUES ('acme', $1, 'opt_out_request', 'test')", email)
        await conn.execute("UPDATE followup_intents i SET status = 'cancelled', "
                           "cancel_reason = 'suppressed' FROM inbound_events e "
                           "WHERE e.event_id = i.event_id AND e.workflow_id = $1", workflow_id)
        await conn.execute("UPDATE operations SET status = 'cancelled', attempts = 1 "
                           "WHERE op_key = $1", f"{workflow_id}:send")

    assert cli(stack, "resume", "--tenant", "acme", "--scope", "send").returncode == 0

    state, _ = await env.wait_state(workflow_id, {"suppressed", "completed"})
    assert state == "suppressed"
    assert await env.emails_to(email) == []


async def test_retry_of_an_ambiguous_send_sends_with_the_same_key_and_records_who(
        env: StackClient, db: asyncpg.Pool, clients: dict[str, Any]) -> None:
    """An unsearchable relay dropped the answer: the send is ambiguous. A person checks the
    relay's log, finds nothing, and says `retry`: the next attempt sends, with the intent's
    key, instead of finding the same uncertainty again."""
    planned = await planned_item(db)
    op = planned.op("send")
    send = SendActivities(db, UnsearchableMail(clients["mail"], drops=1), CAP,
                          clients["settings"])
    with pytest.raises(Exception, match="AmbiguousOutcome"):
        await step_env(timeout=6).run(send.submit_followup_email, op)  # a 3 s lease
    assert (await _row(db, op.op_key))["status"] == "ambiguous"

    review = ReviewActivities(db)
    await step_env().run(review.grant_operation_retry,
                                    RetryGrant(planned.item, op.op_key, "dana", 3))
    await asyncio.sleep(3.5)  # the dropped attempt's lease expires
    result = await step_env().run(send.submit_followup_email, op)

    assert result.status == "completed" and not result.reconciled
    emails = await env.emails_to(planned.email)
    assert [m["idempotency_key"] for m in emails] == [planned.intent_id]
    [grant] = await db.fetch("SELECT actor, detail FROM audit_log WHERE workflow_id = $1 "
                             "AND action = 'operation_retry_granted'", planned.item.workflow_id)
    assert grant["actor"] == "dana"
    assert grant["detail"]["checked_not_sent"] is True
