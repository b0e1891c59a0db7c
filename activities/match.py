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

from activities.failures import missing_row
from activities.heartbeat import heartbeating
from activities.step_attempts import counted_attempt
from inboxcrm.adapters.errors import ErrorType
from inboxcrm.domain.policy import TenantPolicy, get_policy
from inboxcrm.store import queries as store
from inboxcrm.store import templates as template_store
from inboxcrm.store.suppression import SendInFlight, suppress_identity
from schemas.models import Action, ItemState, PlanInput, PlanResult, operation_key

if TYPE_CHECKING:
    from inboxcrm.store.queries import Conn

# Loads the event and shows `matching`; the row lock serialises a re-run with a zombie.
START_MATCHING = """
UPDATE inbound_events SET state = $2, reason = NULL, updated_at = now()
WHERE event_id = $1
RETURNING event_id, tenant, extraction, route, route_reasons, canonical_email
"""

UPSERT_CONTACT = """
INSERT INTO contacts (tenant, canonical_email, email, name, company)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant, canonical_email) DO UPDATE SET updated_at = now()
RETURNING contact_id, name, company, status, (xmax = 0) AS inserted
"""

FIND_CONTACT = "SELECT contact_id FROM contacts WHERE tenant = $1 AND canonical_email = $2"

# What an earlier run of this event's plan decided, if one ran (a local activity's result
# dies with a killed worker, so a plan can run again after its follow-up went on the wire):
# its match to this contact by address, and the follow-up it created.
EARLIER_PLAN = """
SELECT m.decision, i.intent_id, i.status AS intent_status
FROM (SELECT 1) AS one
LEFT JOIN match_decisions m
       ON m.event_id = $1 AND m.contact_id = $2 AND m.rule = 'exact_canonical_email'
LEFT JOIN LATERAL (SELECT intent_id, status FROM followup_intents WHERE event_id = $1
                   ORDER BY created_at LIMIT 1) i ON true
"""

FIND_NAME_CANDIDATES = """
SELECT contact_id FROM contacts
WHERE tenant = $1 AND lower(name) = lower($2)
LIMIT 10
"""

FILL_CONTACT_FIELDS = """
UPDATE contacts SET name = COALESCE($2, name), company = COALESCE($3, company),
    updated_at = now()
WHERE contact_id = $1
"""

RECORD_MATCH_DECISION = """
INSERT INTO match_decisions (event_id, tenant, decision, rule, contact_id, candidates)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (event_id) DO UPDATE
SET decision = EXCLUDED.decision, rule = EXCLUDED.rule, contact_id = EXCLUDED.contact_id,
    candidates = EXCLUDED.candidates
"""

# An exact match, in one statement: the decision, the event's contact, the audit entry and
# the two CRM operations (upsert $9, note $12). Parameters as RECORD_MATCH_DECISION, then
# $7 workflow_id, $8 audit detail, $9/$10 upsert key/action, $11 max attempts,
# $12/$13 note key/action.
RECORD_CONTACT_MATCH = f"""
WITH decision AS ({RECORD_MATCH_DECISION.strip()}),
linked AS (UPDATE inbound_events SET contact_id = $5 WHERE event_id = $1),
audited AS (
    INSERT INTO audit_log (tenant, event_id, workflow_id, contact_id, actor, action, detail)
    VALUES ($2, $1, $7, $5, 'planner', 'contact_matched', $8)
)
INSERT INTO operations (op_key, workflow_id, event_id, action, max_attempts, external_ref)
VALUES ($9, $7, $1, $10, $11, $5::text), ($12, $7, $1, $13, $11, $1::text)
ON CONFLICT (op_key) DO NOTHING
"""

# What stops a follow-up for an active contact: a suppression of the identity, or another
# event's live intent for this contact, under any rule, within the rule's quiet period (one
# follow-up per contact per quiet period, as the README and policies/README.md promise).
FOLLOWUP_BLOCKERS = """
SELECT EXISTS (SELECT 1 FROM suppressions WHERE tenant = $1 AND canonical_email = $2)
           AS suppressed,
       EXISTS (SELECT 1 FROM followup_intents
               WHERE contact_id = $3 AND event_id <> $4
                 AND status <> 'cancelled'
                 AND created_at > now() - make_interval(secs => $5)) AS recent
"""

# The intent, inserted or (a re-run) the one already there. The second branch reads the
# statement's snapshot: a row a concurrent run committed meanwhile is not in it, which
# cannot happen while this transaction holds the event row (START_MATCHING).
CREATE_INTENT = """
WITH inserted AS (
    INSERT INTO followup_intents (event_id, tenant, contact_id, rule_id, rule_version,
                                  template_id, status, needs_approval)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
    ON CONFLICT (event_id, rule_id, rule_version) DO NOTHING
    RETURNING intent_id, status, needs_approval
)
SELECT intent_id, status, needs_approval FROM inserted
UNION ALL
SELECT intent_id, status, needs_approval FROM followup_intents
WHERE event_id = $1 AND rule_id = $4 AND rule_version = $5
  AND NOT EXISTS (SELECT 1 FROM inserted)
"""

