"""match_and_plan: ONE PostgreSQL transaction that decides who this is and what to do:
gather the facts (`_gather`), decide (`inboxcrm.domain.planning.plan`, the function the
review card and shadow mode call too), write the plan (`_Writer`).

Contact upsert, match decision, follow-up intent and the outbox rows commit together or not
at all. Concurrent events for the same identity serialise on the contact row: the upsert's
`ON CONFLICT DO UPDATE` holds that row's lock until commit, so the quiet-period check of
the second transaction sees the first one's intent. Re-running the activity after a crash
is safe: every insert is `ON CONFLICT DO NOTHING` on the keys of docs/architecture.md §2.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
from temporalio import activity
from temporalio.exceptions import ApplicationError

from inboxcrm.activities.counters import count
from inboxcrm.activities.failures import missing_row
from inboxcrm.activities.heartbeat import heartbeating
from inboxcrm.activities.step_attempts import StepAttempt, counted_attempt
from inboxcrm.adapters.errors import ErrorType
from inboxcrm.domain import planning
from inboxcrm.domain.policy import TenantPolicy, get_policy
from inboxcrm.schemas.models import Action, ItemState, PlanInput, PlanResult, operation_key
from inboxcrm.store import audit, contact_links, contacts, events, intents, ledger, matches
from inboxcrm.store.suppression import SendInFlight, lock_identity, suppress_identity

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

# The planning step's name in `step_attempts`.
PLAN_STEP = "plan"


class MatchActivities:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

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
        """Gather the facts, decide (`planning.plan`), write the plan: one transaction, so
        the facts are read under the locks the write relies on."""
        async with self._pool.acquire() as conn, conn.transaction():
            gathered = await _gather(conn, plan, policy)
            decided = planning.plan(gathered.facts)
            writer = _Writer(conn, plan, policy, gathered, attempt)
            return await writer.write(decided)


@dataclass(frozen=True)
class _Gathered:
    """The facts `planning.plan` decides on, and the references the write needs."""

    facts: planning.Facts
    contact_id: Any = None
    thread: Any = None      # `intents.THREAD_OF_EVENT`'s row, for the audit


async def _gather(conn: Conn, plan: PlanInput, policy: TenantPolicy) -> _Gathered:
    """The reads of one plan, in lock order: the event row (START_MATCHING; it serialises a
    re-run with a zombie), then the identity's contact row (the upsert's ON CONFLICT, or an
    opt-out's FOR UPDATE), then, under both, what the store says (PLAN_FACTS)."""
    item = plan.item
    event = await events.start_matching(conn, event_id=item.event_id,
                                        state=ItemState.MATCHING)
    if event is None:
        raise missing_row("event")
    extraction: dict[str, Any] = event["extraction"] or {}
    identity: str | None = event["canonical_email"]
    if identity is not None:
        # A linked second address (`inboxcrm contact link`, migration 077) is its contact's.
        identity = await contact_links.linked_identity(
            conn, tenant=item.tenant, canonical_email=identity) or identity
    base = planning.Facts(policy=policy, route=str(event["route"]), identity=identity,
                          extraction=extraction, approved=plan.approved_by is not None)
    if identity is None:
        name = planning.value(extraction, "contact_name")
        found = (await contacts.find_name_candidates(conn, tenant=item.tenant, name=name)
                 if name else [])
        return _Gathered(replace(base, name_candidates=tuple(found)))
    if event["route"] == "opt_out":
        contact_id = await lock_identity(conn, tenant=item.tenant, canonical_email=identity)
        contact = planning.ExistingContact(None, None) if contact_id else None
        return _Gathered(replace(base, contact=contact), contact_id)
    row = await contacts.upsert_contact(
        conn, tenant=item.tenant, canonical_email=identity,
        email=planning.value(extraction, "sender_email") or identity,
        name=planning.value(extraction, "contact_name"),
        company=planning.value(extraction, "company"))
    if row is None:  # an upsert always returns its row; a missing one is a bug
        raise missing_row("contact")
    asked = planning.questions(policy, extraction, event["live_for_seconds"])
    known = await matches.plan_facts(
        conn, event_id=item.event_id, contact_id=row["contact_id"], tenant=item.tenant,
        canonical_email=identity, quiet_period_hours=asked.quiet_period_hours,
        ramp_cap=asked.ramp_cap)
    earlier = planning.EarlierPlan(
        decision=known["decision"],
        intent_id=str(known["intent_id"]) if known["intent_id"] is not None else None,
        intent_status=known["intent_status"], approval_reason=known["approval_reason"])
    ramp = (planning.RampFacts(asked.ramp_cap, int(known["ramp_granted"]))
            if asked.ramp_cap is not None and known["ramp_granted"] is not None else None)
    contact = (None if row["inserted"] else
               planning.ExistingContact(row["name"], row["company"], row["status"],
                                        bool(row["in_crm"])))
    if contact is None and known["decision"] is not None:
        # A re-run: the contact this run sees was made by the earlier one.
        contact = planning.ExistingContact(row["name"], row["company"], row["status"],
                                           bool(row["in_crm"]))
    # A reply in a thread we know (migration 073) is the conversation going on.
    thread = await intents.thread_of_event(conn, event_id=item.event_id)
    facts = replace(base, contact=contact, earlier=earlier, ramp=ramp,
                    followup=planning.FollowupFacts(
                        bool(known["suppressed"]), bool(known["recent"]),
                        bool(known["marketing_suppressed"])),
                    thread=str(thread["event_id"]) if thread is not None else None)
    return _Gathered(facts, row["contact_id"], thread)


