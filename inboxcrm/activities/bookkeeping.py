"""Bookkeeping the workflow needs for people to see it: the item's state mirrored to
PostgreSQL, the review task it opens or closes, escalation marks, and audit entries. None
of it decides anything; reviewer decisions live in `inboxcrm/activities/review.py`."""

from __future__ import annotations

import logging
from datetime import datetime

import asyncpg
from temporalio import activity
from temporalio.api.enums.v1 import EventType

from inboxcrm.activities.review import repeat_refusal
from inboxcrm.domain import drafts
from inboxcrm.platform.config import get_settings
from inboxcrm.platform.reviewer_identity import (
    PATH_UI_SIGNAL,
    PATH_UI_UPDATE,
    DecisionClaim,
    verify_decision,
)
from inboxcrm.schemas.contract import Decision, authority_refusal, send_again_refusal
from inboxcrm.schemas.models import (
    REVIEW_STATES,
    TERMINAL_STATES,
    AuditEntry,
    DecisionIdentity,
    DecisionRecord,
    EscalationInput,
    ItemState,
    StateChange,
)
from inboxcrm.store import audit, events, intents, ledger, review_tasks, reviewers

log = logging.getLogger("inboxcrm.activities.bookkeeping")
DECISION_NAMES = frozenset(d.value for d in Decision)
# A reviewer's decision in the audit log: `<via>_<action>`, via a signal or an update.
DECISION_AUDIT = ("signal_", "update_")
PROOF_INVALID = ("refused (proof_invalid): this decision's proof does not match its body "
                 "(changed after it was signed, copied from another decision, or signed with "
                 "another INBOXCRM_DECISION_SECRET than the worker's); decide again at the "
                 "review desk (/review/ on the relay) or with `inboxcrm review`")
UNPROVEN = ("refused (unproven_decision): in production a decision must come through the "
            "review desk (/review/ on the relay) or `inboxcrm review`, which prove who "
            "decided; a signal or update from a Temporal client (the Temporal UI, `temporal "
            "workflow signal`) carries no proof. An operator whose Temporal authenticates and "
            "scopes its users may set INBOXCRM_TEMPORAL_AUTHORIZES_DECISIONS=true "
            "(docs/architecture.md §6)")


def proof_refusal(*, has_proof: bool, proven: bool, refuse_unproven: bool
                  ) -> tuple[str, str] | None:
    """Why the workflow must refuse a decision for its proof (code, message), or None: a
    proof that does not match, always; no proof, when unproven decisions are refused (in
    production, unless Temporal itself authorises decisions)."""
    if proven:
        return None
    if has_proof:
        return "proof_invalid", PROOF_INVALID
    if refuse_unproven:
        return "unproven_decision", UNPROVEN
    return None


