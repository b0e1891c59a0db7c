"""match_and_plan: ONE PostgreSQL transaction that decides who this is and what to do.

Contact upsert, match decision, follow-up intent and the outbox rows commit together or not
at all. Concurrent events for the same identity serialise on the contact row: the upsert's
`ON CONFLICT DO UPDATE` holds that row's lock until commit, so the quiet-period check of
the second transaction sees the first one's intent. Re-running the activity after a crash
is safe: every insert is `ON CONFLICT DO NOTHING` on the keys of docs/architecture.md §2.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.counters import count
from activities.failures import missing_row
from activities.heartbeat import heartbeating
from activities.step_attempts import StepAttempt, counted_attempt
from inboxcrm.adapters.errors import ErrorType
from inboxcrm.domain import planning
from inboxcrm.domain.policy import TenantPolicy, get_policy
from inboxcrm.store import audit, contacts, events, intents, matches, ramp
from inboxcrm.store.suppression import SendInFlight, suppress_identity
from schemas.models import Action, ItemState, PlanInput, PlanResult, operation_key

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

# The planning step's name in `step_attempts`.
PLAN_STEP = "plan"


def _value(extraction: dict[str, Any], name: str) -> str | None:
    field = extraction.get(name) or {}
    value = field.get("value")
    return value.strip() if isinstance(value, str) and value.strip() else None


class MatchActivities:
    def __init__(self, pool: asyncpg.Pool, crm_max_attempts: int, send_max_attempts: int) -> None:
        self._pool = pool
        self._crm_max_attempts = crm_max_attempts
        self._send_max_attempts = send_max_attempts

    @activity.defn(name="match_and_plan")
    async def match_and_plan(self, plan: PlanInput) -> PlanResult:
        item = plan.item
        policy = get_policy(item.tenant)
        try:
            async with heartbeating(), counted_attempt(self._pool, item, PLAN_STEP) as attempt:
                return await self._plan(plan, policy, attempt)
        except SendInFlight as busy:
            # An opt-out waits for a follow-up already on the wire (see suppression.py).
            raise ApplicationError(
                "send in flight for this identity", type=ErrorType.TRANSIENT.value,
                next_retry_delay=timedelta(seconds=min(busy.retry_after, 5.0))) from None

    async def _plan(self, plan: PlanInput, policy: TenantPolicy,
                    attempt: StepAttempt) -> PlanResult:
        item = plan.item
        async with self._pool.acquire() as conn, conn.transaction():
            event = await conn.fetchrow(events.START_MATCHING, item.event_id, ItemState.MATCHING)
            if event is None:
                raise missing_row("event")
            extraction: dict[str, Any] = event["extraction"] or {}
            identity: str | None = event["canonical_email"]
            tx = _Planner(conn, plan, policy, extraction, self._crm_max_attempts,
                          self._send_max_attempts, _ramp_cap(policy, event["live_for_seconds"]),
                          attempt)
            if identity is None:
                return await tx.without_identity()
            if event["route"] == "opt_out":
                return await tx.record_opt_out(identity)
            return await tx.plan_contact(identity)


class _Planner:
    """The steps of one match_and_plan transaction."""

    def __init__(
        self, conn: Conn, plan: PlanInput, policy: TenantPolicy, extraction: dict[str, Any],
        crm_max_attempts: int, send_max_attempts: int, ramp_per_hour: int | None,
        attempt: StepAttempt,
    ) -> None:
        self.conn = conn
        self.item = plan.item
        self.approved_by = plan.approved_by
        self.policy = policy
        self.extraction = extraction
        self.crm_max_attempts = crm_max_attempts
        self.send_max_attempts = send_max_attempts
        # A first live run's hourly cap of automatic follow-ups; None: no ramp now.
        self.ramp_per_hour = ramp_per_hour
        # The step's attempt count, cleared by the planned follow-up's statement.
        self.attempt = attempt

    async def audit(self, action: str, detail: dict[str, Any], contact_id: Any = None) -> None:
        await audit.append(
            self.conn, tenant=self.item.tenant, event_id=self.item.event_id,
            workflow_id=self.item.workflow_id, contact_id=contact_id, actor="planner",
            action=action, detail=detail,
        )

    async def needs_review(
        self, reason: str, *, decision: str, candidates: list[str] | None = None,
        contact_id: Any = None,
    ) -> PlanResult:
        await self.conn.execute(
            matches.RECORD_MATCH_DECISION, self.item.event_id, self.item.tenant, decision,
            f"review:{reason}", contact_id, candidates or [],
        )
        await self.audit("match_needs_review", {"reason": reason, "decision": decision,
                                                "candidates": candidates or []}, contact_id)
        return PlanResult(outcome="review", reason=reason, candidates=len(candidates or []))

    async def without_identity(self) -> PlanResult:
        """No trusted address: a matching name is a *candidate* for a person to confirm,
        never a merge. Either way a reviewer must supply or confirm the identity."""
        name = _value(self.extraction, "contact_name")
        rows = await self.conn.fetch(contacts.FIND_NAME_CANDIDATES, self.item.tenant,
                                     name) if name else []
        if rows:
            return await self.needs_review("candidates", decision="candidates",
                                           candidates=[str(r["contact_id"]) for r in rows])
        return await self.needs_review("no_identity", decision="no_identity")

    async def record_opt_out(self, identity: str) -> PlanResult:
        """Suppression and cancellation of every queued intent for the identity, together."""
        suppression = await suppress_identity(
            self.conn, self.item.tenant, identity, reason="opt_out_request",
            source=f"event:{self.item.event_id}", cancel_reason="opt_out")
        contact_id = await self.conn.fetchval(contacts.FIND_CONTACT, self.item.tenant, identity)
        await self.conn.execute(
            matches.RECORD_MATCH_DECISION, self.item.event_id, self.item.tenant,
            "existing_contact" if contact_id else "no_contact", "opt_out", contact_id, [],
        )
        await self.audit("suppression_recorded", {
            "reason": "opt_out_request",
            "cancelled_intents": suppression.cancelled_intents,
        }, contact_id)
        return PlanResult(outcome="opted_out", reason="opt_out_recorded",
                          contact_id=str(contact_id) if contact_id else None)

    async def plan_contact(self, identity: str) -> PlanResult:
        name = _value(self.extraction, "contact_name")
        company = _value(self.extraction, "company")
        email_as_written = _value(self.extraction, "sender_email") or identity
        contact = await self.conn.fetchrow(
            contacts.UPSERT_CONTACT, self.item.tenant, identity, email_as_written, name, company
        )
        if contact is None:  # an upsert always returns its row; a missing one is a bug
            raise missing_row("contact")
        contact_id = contact["contact_id"]
        crm_key = operation_key(self.item.workflow_id, Action.CRM_UPSERT)
        note_key = operation_key(self.item.workflow_id, Action.CRM_NOTE)
        earlier = await self.conn.fetchrow(matches.EARLIER_PLAN, self.item.event_id, contact_id)
        if earlier is None:  # one row always (a LEFT JOIN of a constant)
            raise missing_row("earlier_plan")
        if earlier["decision"] is not None:
            # A re-run of a plan that matched already: the contact this run sees was made by
            # that run; its decision and operations stand.
            inserted = earlier["decision"] == "new_contact"
        else:
            inserted = bool(contact["inserted"])
            if not inserted:
                existing = planning.ExistingContact(contact["name"], contact["company"],
                                                    contact["status"])
                conflict = planning.conflicting_field(self.policy, existing, name, company)
                if conflict and self.approved_by is None:
                    return await self.needs_review(
                        f"field_conflict:{conflict}", decision="existing_contact",
                        contact_id=contact_id,
                    )
                await self._fill_fields(contact_id, existing, name, company)
            decision = "new_contact" if inserted else "existing_contact"
            await self.conn.execute(
                matches.RECORD_CONTACT_MATCH, self.item.event_id, self.item.tenant, decision,
                "exact_canonical_email", contact_id, [], self.item.workflow_id,
                audit.json_safe({"decision": decision, "rule": "exact_canonical_email",
                                 "approved_by": self.approved_by}),
                crm_key, Action.CRM_UPSERT.value, self.crm_max_attempts,
                note_key, Action.CRM_NOTE.value,
            )
        result = PlanResult(outcome="planned", contact_id=str(contact_id), crm_op_key=crm_key,
                            note_op_key=note_key)
        return await self._plan_followup(result, contact_id, identity, inserted,
                                         contact["status"], earlier)

    async def _fill_fields(self, contact_id: Any, existing: planning.ExistingContact,
                           name: str | None, company: str | None) -> None:
        fill = planning.fields_to_fill(self.policy, existing, name, company)
        if fill:
            await self.conn.execute(contacts.FILL_CONTACT_FIELDS, contact_id, fill.get("name"),
                                    fill.get("company"))
            await self.audit("contact_updated", {"fields": list(fill)}, contact_id)

    async def _plan_followup(
        self, result: PlanResult, contact_id: Any, identity: str, new_contact: bool,
        contact_status: str, earlier: asyncpg.Record,
    ) -> PlanResult:
        send_key = operation_key(self.item.workflow_id, Action.SEND)
        if earlier["intent_id"] is not None:
            # Decided before: that decision stands, whatever changed since (an opt-out, the
            # quiet period). The send step re-checks eligibility, and it alone knows whether
            # an earlier attempt may have gone out (then the item is held, not suppressed).
            intent_id = str(earlier["intent_id"])
            await self.audit("followup_plan_reused", {"intent_id": intent_id,
                                                      "status": earlier["intent_status"]},
                             contact_id)
            result.send_op_key = send_key
            result.intent_id = intent_id
            result.intent_needs_approval = earlier["intent_status"] == "awaiting_approval"
            result.approval_reason = earlier["approval_reason"]
            return result
        rule = planning.followup_rule(self.policy, self.extraction.get("intent"))
        facts = None
        if rule is not None and planning.needs_blockers(contact_status):
            facts = planning.FollowupFacts(*await intents.followup_blockers(
                self.conn, tenant=self.item.tenant, canonical_email=identity,
                contact_id=contact_id, event_id=self.item.event_id,
                quiet_period_hours=rule.quiet_period_hours))
        decision = planning.decide_followup(rule, new_contact=new_contact,
                                            contact_status=contact_status, facts=facts)
        if decision.outcome == "no_rule":
            await self.audit("followup_not_planned", {"reason": "no_rule_for_intent"}, contact_id)
            return result
        assert rule is not None
        if decision.outcome == "suppressed":
            await self.audit("followup_not_planned", {"reason": "suppressed"}, contact_id)
            result.reason = "suppressed"
            return result
        if decision.outcome == "quiet_period":
            await self.audit("followup_not_planned", {"reason": "quiet_period",
                                                      "rule_id": rule.rule_id}, contact_id)
            result.reason = "quiet_period"
            return result
        needs_approval = decision.outcome == "awaiting_approval"
        approval_reason: str | None = None
        if not needs_approval and self.ramp_per_hour is not None:
            # Inside this transaction: a plan that rolls back gives its slot back.
            granted = await ramp.take_slot(self.conn, self.item.tenant, self.ramp_per_hour)
            count("inboxcrm_ramp_followups",
                  "Automatic follow-ups during a first live run: granted, or held for a "
                  "reviewer (ramp_limit)", outcome="granted" if granted else "held")
            if not granted:
                needs_approval, approval_reason = True, "ramp_limit"
        # The words are part of the plan: the rule's version derives from its template's, and
        # the template at this version is stored with the intent (docs/architecture.md §5).
        template = self.policy.template_for(rule)
        version = self.policy.rule_version(rule)
        intent = await self.conn.fetchrow(
            intents.PLAN_FOLLOWUP, self.item.event_id, self.item.tenant, contact_id,
            rule.rule_id, version, template.ref,
            "awaiting_approval" if needs_approval else "queued", needs_approval,
            approval_reason, template.sources(), send_key, self.item.workflow_id,
            Action.SEND.value, self.send_max_attempts,
            audit.json_safe({"rule_id": rule.rule_id, "rule_version": version,
                             "template": template.ref}),
            PLAN_STEP,
        )
        if intent is None:
            raise missing_row("followup_intent")
        self.attempt.cleared()
        intent_id = str(intent["intent_id"])
        result.send_op_key = send_key
        result.intent_id = intent_id
        result.intent_needs_approval = intent["status"] == "awaiting_approval"
        result.approval_reason = intent["approval_reason"]
        return result


def _ramp_cap(policy: TenantPolicy, live_for_seconds: float | None) -> int | None:
    """The hourly cap of automatic follow-ups while the tenant's ramp runs: for the policy's
    `ramp.days` after an operator switched it to live (docs/architecture.md §6)."""
    if policy.ramp is None or live_for_seconds is None:
        return None
    if float(live_for_seconds) >= policy.ramp.days * 86_400:
        return None
    return policy.ramp.max_auto_followups_per_hour
