"""People in the loop: review tasks, signal validation, hold/reject/resolve, escalation, and
the relay's recovery when Temporal or the ledger is down."""

from __future__ import annotations

import asyncio
import json
import uuid

from inboxcrm.stack.processes import free_port, http_answers
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from inboxcrm.verify.signing import sample_message
from tests.helpers.cli import cli
from tests.helpers.messages import no_sender_message


async def audit_actions(env: StackClient, workflow_id: str) -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    rows = await env.db.fetch(
        "SELECT action, detail FROM audit_log WHERE workflow_id = $1 ORDER BY audit_id",
        workflow_id)
    return [(r["action"], r["detail"]) for r in rows]


async def test_invalid_signals_are_recorded_and_ignored_then_approve_with_corrections(
    env: StackClient, stack: Stack,
) -> None:
    email = unique_email("corrected")
    workflow_id = await env.deliver(no_sender_message())
    assert await env.wait_state(workflow_id, "awaiting_review") == (
        "awaiting_review", "missing_sender")
    task = await env.db.fetchrow("SELECT * FROM review_tasks WHERE workflow_id = $1", workflow_id)
    assert task["status"] == "open" and task["owner"] == "sales-ops"

    await env.signal(workflow_id, "approve", "not an object")
    await env.signal(workflow_id, "approve", {"note": "no reviewer"})
    await env.signal(workflow_id, "approve", {"reviewer": "dana", "surprise": 1})
    await env.signal(workflow_id, "retry", {"reviewer": "dana"})  # not a review decision
    await env.signal(workflow_id, "approve", {"reviewer": "dana",
                                              "corrections": {"sender_email": email}})

    await env.wait_state(workflow_id, "completed")
    signals = [d for a, d in await audit_actions(env, workflow_id) if a.startswith("signal_")]
    assert [(d["accepted"], d["ignored_reason"]) for d in signals] == [
        (False, "body_not_an_object"), (False, "reviewer_required"), (False, "unknown_fields"),
        (False, "not_allowed_while_review"), (True, None)]
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1
    task = await env.db.fetchrow("SELECT * FROM review_tasks WHERE workflow_id = $1", workflow_id)
    # Signals carry no proof: the decider is the identity Temporal recorded for the request,
    # never the typed "dana" (docs/architecture.md §6).
    assert task["status"] == "resolved" and task["resolved_by"].startswith("temporal:")
    assert signals[-1]["typed_reviewer"] == "dana"
    assert signals[-1]["path"] == "temporal-ui signal" and not signals[-1]["authenticated"]


async def test_hold_keeps_the_item_owned_then_reject_ends_it(
    env: StackClient, stack: Stack,
) -> None:
    workflow_id = await env.deliver(no_sender_message())
    await env.wait_state(workflow_id, "awaiting_review")

    assert cli(stack, "review", "hold", workflow_id, "--reviewer", "dana",
               "--note", "asking the sender").returncode == 0
    await env.wait_state(workflow_id, "held")
    queue = json.loads(cli(stack, "queue", "--json").stdout)
    assert workflow_id in [item["workflow_id"] for item in queue]
    client = await env.temporal()
    held = [w.id async for w in client.list_workflows(
        f'NeedsReview = true AND InboxState = "held" AND WorkflowId = "{workflow_id}"')]
    assert held == [workflow_id]

    assert cli(stack, "review", "reject", workflow_id, "--reviewer", "dana").returncode == 0
    assert (await env.wait_state(workflow_id, "rejected"))[0] == "rejected"
    # The CLI decides by update: audited as such (a signal's are `signal_*`, above), and
    # the accepted one names who resolved the review task.
    decisions = [(a, d["accepted"], d["via"]) for a, d in await audit_actions(env, workflow_id)
                 if a.startswith(("signal_", "update_"))]
    assert decisions == [("update_hold", True, "update"), ("update_reject", True, "update")]
    task = await env.db.fetchrow("SELECT * FROM review_tasks WHERE workflow_id = $1", workflow_id)
    assert task["resolved_by"] == "operator"
    queue = json.loads(cli(stack, "queue", "--json").stdout)
    assert workflow_id not in [item["workflow_id"] for item in queue]
    assert await env.count("SELECT count(*) FROM followup_intents i JOIN inbound_events e "
                           "USING (event_id) WHERE e.workflow_id = $1", workflow_id) == 0


