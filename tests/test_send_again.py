"""A deliberate second send (issue 37, docs/architecture.md §6 "Authority"): at an ambiguous
follow-up send, a person with the role the tenant's policy names
(`authority.repeat_customer_facing`, `lead` for acme) may send the follow-up again as its own
business action: a new intent with its own idempotency key and approval. The first intent
stays as it was. A sales reviewer is refused, a redelivered decision sends nothing more, and
an item with no unconfirmed follow-up cannot be sent again."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import uuid
from typing import Any

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError
from temporalio.worker import Replayer

from inboxcrm.platform import temporal
from inboxcrm.platform.config import Settings
from inboxcrm.platform.decisions import DecisionRequest, decision_body
from inboxcrm.platform.reviewer_identity import PATH_CLI, Principal
from inboxcrm.schemas.contract import Decision
from inboxcrm.schemas.models import ItemStatus
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient
from inboxcrm.workflows.inbound_email import InboundEmailWorkflow
from tests.helpers.ambiguous import SEND_KEY, hold_send_ambiguous
from tests.helpers.cli import add_reviewer, as_reviewer, cli
from tests.helpers.histories import store_history
from tests.helpers.messages import no_sender_message


async def _sent_then_ambiguous(env: StackClient) -> tuple[str, str]:
    return await hold_send_ambiguous(env, "sendagain", "timeout_after_commit", attempts_timeout=90)


async def _intents(env: StackClient, workflow_id: str) -> list[dict[str, Any]]:
    rows = await env.db.fetch(
        "SELECT i.intent_id::text AS intent_id, i.status, i.generation, "
        "i.repeats_intent_id::text AS repeats, i.approved_by, i.repeat_reason, "
        "i.repeat_approved_at FROM followup_intents i JOIN inbound_events e "
        "ON e.event_id = i.event_id WHERE e.workflow_id = $1 ORDER BY i.generation",
        workflow_id)
    return [dict(r) for r in rows]


async def _audit(env: StackClient, workflow_id: str, action: str) -> list[dict[str, Any]]:
    rows = await env.db.fetch("SELECT actor, detail FROM audit_log WHERE workflow_id = $1 "
                              "AND action = $2 ORDER BY audit_id", workflow_id, action)
    return [{"actor": r["actor"], **r["detail"]} for r in rows]


async def test_a_lead_sends_an_ambiguous_followup_again_as_a_new_intent(
        env: StackClient, stack: Stack, app_settings: Settings) -> None:
    suffix = uuid.uuid4().hex[:6]
    sales_token = add_reviewer(stack, f"sid-sales-{suffix}", "reviewer")
    lead_token = add_reviewer(stack, f"lou-lead-{suffix}", "lead")
    workflow_id, email = await _sent_then_ambiguous(env)
    first = await _intents(env, workflow_id)
    assert len(first) == 1
    first_id = first[0]["intent_id"]
    assert [m["idempotency_key"] for m in await env.emails_to(email)] == [first_id]
    status = await env.query_status(workflow_id)
    assert "send_again" in status["review"]["allowed"]
    wait_id = status["review"]["wait_id"]

    # A sales reviewer: refused, through the CLI and with a proven update straight to
    # Temporal (the workflow's decision record checks the role).
    refused = as_reviewer(stack, sales_token, "review", "send-again", workflow_id,
                          "--reviewer", "sid", "--reason", "customer asked")
    assert refused.returncode != 0
    assert "authority_required" in refused.stdout + refused.stderr
    secret = stack.env["INBOXCRM_DECISION_SECRET"]
    sales = Principal(f"reviewer:sid-sales-{suffix}", f"sid-sales-{suffix}",
                      frozenset({"acme"}), role="reviewer")
    handle = (await env.temporal()).get_workflow_handle(workflow_id)
    with pytest.raises(WorkflowUpdateFailedError) as direct:
        await handle.execute_update(
            Decision.SEND_AGAIN.value,
            decision_body(DecisionRequest(workflow_id, Decision.SEND_AGAIN, sales, PATH_CLI,
                                          reviewer="sid", note="customer asked",
                                          wait_id=wait_id), secret, wait_id),
            result_type=ItemStatus)
    assert "authority_required" in str(getattr(direct.value.cause, "message", direct.value))
    assert len(await env.emails_to(email)) == 1
    assert len(await _intents(env, workflow_id)) == 1

    # The lead: accepted; a new intent, its own key, its own approval.
    reason = "customer says nothing arrived"
    accepted = as_reviewer(stack, lead_token, "review", "send-again", workflow_id,
                           "--reviewer", "lou", "--reason", reason)
    assert accepted.returncode == 0, accepted.stderr
    # The same decision redelivered (a double click, a retried request): nothing more.
    lead = Principal(f"reviewer:lou-lead-{suffix}", f"lou-lead-{suffix}", frozenset({"acme"}),
                     role="lead")
    again = decision_body(DecisionRequest(workflow_id, Decision.SEND_AGAIN, lead, PATH_CLI,
                                          reviewer="lou", note=reason, wait_id=wait_id),
                          secret, wait_id)
    with pytest.raises((WorkflowUpdateFailedError, RPCError)):  # no open wait, or ended
        await handle.execute_update(Decision.SEND_AGAIN.value, again, result_type=ItemStatus)
    with contextlib.suppress(RPCError):  # the run has ended already
        await handle.signal(Decision.SEND_AGAIN.value, dataclasses.asdict(again))
    await env.wait_state(workflow_id, "completed", timeout=90)

    intents = await _intents(env, workflow_id)
    assert [i["generation"] for i in intents] == [1, 2]
    original, repeat = intents
    assert original["status"] == first[0]["status"]  # the first intent is untouched
    assert repeat["status"] == "sent" and repeat["repeats"] == first_id
    assert repeat["approved_by"] == f"reviewer:lou-lead-{suffix}"
    assert repeat["repeat_reason"] == reason and repeat["repeat_approved_at"] is not None
    sent = await env.emails_to(email)
    assert sorted(m["idempotency_key"] for m in sent) == sorted([first_id,
                                                                  repeat["intent_id"]])
    assert len(sent) == 2
    approved = await _audit(env, workflow_id, "followup_send_again_approved")
    assert [(a["actor"], a["repeats_intent_id"], a["intent_id"], a["reason"])
            for a in approved] == [(f"reviewer:lou-lead-{suffix}", first_id,
                                    repeat["intent_id"], reason)]
    sent_again = await _audit(env, workflow_id, "followup_sent_again")
    assert [s["idempotency_key"] for s in sent_again] == [repeat["intent_id"]]
    assert await _audit(env, workflow_id, "followup_sent") == []  # no retry's entry
    decisions = await _audit(env, workflow_id, "update_send_again")
    assert [(d["accepted"], d.get("decider_role")) for d in decisions][:2] == [
        (False, "reviewer"), (True, "lead")]
    first_op = await env.operation(SEND_KEY.format(workflow_id))
    assert first_op is not None and first_op["status"] == "ambiguous"  # kept as evidence
    # The invariants hold for the item: one email per intent, every email's key known,
    # nothing left pending but the first send the repeat settled.
    checked = cli(stack, "check", "--json", "--settled", "--scope", workflow_id)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["ok"] is True

    # Its history replays (and is stored for later releases with INBOXCRM_CAPTURE_HISTORIES).
    client = await temporal.connect(app_settings)
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    replayer = Replayer(workflows=[InboundEmailWorkflow], data_converter=client.data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
    label = os.environ.get("INBOXCRM_CAPTURE_HISTORIES")
    if label:
        store_history(history, f"{label}-sent-again", app_settings)


async def test_send_again_needs_a_followup_that_is_unconfirmed(env: StackClient,
                                                                stack: Stack) -> None:
    """An item waiting for its review has no follow-up sent: refused, with the reason."""
    lead_token = add_reviewer(stack, f"lia-lead-{uuid.uuid4().hex[:6]}", "lead")
    workflow_id = await env.deliver(no_sender_message())
    await env.wait_state(workflow_id, "awaiting_review")
    refused = as_reviewer(stack, lead_token, "review", "send-again", workflow_id,
                          "--reviewer", "lia", "--reason", "just in case")
    assert refused.returncode != 0
    assert "no_followup_to_repeat" in refused.stdout + refused.stderr
    assert (await env.state(workflow_id))[0] == "awaiting_review"
    assert await env.count("SELECT count(*) FROM followup_intents i JOIN inbound_events e "
                           "ON e.event_id = i.event_id WHERE e.workflow_id = $1",
                           workflow_id) == 0
    rejected = as_reviewer(stack, lead_token, "review", "reject", workflow_id,
                           "--reviewer", "lia")
    assert rejected.returncode == 0, rejected.stderr


async def test_a_person_suppressed_since_cannot_be_sent_it_again(env: StackClient,
                                                                 stack: Stack) -> None:
    """The opt-out came after the unconfirmed send: a send-again is refused with the reason,
    nothing more is sent and no intent is made; the item still waits for a person."""
    lead_token = add_reviewer(stack, f"lex-lead-{uuid.uuid4().hex[:6]}", "lead")
    workflow_id, email = await _sent_then_ambiguous(env)
    await env.db.execute("INSERT INTO suppressions (tenant, canonical_email, reason, source) "
                         "VALUES ('acme', lower($1), 'unsubscribe', 'test_send_again')", email)
    refused = as_reviewer(stack, lead_token, "review", "send-again", workflow_id,
                          "--reviewer", "lex", "--reason", "customer asked again")
    assert refused.returncode != 0
    assert "suppressed" in refused.stdout + refused.stderr
    assert (await env.state(workflow_id))[0] == "ambiguous"
    assert len(await _intents(env, workflow_id)) == 1
    assert len(await env.emails_to(email)) == 1
    recorded = await _audit(env, workflow_id, "update_send_again")
    assert [(r["accepted"], r["ignored_reason"]) for r in recorded] == [(False, "suppressed")]
    rejected = as_reviewer(stack, lead_token, "review", "reject", workflow_id,
                           "--reviewer", "lex", "--note", "opted out")
    assert rejected.returncode == 0, rejected.stderr
