"""Bookkeeping the workflow needs for people to see it: the item's state mirrored to
PostgreSQL, the review task it opens or closes, escalation marks, and audit entries. None
of it decides anything; reviewer decisions live in `activities/review.py`."""

from __future__ import annotations

from datetime import datetime

import asyncpg
from temporalio import activity

from inboxcrm.store import audit, events, intents, ledger, review_tasks
from schemas.models import REVIEW_STATES, AuditEntry, EscalationInput, ItemState, StateChange


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
            await self._pool.execute(review_tasks.SETTLE_STATE, item.event_id, change.state,
                                     change.reason, item.workflow_id, item.tenant,
                                     audit.json_safe(detail))
            return
        async with self._pool.acquire() as conn, conn.transaction():
            await events.set_state(conn, item.event_id, change.state, change.reason)
            if change.state in REVIEW_STATES and change.review_reason:
                await conn.execute(
                    review_tasks.OPEN_REVIEW_TASK, item.event_id, item.workflow_id,
                    item.tenant, change.review_reason, change.review_owner or "unassigned",
                    change.destination_ref, float((change.escalation_hours or 24) * 3600),
                    change.wait_id, change.allowed or [], change.needs_sender,
                    datetime.fromisoformat(change.escalate_at) if change.escalate_at else None,
                )
            elif change.state not in REVIEW_STATES:
                await conn.execute(review_tasks.CLOSE_REVIEW_TASKS, item.workflow_id,
                                   change.state)
            if change.state == ItemState.REJECTED:
                # Nothing more is written or sent for a rejected item.
                await conn.execute(intents.CANCEL_EVENT_INTENTS, item.event_id)
                await conn.execute(ledger.CANCEL_EVENT_OPERATIONS, item.workflow_id)
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor="workflow", action="state_changed", detail=detail,
            )

    @activity.defn(name="record_audit")
    async def record_audit(self, entry: AuditEntry) -> None:
        item = entry.item
        async with self._pool.acquire() as conn:
            if entry.action.startswith("signal_") and entry.detail.get("accepted"):
                await conn.execute(review_tasks.RECORD_RESOLVER, item.workflow_id, entry.actor)
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=entry.actor, action=entry.action, detail=dict(entry.detail),
            )

    @activity.defn(name="mark_review_escalated")
    async def mark_review_escalated(self, escalation: EscalationInput) -> None:
        item = escalation.item
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(review_tasks.MARK_ESCALATED, item.workflow_id)
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor="workflow", action="review_escalated", detail={"reason": escalation.reason},
            )
