"""Reviewer decisions applied to the store: a resolved side effect with its evidence, a
retry budget granted, corrected fields, an approved follow-up intent. Each writes its audit
entry in the same transaction. State mirroring is `inboxcrm/activities/bookkeeping.py`."""

from __future__ import annotations

from typing import Any

import asyncpg
from temporalio import activity

from inboxcrm.domain.policy import InvalidAddress, canonical_email, get_policy
from inboxcrm.schemas.models import (
    CorrectionInput,
    IntentApproval,
    IntentDecline,
    OperationInput,
    OperationView,
    ResolveInput,
    RetryGrant,
)
from inboxcrm.store import audit, contacts, events, intents, ledger

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
            await contacts.record_resolved_crm_id(conn, op_key=resolve.op_key,
                                                  crm_record_id=resolve.evidence)
            await intents.record_resolved_send(conn, op_key=resolve.op_key,
                                               provider_message_id=resolve.evidence)
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
                await events.load_extraction_for_update(conn, event_id=item.event_id) or {}
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
            await events.store_correction(conn, event_id=item.event_id, extraction=record,
                                          canonical_email=identity)
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
            await intents.approve_intent(conn, intent_id=approval.intent_id,
                                         approved_by=approval.reviewer)
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=approval.reviewer, action="followup_approved",
                detail={"intent_id": approval.intent_id},
            )

    @activity.defn(name="decline_followup_intent")
    async def decline_followup_intent(self, decline: IntentDecline) -> None:
        item = decline.item
        async with self._pool.acquire() as conn, conn.transaction():
            await intents.decline_intent(conn, intent_id=decline.intent_id,
                                         send_op_key=decline.op_key)
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=decline.reviewer, action="followup_declined",
                detail={"intent_id": decline.intent_id},
            )

    @activity.defn(name="describe_operation")
    async def describe_operation(self, op: OperationInput) -> OperationView:
        """Read only: the ledger's attempts and error label, for the UI's current details."""
        row = await ledger.operation_view(self._pool, op_key=op.op_key)
        if row is None:
            return OperationView()
        return OperationView(row["attempts"], row["max_attempts"], row["last_error"])