# The send operation and its audit entry: $1 op key, $2 workflow_id, $3 event_id, $4 action,
# $5 max attempts, $6 intent ID, $7 tenant, $8 contact_id, $9 audit detail.
QUEUE_SEND = """
WITH queued AS (
    INSERT INTO operations (op_key, workflow_id, event_id, action, max_attempts, external_ref)
    VALUES ($1, $2, $3, $4, $5, $6)
    ON CONFLICT (op_key) DO NOTHING
)
INSERT INTO audit_log (tenant, event_id, workflow_id, contact_id, actor, action, detail)
VALUES ($7, $3, $2, $8, 'planner', 'intent_created', $9)
"""


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
            async with heartbeating(), counted_attempt(self._pool, item, "plan"):
                return await self._plan(plan, policy)
        except SendInFlight as busy:
            # An opt-out waits for a follow-up already on the wire (see suppression.py).
            raise ApplicationError(
                "send in flight for this identity", type=ErrorType.TRANSIENT.value,
                next_retry_delay=timedelta(seconds=min(busy.retry_after, 5.0))) from None

    async def _plan(self, plan: PlanInput, policy: TenantPolicy) -> PlanResult:
        item = plan.item
        async with self._pool.acquire() as conn, conn.transaction():
            event = await conn.fetchrow(START_MATCHING, item.event_id, ItemState.MATCHING)
            if event is None:
                raise missing_row("event")
            extraction: dict[str, Any] = event["extraction"] or {}
            identity: str | None = event["canonical_email"]
            tx = _Planner(conn, plan, policy, extraction, self._crm_max_attempts,
                          self._send_max_attempts)
            if identity is None:
                return await tx.without_identity()
            if event["route"] == "opt_out":
                return await tx.record_opt_out(identity)
            return await tx.plan_contact(identity)


