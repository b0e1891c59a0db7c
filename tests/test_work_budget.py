"""A worker chews the pathological corpus (tests/fixtures/pathological) while ordinary items
keep completing (docs/architecture.md §7, issue 20): the work on each message runs in the
worker's process pool under its time limit, so no workflow task times out, every
pathological item ends in a state a person can act on (`too_complex` where its structure is
beyond the limits), and every ordinary item completes with exactly one email at the
destination. Before the budget, the comment flood alone held the worker's event loop for
~24 s: every workflow task on it timed out."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime

from temporalio.api.enums.v1 import EventType

from inboxcrm.store import items
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.fixtures.pathological import CASES, HEAD

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


# Issue 36: the punycode message (300 KB, one byte >= 0x80) held a work child for its whole
# time limit, and the pool was one queue for every tenant.
DELAY_BOUND = 2.0  # seconds another tenant's ordinary mail may be delayed by ten of them


def _punycode(index: int) -> str:
    raw = (HEAD.replace(b"<pathological@", b"<punycode-%d@" % index)
           + b"Content-Type: text/plain; charset=punycode\r\n\r\n\xe9-" + b"ba" * 150_000)
    return raw.decode("utf-8", errors="surrogateescape")


async def _extracted_after(env: StackClient, workflow_id: str, delivered: float) -> float:
    """Seconds from delivery to the item's `extracted` audit entry (the extraction, queue
    for the work pool included)."""
    async def extracted() -> datetime | None:
        rows = await env.db.fetch(items.AUDIT_BY_WORKFLOW, workflow_id)
        return next((row["at"] for row in rows if row["action"] == "extracted"), None)
    at = await env.wait_for(extracted, timeout=120, what="extracted")
    return float(at.timestamp() - delivered)


async def test_ten_punycode_messages_to_one_tenant_do_not_delay_anothers_mail(
        env: StackClient) -> None:
    run = uuid.uuid4().hex[:8]
    baseline_email = unique_email("fair-base")
    delivered = time.time()
    baseline_id = await env.deliver(message_from(baseline_email), f"B-{run}")
    baseline = await _extracted_after(env, baseline_id, delivered)
    assert await env.wait_state(baseline_id, "completed", timeout=120) == (
        "completed", "followup_sent")

    hostile = await asyncio.gather(*(
        env.deliver(_punycode(i), f"H-{run}-{i}", tenant="globex", mailbox="hello@globex.test")
        for i in range(10)))
    email = unique_email("fair")
    delivered = time.time()
    ordinary_id = await env.deliver(message_from(email), f"O-{run}")
    delay = await _extracted_after(env, ordinary_id, delivered) - baseline
    assert await env.wait_state(ordinary_id, "completed", timeout=120) == (
        "completed", "followup_sent")
    assert delay < DELAY_BOUND, f"acme's ordinary mail was delayed {delay:.2f} s"
    for workflow_id in hostile:  # read within the budget: none of them ran out of it
        state, reason = await env.wait_state(workflow_id, SETTLED, timeout=120)
        assert reason != "too_complex" and state not in ("failed",), (workflow_id, state)
