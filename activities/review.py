"""Reviewer decisions applied to the store: a resolved side effect with its evidence, a
retry budget granted, corrected fields, an approved follow-up intent. Each writes its audit
entry in the same transaction. State mirroring is `activities/bookkeeping.py`."""

from __future__ import annotations

from typing import Any

import asyncpg
from temporalio import activity

from inboxcrm.domain.policy import InvalidAddress, canonical_email, get_policy
from inboxcrm.store import audit, contacts, events, intents, ledger
from schemas.models import (
    CorrectionInput,
    IntentApproval,
    IntentDecline,
    OperationInput,
    OperationView,
    ResolveInput,
    RetryGrant,
)

# Fields a reviewer may correct on approve, and where they live in the extraction record.
CORRECTABLE = {"sender_email": "sender_email", "name": "contact_name", "company": "company"}


class ReviewActivities:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @activity.defn(name="resolve_operation")
    async def resolve_operation(self, resolve: ResolveInput) -> None:
        """A reviewer confirms a prior side effect exists (e.g. gives the CRM record ID)."""
        item = resolve.item
        async with self._pool.acquire() as conn, conn.transaction():
            await ledger.complete(conn, resolve.op_key, resolve.evidence, resolve.evidence)
            # A resolved CRM upsert names the contact's record: later steps (the note) use it;
            # a resolved send names the provider's message: the intent is sent, not sending.
            await conn.execute(contacts.RECORD_RESOLVED_CRM_ID, resolve.op_key, resolve.evidence)
            await conn.execute(intents.RECORD_RESOLVED_SEND, resolve.op_key, resolve.evidence)
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=resolve.reviewer, action="operation_resolved",
                detail={"op_key": resolve.op_key, "evidence": resolve.evidence},
            )

    @activity.defn(name="grant_operation_retry")
    async def grant_operation_retry(self, grant: RetryGrant) -> None:
        """A fresh budget on the same key. Answering an ambiguous (unconfirmed) outcome, a
        retry means "I checked: it did not happen": the next attempt sends again with the same
        key / Message-ID, and this entry records who took that decision."""
        item = grant.item
        async with self._pool.acquire() as conn, conn.transaction():
            granted = await ledger.extend_attempt_budget(conn, grant.op_key, grant.budget)
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=grant.reviewer, action="operation_retry_granted",
                detail={"op_key": grant.op_key, "budget": grant.budget,
                        "previous_status": granted.previous_status,
                        "checked_not_sent": granted.checked_not_sent},
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
                await conn.fetchval(events.LOAD_EXTRACTION, item.event_id) or {}
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
                # An authenticated decider already says what it is (reviewer:…, oidc:…).
                who = correction.reviewer
                record[target] = {"value": value, "confidence": 1.0,
                                  "evidence": who if ":" in who else f"reviewer:{who}"}
            await conn.execute(events.STORE_CORRECTION, item.event_id, record, identity)
            await audit.append(
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
            await conn.execute(intents.APPROVE_INTENT, approval.intent_id, approval.reviewer)
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=approval.reviewer, action="followup_approved",
                detail={"intent_id": approval.intent_id},
            )

    @activity.defn(name="decline_followup_intent")
    async def decline_followup_intent(self, decline: IntentDecline) -> None:
        item = decline.item
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(intents.DECLINE_INTENT, decline.intent_id, decline.op_key)
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=decline.reviewer, action="followup_declined",
                detail={"intent_id": decline.intent_id},
            )

    @activity.defn(name="describe_operation")
    async def describe_operation(self, op: OperationInput) -> OperationView:
        """Read only: the ledger's attempts and error label, for the UI's current details."""
        row = await self._pool.fetchrow(ledger.OPERATION_VIEW, op.op_key)
        if row is None:
            return OperationView()
        return OperationView(row["attempts"], row["max_attempts"], row["last_error"])
