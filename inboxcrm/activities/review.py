"""Reviewer decisions applied to the store: a resolved side effect with its evidence, a
retry budget granted, corrected fields, an approved follow-up intent. Each writes its audit
entry in the same transaction. State mirroring is `inboxcrm/activities/bookkeeping.py`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg
from temporalio import activity

from inboxcrm.activities.failures import missing_row
from inboxcrm.domain.followup import RepeatFacts, send_again_refusal
from inboxcrm.domain.policy import (
    InvalidAddress,
    PolicyError,
    UnknownTenant,
    canonical_email,
    get_policy,
)
from inboxcrm.schemas.models import (
    CorrectionInput,
    IntentApproval,
    IntentDecline,
    OperationInput,
    OperationView,
    ResolveInput,
    RetryGrant,
    SendAgainInput,
    SendAgainResult,
    again_op_key,
)
from inboxcrm.store import audit, contacts, events, intents, ledger

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

# Fields a reviewer may correct on approve, and where they live in the extraction record.
CORRECTABLE = {"sender_email": "sender_email", "name": "contact_name", "company": "company"}


async def repeat_refusal(conn: Conn, op_key: str) -> str | None:
    """Why the follow-up behind send operation `op_key` may not be sent again now, or None
    (`domain.followup.send_again_refusal` over the store's facts and the rule's quiet
    period). Asked as the decision is recorded, so the person reads the reason at once."""
    row = await intents.send_again_facts(conn, op_key=op_key)
    if row is None:
        return send_again_refusal(None)
    purpose, quiet = "service", None
    try:
        rule = get_policy(row["tenant"]).rule_by_id(row["rule_id"])
    except (UnknownTenant, PolicyError):
        rule = None
    if rule is not None:
        purpose, quiet = rule.purpose, rule.quiet_period_hours
    suppressed, recent, marketing = await intents.followup_blockers(
        conn, tenant=row["tenant"], canonical_email=row["canonical_email"],
        contact_id=row["contact_id"], event_id=row["event_id"],
        quiet_period_hours=quiet if quiet is not None else 0)
    return send_again_refusal(RepeatFacts(
        status=str(row["status"]), contact_status=str(row["contact_status"]),
        suppressed=suppressed, marketing_suppressed=marketing,
        recent=recent and quiet is not None, purpose=purpose))


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

    @activity.defn(name="send_followup_again")
    async def send_followup_again(self, again: SendAgainInput) -> SendAgainResult:
        """A person's deliberate second send (docs/architecture.md §6, "Authority"): a new
        intent of the next generation, with its own UUID (the provider's idempotency key),
        its approval (who, when, why, which intent it repeats), its send operation and, where
        the first send is logged in the CRM, its log; audited as
        `followup_send_again_approved`. The intent it repeats is not touched. A re-run
        answers the intent it made (one per generation, one repeat per intent)."""
        item = again.item
        send_key = again_op_key(item.workflow_id, again.generation, "send")
        sent_key = (again_op_key(item.workflow_id, again.generation, "crm-sent")
                    if again.logs_sent else None)
        async with self._pool.acquire() as conn, conn.transaction():
            row = await intents.plan_send_again(
                conn, op_key=again.op_key, generation=again.generation,
                approved_by=again.reviewer, reason=again.reason[:2000], send_op_key=send_key,
                send_max_attempts=again.max_attempts, sent_op_key=sent_key,
                log_max_attempts=again.max_attempts, workflow_id=item.workflow_id)
        if row is None:
            raise missing_row("followup_intent")
        return SendAgainResult(intent_id=str(row["intent_id"]), send_op_key=send_key,
                               sent_op_key=sent_key)

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
                                         approved_by=approval.reviewer,
                                         draft_sha256=approval.draft_sha256)
            # An edited draft is audited by its hash only (the text is personal data).
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=approval.reviewer, action="followup_approved",
                detail={"intent_id": approval.intent_id,
                        "draft_sha256": approval.draft_sha256},
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