class BookkeepingActivities:
    def __init__(self, pool: asyncpg.Pool, decision_secret: str | None = None, *,
                 refuse_unproven: bool = False) -> None:
        self._pool = pool
        self._decision_secret = decision_secret
        self._refuse_unproven = refuse_unproven

    @activity.defn(name="record_item_state")
    async def record_item_state(self, change: StateChange) -> None:
        """Mirror the workflow's state to PostgreSQL; open or close the review task."""
        item = change.item
        detail = {"state": change.state, "reason": change.reason,
                  "review_reason": change.review_reason, "owner": change.review_owner}
        if change.state not in REVIEW_STATES and change.state != ItemState.REJECTED:
            await review_tasks.settle(
                self._pool, event_id=item.event_id, state=change.state, reason=change.reason,
                workflow_id=item.workflow_id, tenant=item.tenant,
                detail=audit.json_safe(detail), end=change.state in TERMINAL_STATES)
            return
        async with self._pool.acquire() as conn, conn.transaction():
            await events.set_state(conn, item.event_id, change.state, change.reason)
            if change.state in REVIEW_STATES and change.review_reason:
                await review_tasks.open_review_task(
                    conn, event_id=item.event_id, workflow_id=item.workflow_id,
                    tenant=item.tenant, reason=change.review_reason,
                    owner=change.review_owner or "unassigned",
                    destination_ref=change.destination_ref,
                    escalation_seconds=float((change.escalation_hours or 24) * 3600),
                    wait_id=change.wait_id, allowed=change.allowed or [],
                    needs_sender=change.needs_sender,
                    escalate_at=(datetime.fromisoformat(change.escalate_at)
                                 if change.escalate_at else None),
                )
            elif change.state not in REVIEW_STATES:
                await review_tasks.close_review_tasks(conn, workflow_id=item.workflow_id,
                                                      resolution=change.state)
            if change.state == ItemState.REJECTED:
                # Nothing more is written or sent for a rejected item.
                await intents.cancel_event_intents(conn, event_id=item.event_id)
                await ledger.cancel_event_operations(conn, workflow_id=item.workflow_id)
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor="workflow", action="state_changed", detail=detail,
            )

    @activity.defn(name="record_audit")
    async def record_audit(self, entry: AuditEntry) -> None:
        item = entry.item
        async with self._pool.acquire() as conn:
            if entry.action.startswith(DECISION_AUDIT) and entry.detail.get("accepted"):
                await review_tasks.record_resolver(conn, workflow_id=item.workflow_id,
                                                   resolved_by=entry.actor)
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=entry.actor, action=entry.action, detail=dict(entry.detail),
            )

    @activity.defn(name="record_decision")
    async def record_decision(self, record: DecisionRecord) -> DecisionIdentity:
        """Record a decision under the decider authentication proves (docs/architecture.md
        §6). A valid proof (over the whole decision) names the desk's or the CLI's reviewer;
        anything else is recorded with the identity Temporal recorded for the request, and a
        proof that does not match, or no proof in production, is refused: the workflow
        refuses the decision on `DecisionIdentity.refused`. The typed
        name is kept as a label only."""
        item = record.item
        claim = DecisionClaim(
            decider=record.decider, path=record.path, workflow_id=item.workflow_id,
            wait_id=record.wait_id, action=record.action, reviewer=record.typed_reviewer,
            note=record.note, evidence=record.evidence, corrections=dict(record.corrections),
            send_followup=record.send_followup, draft_sha256=record.draft_sha256)
        proven = verify_decision(self._decision_secret, record.proof, claim)
        detail = dict(record.detail)
        detail["typed_reviewer"] = record.typed_reviewer or None
        refused = None
        if detail.get("accepted"):
            refused = proof_refusal(has_proof=bool(record.proof), proven=proven,
                                    refuse_unproven=self._refuse_unproven)
        if detail.get("accepted") and refused is None and record.required_role:
            # The authority to repeat a customer-facing action (docs/architecture.md §6): the
            # role of the reviewer the proof names, read now (a revoked or demoted reviewer
            # has none). The operator, an OIDC user and an unproven request have no role.
            role = await self._role_of(record.decider) if proven else None
            detail["decider_role"] = role
            if role != record.required_role:
                refused = "authority_required", authority_refusal(record.required_role,
                                                                  record.action)
        if (detail.get("accepted") and refused is None and record.action == Decision.SEND_AGAIN
                and record.op_key):
            # The follow-up must be one that may be sent again now (unconfirmed or sent, to
            # someone who may still be written to): the person reads why not at once.
            async with self._pool.acquire() as conn:
                code = await repeat_refusal(conn, record.op_key)
            if code is not None:
                refused = code, send_again_refusal(code)
        if (detail.get("accepted") and refused is None and record.draft_sha256
                and record.intent_id):
            # The approval binds an edited draft: the stored text must be the one hashed and
            # still within the rule's limits (docs/architecture.md §6, "Edited drafts").
            detail["draft_sha256"] = record.draft_sha256
            async with self._pool.acquire() as conn:
                checked = await drafts.approval_refusal(
                    conn, intent_id=record.intent_id, sha256=record.draft_sha256,
                    settings=get_settings())
            if checked is not None and checked.refused is not None:
                refused = checked.refused, checked.message
        if refused is not None:
            detail |= {"accepted": False, "ignored_reason": refused[0]}
        if proven:
            who = DecisionIdentity(record.decider, record.path, authenticated=True)
        else:
            identity, source = await self._temporal_identity(record)
            path = PATH_UI_SIGNAL if record.via == "signal" else PATH_UI_UPDATE
            who = DecisionIdentity(f"temporal:{identity or 'no identity'}", path)
            detail |= {"temporal_identity": identity, "identity_source": source,
                       "update_id": record.update_id, "signal_seq": record.signal_seq,
                       "proof": "invalid" if record.proof else None}
        detail |= {"path": who.path, "decider": who.decider, "authenticated": who.authenticated}
        # Audited under how it arrived: `update_approve` for an update (the desk, the CLI, the
        # UI's "Send an Update"), `signal_approve` for a signal.
        await self.record_audit(AuditEntry(item, who.decider, f"{record.via}_{record.action}",
                                           detail))
        if refused is not None:
            who.refused, who.refusal = refused
        return who

    async def _role_of(self, decider: str) -> str | None:
        """The current role of a personal-token reviewer (`reviewer:NAME`), else None."""
        kind, _, name = decider.partition(":")
        if kind != "reviewer" or not name:
            return None
        async with self._pool.acquire() as conn:
            return await reviewers.active_role(conn, name=name)

    async def _temporal_identity(self, record: DecisionRecord) -> tuple[str | None, str]:
        """The `identity` Temporal recorded for the request: a signal's is on its
        WorkflowExecutionSignaled event (the n-th decision signal of this run). An update's
        is on WorkflowExecutionUpdateAccepted, which is written only when the workflow task
        that took the decision completes (after this activity): it is looked up if present,
        otherwise the update ID is what finds it."""
        try:
            client = activity.client()
            handle = client.get_workflow_handle(record.item.workflow_id,
                                                run_id=record.run_id)
            seen = 0
            async for event in handle.fetch_history_events():
                if (record.signal_seq is not None and event.event_type
                        == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED):
                    attrs = event.workflow_execution_signaled_event_attributes
                    if attrs.signal_name in DECISION_NAMES:
                        seen += 1
                        if seen == record.signal_seq:
                            return attrs.identity or None, "signal event"
                if (record.update_id and event.event_type
                        == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED):
                    accepted = event.workflow_execution_update_accepted_event_attributes
                    meta = accepted.accepted_request.meta
                    if meta.update_id == record.update_id:
                        return meta.identity or None, "update event"
        except Exception as exc:  # noqa: BLE001 - the decision is recorded either way
            log.warning("request identity not found in history (%s)", type(exc).__name__)
            return None, "history unavailable"
        if record.update_id:
            return None, "update not yet in history (find it by update_id)"
        return None, "signal event not found"

    @activity.defn(name="mark_review_escalated")
    async def mark_review_escalated(self, escalation: EscalationInput) -> None:
        item = escalation.item
        async with self._pool.acquire() as conn, conn.transaction():
            await review_tasks.mark_escalated(conn, workflow_id=item.workflow_id)
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor="workflow", action="review_escalated", detail={"reason": escalation.reason},
            )