class _Planner:
    """The steps of one match_and_plan transaction."""

    def __init__(
        self, conn: Conn, plan: PlanInput, policy: TenantPolicy, extraction: dict[str, Any],
        crm_max_attempts: int, send_max_attempts: int,
    ) -> None:
        self.conn = conn
        self.item = plan.item
        self.approved_by = plan.approved_by
        self.policy = policy
        self.extraction = extraction
        self.crm_max_attempts = crm_max_attempts
        self.send_max_attempts = send_max_attempts

    async def audit(self, action: str, detail: dict[str, Any], contact_id: Any = None) -> None:
        await store.audit(
            self.conn, tenant=self.item.tenant, event_id=self.item.event_id,
            workflow_id=self.item.workflow_id, contact_id=contact_id, actor="planner",
            action=action, detail=detail,
        )

    async def needs_review(
        self, reason: str, *, decision: str, candidates: list[str] | None = None,
        contact_id: Any = None,
    ) -> PlanResult:
        await self.conn.execute(
            RECORD_MATCH_DECISION, self.item.event_id, self.item.tenant, decision,
            f"review:{reason}", contact_id, candidates or [],
        )
        await self.audit("match_needs_review", {"reason": reason, "decision": decision,
                                                "candidates": candidates or []}, contact_id)
        return PlanResult(outcome="review", reason=reason, candidates=len(candidates or []))

    async def without_identity(self) -> PlanResult:
        """No trusted address: a matching name is a *candidate* for a person to confirm,
        never a merge. Either way a reviewer must supply or confirm the identity."""
        name = _value(self.extraction, "contact_name")
        rows = await self.conn.fetch(FIND_NAME_CANDIDATES, self.item.tenant, name) if name else []
        if rows:
            return await self.needs_review("candidates", decision="candidates",
                                           candidates=[str(r["contact_id"]) for r in rows])
        return await self.needs_review("no_identity", decision="no_identity")

    async def record_opt_out(self, identity: str) -> PlanResult:
        """Suppression and cancellation of every queued intent for the identity, together."""
        suppression = await suppress_identity(
            self.conn, self.item.tenant, identity, reason="opt_out_request",
            source=f"event:{self.item.event_id}", cancel_reason="opt_out")
        contact_id = await self.conn.fetchval(FIND_CONTACT, self.item.tenant, identity)
        await self.conn.execute(
            RECORD_MATCH_DECISION, self.item.event_id, self.item.tenant,
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
            UPSERT_CONTACT, self.item.tenant, identity, email_as_written, name, company
        )
        if contact is None:  # an upsert always returns its row; a missing one is a bug
            raise missing_row("contact")
        contact_id = contact["contact_id"]
        crm_key = operation_key(self.item.workflow_id, Action.CRM_UPSERT)
        note_key = operation_key(self.item.workflow_id, Action.CRM_NOTE)
        earlier = await self.conn.fetchrow(EARLIER_PLAN, self.item.event_id, contact_id)
        if earlier is None:  # one row always (a LEFT JOIN of a constant)
            raise missing_row("earlier_plan")
        if earlier["decision"] is not None:
            # A re-run of a plan that matched already: the contact this run sees was made by
            # that run; its decision and operations stand.
            inserted = earlier["decision"] == "new_contact"
        else:
            inserted = bool(contact["inserted"])
            if not inserted:
                conflict = self._conflicting_field(contact, name, company)
                if conflict and self.approved_by is None:
                    return await self.needs_review(
                        f"field_conflict:{conflict}", decision="existing_contact",
                        contact_id=contact_id,
                    )
                await self._fill_fields(contact, name, company)
            decision = "new_contact" if inserted else "existing_contact"
            await self.conn.execute(
                RECORD_CONTACT_MATCH, self.item.event_id, self.item.tenant, decision,
                "exact_canonical_email", contact_id, [], self.item.workflow_id,
                store.json_safe({"decision": decision, "rule": "exact_canonical_email",
                                 "approved_by": self.approved_by}),
                crm_key, Action.CRM_UPSERT.value, self.crm_max_attempts,
                note_key, Action.CRM_NOTE.value,
            )
        result = PlanResult(outcome="planned", contact_id=str(contact_id), crm_op_key=crm_key,
                            note_op_key=note_key)
        return await self._plan_followup(result, contact_id, identity, inserted,
                                         contact["status"], earlier)

    def _conflicting_field(self, contact: asyncpg.Record, name: str | None,
                           company: str | None) -> str | None:
        proposed = {"name": name, "company": company}
        for field in self.policy.review_on_conflict:
            new, old = proposed.get(field), contact[field] if field in proposed else None
            if new and old and new.casefold() != str(old).casefold():
                return field
        return None

    async def _fill_fields(self, contact: asyncpg.Record, name: str | None,
                           company: str | None) -> None:
        allowed = set(self.policy.updatable_fields)
        new_name = name if "name" in allowed and name != contact["name"] else None
        new_company = company if "company" in allowed and company != contact["company"] else None
        if new_name or new_company:
            await self.conn.execute(FILL_CONTACT_FIELDS, contact["contact_id"], new_name,
                                    new_company)
            await self.audit("contact_updated", {
                "fields": [f for f, v in (("name", new_name), ("company", new_company)) if v]
            }, contact["contact_id"])

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
            return result
        rule = self.policy.rule_for_intent(str(self.extraction.get("intent")))
        if rule is None:
            await self.audit("followup_not_planned", {"reason": "no_rule_for_intent"}, contact_id)
            return result
        blockers = None
        if contact_status == "active":
            blockers = await self.conn.fetchrow(
                FOLLOWUP_BLOCKERS, self.item.tenant, identity, contact_id, self.item.event_id,
                float(rule.quiet_period_hours * 3600),
            )
        if blockers is None or blockers["suppressed"]:
            await self.audit("followup_not_planned", {"reason": "suppressed"}, contact_id)
            result.reason = "suppressed"
            return result
        if blockers["recent"]:
            await self.audit("followup_not_planned", {"reason": "quiet_period",
                                                      "rule_id": rule.rule_id}, contact_id)
            result.reason = "quiet_period"
            return result
        needs_approval = new_contact and rule.new_prospect_requires_approval
        # The words are part of the plan: the rule's version derives from its template's, and
        # the template at this version is stored with the intent (docs/architecture.md §5).
        template = self.policy.template_for(rule)
        version = self.policy.rule_version(rule)
        await template_store.save_version(self.conn, self.item.tenant, template.ref,
                                          template.sources())
        intent = await self.conn.fetchrow(
            CREATE_INTENT, self.item.event_id, self.item.tenant, contact_id, rule.rule_id,
            version, template.ref, "awaiting_approval" if needs_approval else "queued",
            needs_approval,
        )
        if intent is None:
            raise missing_row("followup_intent")
        intent_id = str(intent["intent_id"])
        await self.conn.execute(
            QUEUE_SEND, send_key, self.item.workflow_id, self.item.event_id, Action.SEND.value,
            self.send_max_attempts, intent_id, self.item.tenant, contact_id,
            store.json_safe({"intent_id": intent_id, "rule_id": rule.rule_id,
                             "rule_version": version, "template": template.ref,
                             "needs_approval": intent["needs_approval"]}),
        )
        result.send_op_key = send_key
        result.intent_id = intent_id
        result.intent_needs_approval = intent["status"] == "awaiting_approval"
        return result
