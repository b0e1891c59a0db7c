"""Who is called and who may repeat a customer-facing action (issue 37, docs/architecture.md
§6), against the real relay, worker, Temporal and sandbox. The demo tenant acme maps the
`access` cause to `integration` and names `lead` as the role that alone may retry an
ambiguous send (policies/acme.json):

- an expired CRM token (the sandbox's 401) is queued for the integration owner, not sales;
- an ambiguous send (past the key's window, nothing confirmed) shows its operation key,
  intent ID, first attempt, lookup path and the send-twice warning on the card; a sales
  reviewer's retry is refused on every path (the CLI, a proven update sent straight to
  Temporal, a proof-less signal as the Temporal UI sends it) and sends nothing; a lead's is
  accepted and sends the one email.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from temporalio.client import WorkflowUpdateFailedError

from inboxcrm.platform.decisions import DecisionRequest, decision_body
from inboxcrm.platform.reviewer_identity import PATH_CLI, Principal
from inboxcrm.schemas.contract import Decision
from inboxcrm.schemas.models import ItemStatus
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.ambiguous import SEND_KEY, hold_send_ambiguous
from tests.helpers.cli import add_reviewer, as_reviewer, cli

CRM_KEY = "{}:crm-upsert"


async def retries(env: StackClient, workflow_id: str) -> list[dict[str, Any]]:
    rows = await env.db.fetch(
        "SELECT actor, detail FROM audit_log WHERE workflow_id = $1 "
        "AND action IN ('signal_retry', 'update_retry') ORDER BY audit_id", workflow_id)
    return [{"actor": r["actor"], **r["detail"]} for r in rows]


async def test_an_expired_crm_token_is_queued_for_the_integration_owner(
        env: StackClient, stack: Stack) -> None:
    email = unique_email("owner401")
    await env.inject("crm.upsert", "unauthorized")

    workflow_id = await env.deliver(message_from(email))

    state, reason = await env.wait_state(workflow_id, "blocked")
    assert reason == "http_401:INVALID_AUTHENTICATION"
    task = await env.db.fetchrow("SELECT owner, reason FROM review_tasks WHERE workflow_id = $1 "
                                 "AND status = 'open'", workflow_id)
    assert task is not None and task["owner"] == "integration"
    queue = json.loads(cli(stack, "queue", "--json").stdout)
    [mine] = [item for item in queue if item["workflow_id"] == workflow_id]
    assert mine["owner"] == "integration"
    sales = json.loads(cli(stack, "queue", "--owner", "sales-ops", "--json").stdout)
    assert workflow_id not in [item["workflow_id"] for item in sales]
    card = json.loads(cli(stack, "review", "show", workflow_id, "--json").stdout)
    assert card["owner"] == "integration"
    assert (await env.query_status(workflow_id))["review"]["owner"] == "integration"
    assert await env.crm_records_for(email) == []
    cli(stack, "review", "reject", workflow_id, "--reviewer", "ops", "--note", "rotate the key")
    await env.wait_state(workflow_id, "rejected")


async def _ambiguous_send(env: StackClient) -> tuple[str, str]:
    return await hold_send_ambiguous(env, "ambiguous", "timeout_before_commit", attempts_timeout=60)


async def test_only_a_lead_may_retry_an_ambiguous_send(env: StackClient, stack: Stack) -> None:
    suffix = uuid.uuid4().hex[:6]
    sales_token = add_reviewer(stack, f"sam-sales-{suffix}", "reviewer")
    lead_token = add_reviewer(stack, f"lea-lead-{suffix}", "lead")
    workflow_id, email = await _ambiguous_send(env)
    op_key = SEND_KEY.format(workflow_id)
    assert await env.emails_to(email) == []
    intent_id = await env.db.fetchval(
        "SELECT i.intent_id::text FROM followup_intents i JOIN inbound_events e "
        "ON e.event_id = i.event_id WHERE e.workflow_id = $1", workflow_id)

    # The card: what to check before deciding, and who may retry.
    shown = as_reviewer(stack, sales_token, "review", "show", workflow_id, "--json")
    assert shown.returncode == 0, shown.stderr
    card = json.loads(shown.stdout)
    assert card["owner"] == "integration"  # the ambiguous cause's owner (acme policy)
    ambiguous = card["ambiguous"]
    assert (ambiguous["op_key"], ambiguous["intent_id"]) == (op_key, intent_id)
    assert ambiguous["first_attempt_at"] and ambiguous["key_window_from"]
    assert f"GET {env.endpoints.sandbox_url}/emails?limit=100" in ambiguous["lookup"]
    assert intent_id in ambiguous["lookup"]
    assert "second email" in ambiguous["warning"] and "24 h" in ambiguous["warning"]
    assert ambiguous["retry_role"] == "lead"
    text = as_reviewer(stack, sales_token, "review", "show", workflow_id).stdout
    assert intent_id in text and "WARNING" in text and "/emails?limit=100" in text

    # A sales reviewer, through the CLI (the one decision client): refused, nothing sent.
    refused = as_reviewer(stack, sales_token, "review", "retry", workflow_id,
                          "--reviewer", "sam")
    assert refused.returncode != 0
    assert "authority_required" in refused.stdout + refused.stderr

    # The same reviewer's proven decision sent straight to Temporal (past the client): the
    # workflow's decision record checks the role and refuses it.
    wait_id = (await env.query_status(workflow_id))["review"]["wait_id"]
    sales = Principal(f"reviewer:sam-sales-{suffix}", f"sam-sales-{suffix}",
                      frozenset({"acme"}), role="reviewer")
    body = decision_body(DecisionRequest(workflow_id, Decision.RETRY, sales, PATH_CLI,
                                         reviewer="sam", wait_id=wait_id),
                         stack.env["INBOXCRM_DECISION_SECRET"], wait_id)
    handle = (await env.temporal()).get_workflow_handle(workflow_id)
    with pytest.raises(WorkflowUpdateFailedError) as direct:
        await handle.execute_update(Decision.RETRY.value, body, result_type=ItemStatus)
    assert "authority_required" in str(getattr(direct.value.cause, "message", direct.value))

    # A proof-less signal, as the Temporal UI sends it: refused as well.
    await env.signal(workflow_id, "retry", {"reviewer": "anyone", "wait_id": wait_id})

    async def two_refusals() -> list[dict[str, Any]] | None:
        found = await retries(env, workflow_id)
        return found if len(found) >= 2 else None

    recorded = await env.wait_for(two_refusals, what="the refused retries recorded")
    assert [(r["accepted"], r["ignored_reason"]) for r in recorded] == [
        (False, "authority_required")] * len(recorded)
    assert recorded[0]["actor"] == f"reviewer:sam-sales-{suffix}"
    assert recorded[0]["decider_role"] == "reviewer"
    assert (await env.state(workflow_id))[0] == "ambiguous"
    assert await env.emails_to(email) == []  # no refused path sent anything

    # The lead: accepted; the send runs again with the intent's key and sends once.
    accepted = as_reviewer(stack, lead_token, "review", "retry", workflow_id,
                           "--reviewer", "lea", "--note", "checked the provider: not sent")
    assert accepted.returncode == 0, accepted.stderr
    await env.wait_state(workflow_id, "completed", timeout=90)
    sent = await env.emails_to(email)
    assert [m["idempotency_key"] for m in sent] == [intent_id]
    last = (await retries(env, workflow_id))[-1]
    assert (last["actor"], last["accepted"], last["decider_role"]) == (
        f"reviewer:lea-lead-{suffix}", True, "lead")
