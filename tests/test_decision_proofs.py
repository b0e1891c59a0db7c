"""Proven decisions on every path (issue 36, docs/architecture.md §6), against the real
Temporal dev server, PostgreSQL and the sandbox, with a worker process of the test's own
running as production (`INBOXCRM_ENV=production`):

- a decision sent by a plain Temporal client (what the Temporal UI and `temporal workflow
  signal` do), signal or update, carries no proof: refused, with a reason that names the
  review desk, and the item keeps waiting;
- the desk's proof sent again with other corrections is refused: the proof covers the
  whole decision body;
- the desk's own decision, as the desk sends it, is taken and recorded as its reviewer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from temporalio.client import WorkflowUpdateFailedError

from inboxcrm.platform.decisions import DecisionRequest, decision_body, send_decision
from inboxcrm.platform.reviewer_identity import PATH_DESK, operator
from inboxcrm.schemas.contract import QUERY_STATUS, Decision
from inboxcrm.schemas.models import DecisionBody, ItemStatus
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, unique_email
from tests.helpers.messages import no_sender_message
from tests.helpers.own_worker import OwnWorker
from tests.helpers.time_skipping import stored_event


@pytest.fixture
def production_worker(stack: Stack) -> Iterator[OwnWorker]:
    worker = OwnWorker(stack, INBOXCRM_ENV="production",
                       INBOXCRM_MAIL_FROM="Acme Sales <sales@acme.test>")
    worker.start()
    yield worker
    worker.stop_all()


async def decisions(db: asyncpg.Pool, workflow_id: str) -> list[dict[str, Any]]:
    rows = await db.fetch("SELECT actor, action, detail FROM audit_log WHERE workflow_id = $1 "
                          "AND (action LIKE 'signal_%' OR action LIKE 'update_%') "
                          "ORDER BY audit_id", workflow_id)
    return [{"actor": r["actor"], "action": r["action"], **r["detail"]} for r in rows]


async def test_in_production_only_a_proven_decision_of_its_whole_body_is_taken(
        env: StackClient, db: asyncpg.Pool, stack: Stack,
        production_worker: OwnWorker) -> None:
    event_id, workflow_id = await stored_event(db, no_sender_message())
    handle = await production_worker.run_item(env, event_id, workflow_id)
    await env.wait_state(workflow_id, "awaiting_review")
    status = await handle.query(QUERY_STATUS, result_type=ItemStatus)
    assert status.review is not None
    wait_id = status.review.wait_id

    # A plain Temporal client: a signal, then an update, neither with a proof.
    await env.signal(workflow_id, "approve", {"reviewer": "mallory", "corrections": {
        "sender_email": unique_email("signalled")}})
    [signalled] = await env.wait_for(lambda: decisions(db, workflow_id), what="the signal")
    assert (signalled["accepted"], signalled["ignored_reason"]) == (False, "unproven_decision")
    assert signalled["actor"].startswith("temporal:") and not signalled["authenticated"]
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(Decision.APPROVE, DecisionBody(
            reviewer="mallory", wait_id=wait_id,
            corrections={"sender_email": unique_email("updated")}), result_type=ItemStatus)
    reason = str(getattr(refused.value.cause, "message", refused.value.cause))
    assert "unproven_decision" in reason and "review desk" in reason, reason

    # The desk's proof of one decision, sent with other corrections.
    genuine = unique_email("genuine")
    request = DecisionRequest(workflow_id=workflow_id, action=Decision.APPROVE,
                              decider=operator(), path=PATH_DESK, reviewer="ops",
                              corrections={"sender_email": genuine}, wait_id=wait_id)
    secret = stack.env["INBOXCRM_DECISION_SECRET"]
    signed = decision_body(request, secret, wait_id)
    attacker = unique_email("replayed")
    with pytest.raises(WorkflowUpdateFailedError) as replayed:
        await handle.execute_update(Decision.APPROVE, dataclasses.replace(
            signed, corrections={"sender_email": attacker}), result_type=ItemStatus)
    reason = str(getattr(replayed.value.cause, "message", replayed.value.cause))
    assert "proof_invalid" in reason and "review desk" in reason, reason
    with pytest.raises(WorkflowUpdateFailedError):
        await handle.execute_update(Decision.APPROVE, dataclasses.replace(
            signed, send_followup=False), result_type=ItemStatus)
    assert (await env.state(workflow_id))[0] == "awaiting_review"

    # The desk's decision as it signed it: taken, under its decider.
    result = await send_decision(lambda: env.temporal(), secret, request)
    assert result.accepted, result.message
    await env.wait_state(workflow_id, "completed")
    recorded = await decisions(db, workflow_id)
    assert [(d["action"], d["accepted"], d["ignored_reason"]) for d in recorded] == [
        ("signal_approve", False, "unproven_decision"),
        ("update_approve", False, "unproven_decision"),
        ("update_approve", False, "proof_invalid"),
        ("update_approve", False, "proof_invalid"),
        ("update_approve", True, None)]
    assert (recorded[-1]["actor"], recorded[-1]["authenticated"]) == ("operator", True)
    # Nothing a refused decision carried reached the CRM; the desk's correction did.
    assert len(await env.crm_records_for(genuine)) == 1
    assert await env.crm_records_for(attacker) == []
