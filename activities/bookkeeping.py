"""Bookkeeping the workflow needs for people to see it: the item's state mirrored to
PostgreSQL, the review task it opens or closes, escalation marks, and audit entries. None
of it decides anything; reviewer decisions live in `activities/review.py`."""

from __future__ import annotations

from datetime import datetime

import asyncpg
from temporalio import activity

from inboxcrm.store import queries as store
from schemas.models import REVIEW_STATES, AuditEntry, EscalationInput, ItemState, StateChange

# A new wait (another wait ID) on a task still open gets its own escalation time; the same
# wait re-entered (a hold) keeps it. $8 wait ID, $9 allowed decisions, $10 needs sender,
# $11 the escalation time the workflow fixed when the wait opened (NULL: now + $7 seconds).
OPEN_REVIEW_TASK = """
INSERT INTO review_tasks (event_id, workflow_id, tenant, reason, owner, destination_ref,
                          escalate_at, wait_id, allowed, needs_sender)
VALUES ($1, $2, $3, $4, $5, $6, COALESCE($11::timestamptz, now() + make_interval(secs => $7)),
        $8, $9, $10)
ON CONFLICT (workflow_id) WHERE status = 'open'
DO UPDATE SET reason = EXCLUDED.reason, latest_attempt = now(),
              destination_ref = COALESCE(EXCLUDED.destination_ref, review_tasks.destination_ref),
              wait_id = EXCLUDED.wait_id, allowed = EXCLUDED.allowed,
              needs_sender = EXCLUDED.needs_sender,
              escalate_at = CASE WHEN review_tasks.wait_id IS DISTINCT FROM EXCLUDED.wait_id
                                 THEN EXCLUDED.escalate_at ELSE review_tasks.escalate_at END,
              escalated_at = CASE WHEN review_tasks.wait_id IS DISTINCT FROM EXCLUDED.wait_id
                                  THEN NULL ELSE review_tasks.escalated_at END
"""

CLOSE_REVIEW_TASKS = """
UPDATE review_tasks SET status = 'resolved', resolved_at = now(), resolution = $2
WHERE workflow_id = $1 AND status = 'open'
"""

# The common case (a state that is neither a review nor `rejected`) in one round trip:
# the state, the closing of any open review task, and the audit entry, atomically.
SETTLE_STATE = """
WITH state AS (
    UPDATE inbound_events SET state = $2, reason = $3, updated_at = now() WHERE event_id = $1
), closed AS (
    UPDATE review_tasks SET status = 'resolved', resolved_at = now(), resolution = $2
    WHERE workflow_id = $4 AND status = 'open'
)
INSERT INTO audit_log (tenant, event_id, workflow_id, contact_id, actor, action, detail)
VALUES ($5, $1, $4, NULL, 'workflow', 'state_changed', $6)
"""

RECORD_RESOLVER = """
UPDATE review_tasks SET resolved_by = $2 WHERE workflow_id = $1 AND status = 'open'
"""

CANCEL_EVENT_INTENTS = """
UPDATE followup_intents SET status = 'cancelled', cancel_reason = 'rejected'
WHERE event_id = $1 AND status IN ('queued', 'awaiting_approval')
"""

CANCEL_EVENT_OPERATIONS = """
UPDATE operations SET status = 'cancelled', last_transition = now()
WHERE workflow_id = $1 AND status <> 'completed'
"""

MARK_ESCALATED = """
UPDATE review_tasks SET escalated_at = now() WHERE workflow_id = $1 AND status = 'open'
"""


class BookkeepingActivities:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @activity.defn(name="record_item_state")
    async def record_item_state(self, change: StateChange) -> None:
        """Mirror the workflow's state to PostgreSQL; open or close the review task."""
        item = change.item
        detail = {"state": change.state, "reason": change.reason,
                  "review_reason": change.review_reason, "owner": change.review_owner}
        if change.state not in REVIEW_STATES and change.state != ItemState.REJECTED:
            await self._pool.execute(SETTLE_STATE, item.event_id, change.state, change.reason,
                                     item.workflow_id, item.tenant, store.json_safe(detail))
            return
        async with self._pool.acquire() as conn, conn.transaction():
            await store.set_event_state(conn, item.event_id, change.state, change.reason)
            if change.state in REVIEW_STATES and change.review_reason:
                await conn.execute(
                    OPEN_REVIEW_TASK, item.event_id, item.workflow_id, item.tenant,
                    change.review_reason, change.review_owner or "unassigned",
                    change.destination_ref, float((change.escalation_hours or 24) * 3600),
                    change.wait_id, change.allowed or [], change.needs_sender,
                    datetime.fromisoformat(change.escalate_at) if change.escalate_at else None,
                )
            elif change.state not in REVIEW_STATES:
                await conn.execute(CLOSE_REVIEW_TASKS, item.workflow_id, change.state)
            if change.state == ItemState.REJECTED:
                # Nothing more is written or sent for a rejected item.
                await conn.execute(CANCEL_EVENT_INTENTS, item.event_id)
                await conn.execute(CANCEL_EVENT_OPERATIONS, item.workflow_id)
            await store.audit(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor="workflow", action="state_changed", detail=detail,
            )

    @activity.defn(name="record_audit")
    async def record_audit(self, entry: AuditEntry) -> None:
        item = entry.item
        async with self._pool.acquire() as conn:
            if entry.action.startswith("signal_") and entry.detail.get("accepted"):
                await conn.execute(RECORD_RESOLVER, item.workflow_id, entry.actor)
            await store.audit(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=entry.actor, action=entry.action, detail=dict(entry.detail),
            )

    @activity.defn(name="mark_review_escalated")
    async def mark_review_escalated(self, escalation: EscalationInput) -> None:
        item = escalation.item
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(MARK_ESCALATED, item.workflow_id)
            await store.audit(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor="workflow", action="review_escalated", detail={"reason": escalation.reason},
            )
