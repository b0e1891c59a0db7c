"""A worker chews the pathological corpus (tests/fixtures/pathological) while ordinary items
keep completing (docs/architecture.md §7, issue 20): the work on each message runs in the
worker's process pool under its time limit, so no workflow task times out, every
pathological item ends in a state a person can act on (`too_complex` where its structure is
beyond the limits), and every ordinary item completes with exactly one email at the
destination. Before the budget, the comment flood alone held the worker's event loop for
~24 s: every workflow task on it timed out."""

from __future__ import annotations

import uuid

from temporalio.api.enums.v1 import EventType

from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.fixtures.pathological import CASES

SETTLED = {"completed", "awaiting_review", "ignored", "suppressed", "blocked", "failed",
           "held", "ambiguous"}
TIMED_OUT = {EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
             EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED}


async def test_a_worker_chews_pathological_mail_while_ordinary_items_complete(
        env: StackClient) -> None:
    run = uuid.uuid4().hex[:8]
    pathological: dict[str, str] = {}
    ordinary: dict[str, str] = {}
    for index, case in enumerate(CASES):
        raw = case.raw.decode("utf-8", errors="surrogateescape")
        pathological[case.name] = await env.deliver(raw, f"P-{run}-{case.name}")
        if index % 5 == 4:  # ordinary mail queued behind the pathological
            email = unique_email("budget")
            ordinary[email] = await env.deliver(message_from(email), f"O-{run}-{index}")

    for email, workflow_id in ordinary.items():
        assert await env.wait_state(workflow_id, "completed", timeout=180) == (
            "completed", "followup_sent"), email
    for case in CASES:
        state, reason = await env.wait_state(pathological[case.name], SETTLED, timeout=180)
        assert state not in ("failed", "blocked"), (case.name, state, reason)
        if case.too_complex:
            assert (state, reason) == ("awaiting_review", "too_complex"), case.name

    client = await env.temporal()
    for workflow_id in [*pathological.values(), *ordinary.values()]:
        history = await client.get_workflow_handle(workflow_id).fetch_history()
        stalls = [EventType.Name(e.event_type) for e in history.events
                  if e.event_type in TIMED_OUT]
        assert not stalls, (workflow_id, stalls)

    state = await env.sandbox_state()
    for email in ordinary:
        assert len([m for m in state["emails"] if email in m["to"]]) == 1, email
