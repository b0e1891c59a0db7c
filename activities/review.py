"""Bookkeeping for the workflow's state and for people in the loop: item state, review
tasks, reviewer decisions and the audit entries that record them."""

from __future__ import annotations

from typing import Any

import asyncpg
from temporalio import activity

from inboxcrm.domain.policy import InvalidAddress, canonical_email, get_policy
from inboxcrm.store import ledger
from inboxcrm.store import queries as store
from schemas.models import (
    REVIEW_STATES,
    AuditEntry,
    CorrectionInput,
    EscalationInput,
    IntentApproval,
    ItemState,
    ResolveInput,
    RetryGrant,
    StateChange,
)

OPEN_REVIEW_TASK = """
INSERT INTO review_tasks (event_id, workflow_id, tenant, reason, owner, destination_ref,
                          escalate_at)
VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7))
ON CONFLICT (workflow_id) WHERE status = 'open'
DO UPDATE SET reason = EXCLUDED.reason, latest_attempt = now(),
              destination_ref = COALESCE(EXCLUDED.destination_ref, review_tasks.destination_ref)
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

LOAD_EXTRACTION = "SELECT extraction FROM inbound_events WHERE event_id = $1 FOR UPDATE"

STORE_CORRECTION = """
UPDATE inbound_events SET extraction = $2, canonical_email = COALESCE($3, canonical_email),
    updated_at = now()
WHERE event_id = $1
"""

RECORD_RESOLVED_CRM_ID = """
UPDATE contacts SET crm_record_id = $2, updated_at = now()
FROM operations o
WHERE o.op_key = $1 AND o.action = 'crm-upsert' AND contacts.contact_id = o.external_ref::uuid
"""

RECORD_RESOLVED_SEND = """
UPDATE followup_intents SET status = 'sent', provider_message_id = $2,
    sent_at = COALESCE(sent_at, now()), lease_owner = NULL, lease_until = NULL
FROM operations o
WHERE o.op_key = $1 AND o.action = 'send' AND followup_intents.intent_id = o.external_ref::uuid
"""

APPROVE_INTENT = """
UPDATE followup_intents SET status = 'queued', approved_by = $2
WHERE intent_id = $1::uuid AND status = 'awaiting_approval'
"""

# Fields a reviewer may correct on approve, and where they live in the extraction record.
CORRECTABLE = {"sender_email": "sender_email", "name": "contact_name", "company": "company"}


class ReviewActivities:
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

    @activity.defn(name="resolve_operation")
    async def resolve_operation(self, resolve: ResolveInput) -> None:
        """A reviewer confirms a prior side effect exists (e.g. gives the CRM record ID)."""
        item = resolve.item
        async with self._pool.acquire() as conn, conn.transaction():
            await ledger.complete(conn, resolve.op_key, resolve.evidence, resolve.evidence)
            # A resolved CRM upsert names the contact's record: later steps (the note) use it;
            # a resolved send names the provider's message: the intent is sent, not sending.
            await conn.execute(RECORD_RESOLVED_CRM_ID, resolve.op_key, resolve.evidence)
            await conn.execute(RECORD_RESOLVED_SEND, resolve.op_key, resolve.evidence)
            await store.audit(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=resolve.reviewer, action="operation_resolved",
                detail={"op_key": resolve.op_key, "evidence": resolve.evidence},
            )

    @activity.defn(name="grant_operation_retry")
    async def grant_operation_retry(self, grant: RetryGrant) -> None:
        item = grant.item
        async with self._pool.acquire() as conn, conn.transaction():
            await ledger.extend_attempt_budget(conn, grant.op_key, grant.budget)
            await store.audit(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=grant.reviewer, action="operation_retry_granted",
                detail={"op_key": grant.op_key, "budget": grant.budget},
            )

    @activity.defn(name="apply_review_corrections")
    async def apply_review_corrections(self, correction: CorrectionInput) -> list[str]:
        """Apply a reviewer's corrected fields to the stored extraction. Returns the names of
        the fields that were rejected (unknown field or an invalid address)."""
        item = correction.item
        policy = get_policy(item.tenant)
        rejected: list[str] = []
        async with self._pool.acquire() as conn, conn.transaction():
            record: dict[str, Any] = dict(
                await conn.fetchval(LOAD_EXTRACTION, item.event_id) or {}
            )
            identity: str | None = None
            for name, value in correction.corrections.items():
                target = CORRECTABLE.get(name)
                if target is None:
                    rejected.append(name)
                    continue
                if target == "sender_email":
                    try:
                        identity = canonical_email(value, policy)
                    except InvalidAddress:
                        rejected.append(name)
                        continue
                record[target] = {"value": value, "confidence": 1.0,
                                  "evidence": f"reviewer:{correction.reviewer}"}
            await conn.execute(STORE_CORRECTION, item.event_id, record, identity)
            await store.audit(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=correction.reviewer, action="review_corrections_applied",
                detail={"fields": sorted(set(correction.corrections) - set(rejected)),
                        "rejected": rejected},
            )
        return rejected

    @activity.defn(name="approve_followup_intent")
    async def approve_followup_intent(self, approval: IntentApproval) -> None:
        item = approval.item
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(APPROVE_INTENT, approval.intent_id, approval.reviewer)
            await store.audit(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=approval.reviewer, action="followup_approved",
                detail={"intent_id": approval.intent_id},
            )