class _Writer:
    """What one plan writes, in its transaction: nothing here decides."""

    def __init__(
        self, conn: Conn, plan: PlanInput, policy: TenantPolicy, gathered: _Gathered,
        attempt: StepAttempt,
    ) -> None:
        self.conn = conn
        self.item = plan.item
        self.approved_by = plan.approved_by
        self.policy = policy
        self.gathered = gathered
        self.contact_id = gathered.contact_id
        # The tenant's retry settings (policy `retries`): the ledger's budgets, carried in
        # the plan for the workflow's retry policies.
        self.crm_retry = policy.retries.crm.step_retry()
        # The step's attempt count, cleared by the planned follow-up's statement.
        self.attempt = attempt

    async def audit(self, action: str, detail: dict[str, Any]) -> None:
        await audit.append(
            self.conn, tenant=self.item.tenant, event_id=self.item.event_id,
            workflow_id=self.item.workflow_id, contact_id=self.contact_id, actor="planner",
            action=action, detail=detail,
        )

    async def write(self, decided: planning.Plan) -> PlanResult:
        if decided.outcome == "review":
            return await self._needs_review(decided)
        if decided.outcome == "opted_out":
            return await self._opt_out(decided)
        return await self._planned(decided)

    async def _needs_review(self, decided: planning.Plan) -> PlanResult:
        assert decided.match is not None and decided.reason is not None
        candidates = list(decided.candidates)
        await matches.record_match_decision(
            self.conn, event_id=self.item.event_id, tenant=self.item.tenant,
            decision=decided.match, rule=f"review:{decided.reason}", contact_id=self.contact_id,
            candidates=candidates)
        await self.audit("match_needs_review", {"reason": decided.reason,
                                                "decision": decided.match,
                                                "candidates": candidates})
        return PlanResult(outcome="review", reason=decided.reason, candidates=len(candidates))

    async def _opt_out(self, decided: planning.Plan) -> PlanResult:
        """Suppression and cancellation of every queued intent for the identity, together
        (the contact row is locked already: `_gather`)."""
        identity = self.gathered.facts.identity
        assert identity is not None and decided.match is not None
        policy = self.gathered.facts.policy
        suppression = await suppress_identity(
            self.conn, self.item.tenant, identity, reason="opt_out_request",
            source=f"event:{self.item.event_id}", cancel_reason="opt_out", locked=True,
            scope=policy.suppression_scope("opt_out_request"),
            marketing_rules=policy.marketing_rule_ids())
        await matches.record_match_decision(
            self.conn, event_id=self.item.event_id, tenant=self.item.tenant,
            decision=decided.match, rule="opt_out", contact_id=self.contact_id, candidates=[])
        await self.audit("suppression_recorded", {
            "reason": "opt_out_request",
            "cancelled_intents": suppression.cancelled_intents,
            "scope": suppression.scope, "crm_write": suppression.crm_write,
        })
        return PlanResult(outcome="opted_out", reason=decided.reason,
                          contact_id=str(self.contact_id) if self.contact_id else None)

    async def _planned(self, decided: planning.Plan) -> PlanResult:
        crm_key = operation_key(self.item.workflow_id, Action.CRM_UPSERT)
        note_key = operation_key(self.item.workflow_id, Action.CRM_NOTE)
        if decided.fill:
            await contacts.fill_contact_fields(
                self.conn, contact_id=self.contact_id, name=decided.fill.get("name"),
                company=decided.fill.get("company"))
            await self.audit("contact_updated", {"fields": list(decided.fill)})
        if decided.match is not None:
            await matches.record_contact_match(
                self.conn, event_id=self.item.event_id, tenant=self.item.tenant,
                decision=decided.match, rule="exact_canonical_email",
                contact_id=self.contact_id, workflow_id=self.item.workflow_id,
                audit_detail=audit.json_safe({"decision": decided.match,
                                              "rule": "exact_canonical_email",
                                              "approved_by": self.approved_by}),
                crm_op_key=crm_key, crm_action=Action.CRM_UPSERT.value,
                max_attempts=self.crm_retry.max_attempts, note_op_key=note_key,
                note_action=Action.CRM_NOTE.value)
        result = PlanResult(outcome="planned", contact_id=str(self.contact_id),
                            crm_op_key=crm_key, note_op_key=note_key, crm_retry=self.crm_retry)
        # The inbound email as the CRM's email activity: its own operation and key.
        result.email_op_key = await self._operation(Action.CRM_EMAIL, self.item.event_id)
        assert decided.followup is not None
        result = await self._followup(result, decided.followup)
        if result.send_op_key and result.intent_id:
            # The follow-up, logged in the CRM once it is sent.
            result.sent_op_key = await self._operation(Action.CRM_SENT, result.intent_id)
        return result

    async def _operation(self, action: Action, external_ref: str) -> str:
        key = operation_key(self.item.workflow_id, action)
        await ledger.plan_operation(
            self.conn, op_key=key, workflow_id=self.item.workflow_id,
            event_id=self.item.event_id, action=action.value,
            max_attempts=self.crm_retry.max_attempts, external_ref=external_ref)
        return key

    async def _followup(self, result: PlanResult,
                        decision: planning.FollowupDecision) -> PlanResult:
        send_key = operation_key(self.item.workflow_id, Action.SEND)
        if decision.outcome == "reused":
            earlier = self.gathered.facts.earlier
            assert earlier is not None and earlier.intent_id is not None
            await self.audit("followup_plan_reused", {"intent_id": earlier.intent_id,
                                                      "status": earlier.intent_status})
            result.send_op_key = send_key
            result.intent_id = earlier.intent_id
            result.intent_needs_approval = earlier.intent_status == "awaiting_approval"
            result.approval_reason = earlier.approval_reason
            return result
        if decision.outcome == "thread_reply":
            thread = self.gathered.thread
            await self.audit("followup_not_planned", {
                "reason": "thread_reply", "thread_event_id": str(thread["event_id"]),
                "answers": thread["via"],
                "thread_contact_id": (str(thread["contact_id"]) if thread["contact_id"]
                                      else None)})
            result.reason = "thread_reply"
            return result
        if decision.outcome == "no_rule":
            await self.audit("followup_not_planned", {"reason": "no_rule_for_intent"})
            return result
        rule = decision.rule
        assert rule is not None
        if decision.outcome == "suppressed":
            await self.audit("followup_not_planned", {"reason": "suppressed"})
            result.reason = "suppressed"
            return result
        if decision.outcome == "quiet_period":
            await self.audit("followup_not_planned", {"reason": "quiet_period",
                                                      "rule_id": rule.rule_id})
            result.reason = "quiet_period"
            return result
        if decision.ramp is not None:
            count("inboxcrm_ramp_followups",
                  "Automatic follow-ups during a first live run: granted, or held for a "
                  "reviewer (ramp_limit)", outcome=decision.ramp)
        # The words are part of the plan: the rule's version derives from its template's, and
        # the template at this version is stored with the intent (docs/architecture.md §5).
        template = self.policy.template_for(rule)
        version = self.policy.rule_version(rule)
        send_retry = self.policy.send_retry(rule)
        intent = await intents.plan_followup(
            self.conn, event_id=self.item.event_id, tenant=self.item.tenant,
            contact_id=self.contact_id, rule_id=rule.rule_id, rule_version=version,
            template_ref=template.ref, status=decision.outcome,
            needs_approval=decision.needs_approval, approval_reason=decision.approval_reason,
            template_sources=template.sources(), send_op_key=send_key,
            workflow_id=self.item.workflow_id, action=Action.SEND.value,
            max_attempts=send_retry.max_attempts,
            audit_detail=audit.json_safe({"rule_id": rule.rule_id, "rule_version": version,
                                          "template": template.ref}),
            step=PLAN_STEP, ramp=decision.ramp)
        if intent is None:
            raise missing_row("followup_intent")
        self.attempt.cleared()
        result.send_op_key = send_key
        result.send_retry = send_retry
        result.intent_id = str(intent["intent_id"])
        result.intent_needs_approval = intent["status"] == "awaiting_approval"
        result.approval_reason = intent["approval_reason"]
        return result