async def test_resolve_records_a_side_effect_confirmed_by_a_person(
    env: StackClient, stack: Stack,
) -> None:
    email = unique_email("resolved")
    await env.inject("crm.upsert", "invalid_field")
    workflow_id = await env.deliver(message_from(email))
    await env.wait_state(workflow_id, "blocked")

    # The operator fixes it by hand in the CRM, then tells inboxcrm which record it is.
    manual = await env.http.post(
        f"{env.endpoints.sandbox_url}/crm/v3/objects/contacts/batch/upsert",
        json={"inputs": [{"idProperty": "created_by_hand", "id": email,
                          "properties": {"email": email}}]})
    record_id = manual.json()["results"][0]["id"]
    missing = cli(stack, "review", "resolve", workflow_id, "--reviewer", "dana")
    assert missing.returncode == 1 and "resolve needs evidence" in missing.stderr
    assert cli(stack, "review", "resolve", workflow_id, "--reviewer", "dana",
               "--evidence", record_id).returncode == 0

    await env.wait_state(workflow_id, "completed")
    op = await env.operation(f"{workflow_id}:crm-upsert")
    assert op is not None and (op["status"], op["destination_id"]) == ("completed", record_id)
    assert [r["id"] for r in await env.crm_records_for(email)] == [record_id]  # no second
    notes = (await env.sandbox_state())["notes"]
    assert [n["associations"]["contacts"] for n in notes
            if n["associations"]["contacts"] == [record_id]] == [[record_id]]
    assert len(await env.emails_to(email)) == 1


async def test_escalation_marks_overdue_items(env: StackClient, stack: Stack) -> None:
    # The `rehearsal` tenant escalates after 7.2 s (policies/rehearsal.json).
    workflow_id = await env.deliver(no_sender_message().replace(
        "sales@acme.test", "inbox@rehearsal.test"), tenant="rehearsal",
        mailbox="inbox@rehearsal.test")
    await env.wait_state(workflow_id, "awaiting_review")
    client = await env.temporal()
    query = f'ReviewOverdue = true AND WorkflowId = "{workflow_id}"'
    for _ in range(60):
        if [w async for w in client.list_workflows(query)]:
            break
        await asyncio.sleep(0.5)
    else:
        raise AssertionError("never marked overdue")
    task = await env.db.fetchrow("SELECT * FROM review_tasks WHERE workflow_id = $1", workflow_id)
    assert task["escalated_at"] is not None
    assert "review_escalated" in [a for a, _ in await audit_actions(env, workflow_id)]
    queue = json.loads(cli(stack, "queue", "--json", "--tenant", "rehearsal").stdout)
    assert [i["overdue"] for i in queue if i["workflow_id"] == workflow_id] == [True]
    await env.signal(workflow_id, "reject", {"reviewer": "dana"})
    await env.wait_state(workflow_id, "rejected")


async def test_temporal_down_stores_then_sweeper_starts(env: StackClient, stack: Stack) -> None:
    """A relay that cannot reach Temporal stores the event and answers 503; the sweeper (of
    any relay) starts it later. The provider's redelivery is answered as a duplicate."""
    email = unique_email("sweeper")
    port = free_port()
    isolated = stack.env | {"TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
                            "INBOXCRM_RELAY_PORT": str(port),
                            "INBOXCRM_RELAY_METRICS_ADDRESS": ""}  # the main relay's port
    from inboxcrm.stack.processes import ManagedProcess, python

    relay = ManagedProcess("relay-no-temporal", python("inboxcrm.ingress.main"), isolated,
                           stack.log_dir).start()
    try:
        relay.wait_ready(http_answers(f"http://127.0.0.1:{port}/healthz"))
        health = await env.http.get(f"http://127.0.0.1:{port}/healthz")
        assert health.json() == {"ok": False, "database": True, "temporal": False}
        raw = message_from(email)
        delivery_id = f"E-sweep-{uuid.uuid4().hex[:8]}"
        response = await env.post(raw, delivery_id, relay_url=f"http://127.0.0.1:{port}")
        assert response.status_code == 503
        workflow_id = response.json()["workflow_id"]
        assert await env.count("SELECT count(*) FROM inbound_events WHERE workflow_id = $1 "
                               "AND workflow_started_at IS NULL", workflow_id) == 1
    finally:
        relay.stop()
    await env.wait_state(workflow_id, "completed", timeout=60)  # the main relay's sweeper
    again = await env.post(raw, delivery_id)
    assert again.json()["status"] == "duplicate"
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1


async def test_ledger_down_answers_503(env: StackClient, stack: Stack) -> None:
    from inboxcrm.stack.processes import ManagedProcess, python

    port = free_port()
    dead_db = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    relay = ManagedProcess("relay-no-db", python("inboxcrm.ingress.main"),
                           stack.env | {"DATABASE_URL": dead_db,
                                        "INBOXCRM_RELAY_PORT": str(port),
                                        "INBOXCRM_RELAY_METRICS_ADDRESS": ""},
                           stack.log_dir).start()
    try:
        relay.wait_ready(http_answers(f"http://127.0.0.1:{port}/healthz"))
        health = await env.http.get(f"http://127.0.0.1:{port}/healthz")
        assert health.status_code == 503 and health.json()["database"] is False
        response = await env.post(sample_message(), relay_url=f"http://127.0.0.1:{port}")
        assert response.status_code == 503
        assert "ledger" in response.json()["message"]
    finally:
        relay.stop()
