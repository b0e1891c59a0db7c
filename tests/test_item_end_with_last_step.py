"""An item's last step records the item's end with its own success
(`OperationInput.ends_item`, written in the step's success statement): the state, the open
review tasks and the audit entry `record_item_state` used to write after it. A happy item
runs five steps, not six; one without a follow-up, four. Counted in PostgreSQL, at the mail
destination and in the run's history."""

from __future__ import annotations

import json
from collections import Counter

from temporalio.api.enums.v1 import EventType

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
    assert sum(steps.values()) == 5 and steps["submit_followup_email"] == 1, steps
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
    planned, so the CRM note is the last step and records the end."""
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
    assert steps["log_email_on_contact"] == 1 and sum(steps.values()) == 4, steps
