"""plan_in_shadow: a tenant in shadow mode gets the plan, never the side effects
(docs/architecture.md §6, "Going live").

The item has been extracted and routed as any other (`inboxcrm/activities/extract.py`). Here the
planner's rules run on facts read from the store (`inboxcrm.domain.shadow.shadow_plan`), the
second extractor (when one is configured) says how it would have routed the message, and the
plan is stored on the event with an audit entry. Nothing else is written: no contact, match
decision, follow-up intent or operation row exists for a shadowed item, so when the tenant
goes live nothing of it can look as if the CRM had it, and no outbox row can ever be carried
out. No destination is called and no person is asked: every item ends `shadowed`.

One write is real: an opt-out. A person who asked not to be written to is suppressed now, as
in live mode, so the tenant's first live follow-up cannot reach them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
from temporalio import activity
from temporalio.exceptions import ApplicationError

from inboxcrm.activities.failures import missing_row
from inboxcrm.activities.heartbeat import heartbeating
from inboxcrm.activities.step_attempts import counted_attempt
from inboxcrm.adapters.errors import ErrorType
from inboxcrm.domain import planning
from inboxcrm.domain.extraction import Extractor
from inboxcrm.domain.policy import TenantPolicy, get_policy
from inboxcrm.domain.shadow import ShadowFacts, not_compared, second_opinion, shadow_plan
from inboxcrm.platform import atrest
from inboxcrm.platform.call_budget import CallBudget
from inboxcrm.platform.workpool import IN_PROCESS, Runner, WorkPoolUnavailable
from inboxcrm.schemas.models import ItemRef, ItemState, ShadowPlanResult
from inboxcrm.store import audit, contacts
from inboxcrm.store import shadow as shadow_store
from inboxcrm.store.suppression import SendInFlight, suppress_identity

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn


class ShadowActivities:
    """`runner`: where the second extractor's work on the message runs (the worker's
    `WorkPool`, under the work budget of docs/architecture.md §7, as extraction's).
    `model_budget`: how many second opinions a second extractor that calls a model may ask
    for (this step is local: the model queue's rate limit does not see it). Past it an item
    is compared no further (`unavailable: rate_limited`), never held up."""

    def __init__(self, pool: asyncpg.Pool, comparison: Extractor | None = None,
                 runner: Runner = IN_PROCESS, model_budget: CallBudget | None = None) -> None:
        self._pool = pool
        self._comparison = comparison
        self._runner = runner
        self._model_budget = model_budget

    @activity.defn(name="plan_in_shadow")
    async def plan_in_shadow(self, item: ItemRef) -> ShadowPlanResult:
        async with heartbeating(), counted_attempt(self._pool, item, "shadow-plan"):
            try:
                return await self._plan(item)
            except SendInFlight as busy:
                raise ApplicationError(
                    "send in flight for this identity", type=ErrorType.TRANSIENT.value,
                    next_retry_delay=timedelta(seconds=min(busy.retry_after, 5.0))) from None

    async def _plan(self, item: ItemRef) -> ShadowPlanResult:
        policy = get_policy(item.tenant)
        async with self._pool.acquire() as conn:
            event = await shadow_store.start(conn, item.event_id, ItemState.MATCHING)
        if event is None:
            raise missing_row("event")
        if event["shadow_plan"] is not None:  # a re-run: the stored plan stands
            return ShadowPlanResult(outcome=str(event["shadow_plan"]["outcome"]))
        route = str(event["route"])
        reasons = [str(r) for r in event["route_reasons"] or []]
        # Outside the transaction: a model's answer can take seconds.
        opinion = await self._second_opinion(event, policy, route)
        extraction: dict[str, Any] = event["extraction"] or {}
        identity: str | None = event["canonical_email"]
        async with self._pool.acquire() as conn, conn.transaction():
            facts = await self._facts(conn, item, policy, route, extraction, identity)
            plan = shadow_plan(route, reasons, extraction, identity, policy, facts, opinion)
            if plan["suppression"] == "recorded" and identity is not None:
                suppressed = await suppress_identity(
                    conn, item.tenant, identity, reason="opt_out_request",
                    source=f"event:{item.event_id}", cancel_reason="opt_out",
                    scope=policy.suppression_scope("opt_out_request"),
                    marketing_rules=policy.marketing_rule_ids(),
                    # Shadow mode writes nothing to a destination (docs/consent.md).
                    write_back=False)
                await audit.append(
                    conn, tenant=item.tenant, event_id=item.event_id,
                    workflow_id=item.workflow_id, actor="planner",
                    action="suppression_recorded",
                    detail={"reason": "opt_out_request", "shadow": True,
                            "cancelled_intents": suppressed.cancelled_intents})
            await shadow_store.store_plan(conn, item.event_id, audit.json_safe(plan),
                                          item.tenant, item.workflow_id)
        return ShadowPlanResult(outcome=str(plan["outcome"]))

    async def _second_opinion(self, event: asyncpg.Record, policy: TenantPolicy,
                              route: str) -> dict[str, Any] | None:
        """The second extractor's route, if one is configured and the message is still
        stored; not asked past the model budget."""
        if self._comparison is None or event["raw"] is None:
            return None
        if self._model_budget is not None and not self._model_budget.take():
            return not_compared(self._comparison, "rate_limited")
        try:
            raw = atrest.open_value(event["raw"], tenant=str(event["tenant"]), column=atrest.RAW,
                                    row=str(event["event_id"]))
            return await second_opinion(raw, policy, str(event["source"]),
                                        route, self._comparison, self._runner)
        except WorkPoolUnavailable:
            # this worker cannot run the work now: not the message's doing, a plain retry
            raise ApplicationError("work pool unavailable", type=ErrorType.TRANSIENT.value,
                                   next_retry_delay=timedelta(seconds=2)) from None

    async def _facts(self, conn: Conn, item: ItemRef, policy: TenantPolicy, route: str,
                     extraction: dict[str, Any], identity: str | None) -> ShadowFacts:
        """Read-only: what the planner would look at. Only routes the planner reaches ask."""
        if route in ("ignore", "review"):
            return ShadowFacts()
        if identity is None:
            name = planning.value(extraction, "contact_name")
            found = (await contacts.find_name_candidates(conn, tenant=item.tenant, name=name)
                     if name else [])
            return ShadowFacts(name_candidates=tuple(found))
        asked = planning.questions(policy, extraction, None)
        quiet = (asked.quiet_period_hours or 0.0) * 3600
        await shadow_store.lock_identity(conn, item.tenant, identity)
        row = await shadow_store.facts(conn, item.tenant, identity, item.event_id, quiet)
        return ShadowFacts(
            contact_id=str(row["contact_id"]) if row["contact_id"] else None,
            contact_name=row["name"], contact_company=row["company"],
            contact_status=row["status"], suppressed=bool(row["suppressed"]),
            recent_intent=bool(row["recent_intent"]),
            recent_shadow_followup=bool(row["recent_shadow_followup"]),
            shadow_created=bool(row["shadow_created"]))
