"""An item's last step records the item's end with its own success
(`OperationInput.ends_item`, written in the step's success statement): the state, the open
review tasks and the audit entry `record_item_state` used to write after it. A happy item
runs seven steps, not eight (the last: the sent follow-up's log in the CRM,
`conversation-in-crm`); one without a follow-up, five (the last: the inbound email's
activity). Counted in PostgreSQL, at the mail destination and in the run's history."""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from temporalio.api.enums.v1 import EventType

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.chaos import signal_all
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.messages import no_sender_message

AUDIT_OF = """
SELECT action, actor, detail ->> 'state' AS state, detail ->> 'reason' AS reason
FROM audit_log WHERE workflow_id = $1 ORDER BY audit_id
"""


async def _local_steps(env: StackClient, workflow_id: str) -> Counter[str]:
    """The local activities the run recorded, by type (from their markers' summaries)."""
    client = await env.temporal()
    steps: Counter[str] = Counter()
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if (event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
                and event.marker_recorded_event_attributes.marker_name == "core_local_activity"):
            data = event.marker_recorded_event_attributes.details["data"].payloads[0].data
            steps[json.loads(data)["activity_type"]] += 1
    return steps


async def _wait_closed(env: StackClient, workflow_id: str) -> None:
    client = await env.temporal()
    await client.get_workflow_handle(workflow_id).result()


async def test_a_happy_item_ends_with_its_send_and_records_its_end_once(
        env: StackClient) -> None:
    email = unique_email("endbysend")
    workflow_id = await env.deliver(message_from(email))
    assert await env.wait_state(workflow_id, "completed") == ("completed", "followup_sent")
    await _wait_closed(env, workflow_id)

    assert len(await env.emails_to(email)) == 1
    audit = await env.db.fetch(AUDIT_OF, workflow_id)
    ends = [i for i, row in enumerate(audit) if row["action"] == "state_changed"
            and row["state"] == "completed"]
    sent = [i for i, row in enumerate(audit) if row["action"] == "followup_sent"]
    assert len(ends) == 1 and len(sent) == 1 and sent[0] < ends[0], audit
    assert (audit[ends[0]]["actor"], audit[ends[0]]["reason"]) == ("workflow", "followup_sent")
    steps = await _local_steps(env, workflow_id)
    assert "record_item_state" not in steps
    assert sum(steps.values()) == 7 and steps["submit_followup_email"] == 1, steps
    assert steps["log_followup_in_crm"] == 1, steps
    status = await env.query_status(workflow_id)
    assert (status["state"], status["reason"]) == ("completed", "followup_sent")


async def test_a_reviewed_item_has_its_review_task_resolved_by_the_send(
        env: StackClient) -> None:
    """An item a person approved: the review task is closed, whoever closes it, and the end
    is recorded once."""
    workflow_id = await env.deliver(no_sender_message())
    await env.wait_state(workflow_id, "awaiting_review")
    email = unique_email("reviewedend")
    await env.signal(workflow_id, "approve", {"reviewer": "dana",
                                              "corrections": {"sender_email": email}})
    assert await env.wait_state(workflow_id, "completed") == ("completed", "followup_sent")
    await _wait_closed(env, workflow_id)

    assert len(await env.emails_to(email)) == 1
    assert await env.count("SELECT count(*) FROM review_tasks WHERE workflow_id = $1 "
                           "AND status = 'open'", workflow_id) == 0
    audit = await env.db.fetch(AUDIT_OF, workflow_id)
    assert [r["state"] for r in audit if r["action"] == "state_changed"][-1] == "completed"
    assert sum(1 for r in audit if r["action"] == "state_changed"
               and r["state"] == "completed") == 1
    assert "record_item_state" in await _local_steps(env, workflow_id)  # the review's own


async def test_an_item_without_a_follow_up_ends_with_its_crm_note(env: StackClient) -> None:
    """A second email from the same person within the quiet period: no follow-up is
    planned, so the inbound email's CRM activity is the last step and records the end."""
    email = unique_email("quietend")
    first = await env.deliver(message_from(email))
    await env.wait_state(first, "completed")
    second = await env.deliver(message_from(email, subject="One more question"))
    assert await env.wait_state(second, "completed") == ("completed", "quiet_period")
    await _wait_closed(env, second)

    assert len(await env.emails_to(email)) == 1
    audit = await env.db.fetch(AUDIT_OF, second)
    ends = [r for r in audit if r["action"] == "state_changed" and r["state"] == "completed"]
    assert [(r["actor"], r["reason"]) for r in ends] == [("workflow", "quiet_period")], audit
    steps = await _local_steps(env, second)
    assert "record_item_state" not in steps and "submit_followup_email" not in steps
    assert steps["log_email_on_contact"] == 1 and sum(steps.values()) == 5, steps
    assert steps["log_inbound_email_in_crm"] == 1, steps


@contextmanager
def _temporal_frozen(stack: Stack) -> Iterator[None]:
    """SIGSTOP the stack's Temporal server: a worker's report of a finished workflow task
    cannot reach it, while the worker's local steps and their database writes go on."""
    proc = stack.processes["temporal"].proc
    assert proc is not None
    signal_all([proc.pid], signal.SIGSTOP)
    try:
        yield
    finally:
        signal_all([proc.pid], signal.SIGCONT)


@pytest.mark.slow
async def test_a_worker_killed_after_the_send_recorded_the_end_leaves_one_end(
        env: StackClient, stack: Stack) -> None:
    """The send commits its success and the item's end, then the worker dies before the
    server hears of it (kill -9, with the Temporal server stopped in that window). The next
    worker runs the item again from its start: every step finds its work done and the end
    is recorded again, but the audit trail says `completed` once, as it happened."""
    if "temporal" not in stack.processes:
        pytest.skip("needs the stack's own Temporal server (TEMPORAL_ADDRESS is set)")
    email = unique_email("endafterkill")
    await env.sandbox_config(hang_seconds=4)  # the provider answers 4 s after it accepted
    await env.inject("mail.send", "timeout_after_commit")
    workflow_id = await env.deliver(message_from(email))
    await env.wait_for(lambda: env.emails_to(email), what="the provider accepted the email")

    async def end_recorded() -> bool:
        audit = await env.db.fetch(AUDIT_OF, workflow_id)
        return any(r["action"] == "state_changed" and r["state"] == "completed" for r in audit)

    with _temporal_frozen(stack):
        await env.wait_for(end_recorded, what="the send recorded the item's end")
        stack.processes["worker"].kill()
    stack.start_worker()

    assert await env.wait_state(workflow_id, "completed", timeout=90) == (
        "completed", "followup_sent")
    await _wait_closed(env, workflow_id)
    client = await env.temporal()
    lost = [event async for event in client.get_workflow_handle(workflow_id)
            .fetch_history_events()
            if event.event_type in (EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
                                    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)]
    assert lost, "the killed worker's workflow task reached the server: no fault injected"
    assert len(await env.emails_to(email)) == 1
    assert len(await env.crm_records_for(email)) == 1
    audit = await env.db.fetch(AUDIT_OF, workflow_id)
    ends = [r for r in audit if r["action"] == "state_changed" and r["state"] == "completed"]
    assert len(ends) == 1, audit
    assert sum(1 for r in audit if r["action"] == "followup_sent") == 1, audit
