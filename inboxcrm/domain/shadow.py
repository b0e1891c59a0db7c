"""Shadow mode's decisions (docs/architecture.md §6, "Going live"): what the product would
have done with one item, and the report over many.

`shadow_plan` is the planner itself (`planning.plan`) on facts the caller read: the route
and reasons of the extraction, the tenant policy, and what the store says about the identity
(`inboxcrm/activities/shadow.py` gathers them read-only). It writes nothing and calls nothing. The
plan it returns is stored on the event and holds references, reasons and field names only:
never an address, a name or a subject, so the report can be shared as it is.

Outcomes: `would_complete` (CRM writes and, if planned, the follow-up, without a person),
`would_review` (a person would be asked first: the reason says why), `would_ignore`,
`would_suppress` (an opt-out: recorded for real, see `inboxcrm/activities/shadow.py`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from inboxcrm.domain import planning
from inboxcrm.domain.extraction import (
    Extractor,
    ExtractorError,
    RulesExtractor,
    build_extractor,
    extract_and_route,
)
from inboxcrm.domain.policy import TenantPolicy
from inboxcrm.platform.config import Settings
from inboxcrm.platform.workpool import IN_PROCESS, Runner

PLAN_VERSION = 1
WOULD_COMPLETE = "would_complete"
WOULD_REVIEW = "would_review"
WOULD_IGNORE = "would_ignore"
WOULD_SUPPRESS = "would_suppress"


@dataclass(frozen=True)
class ShadowFacts:
    """What the store says about the identity (read-only; `inboxcrm.store.shadow`)."""

    contact_id: str | None = None
    contact_name: str | None = None
    contact_company: str | None = None
    contact_status: str | None = None
    suppressed: bool = False
    recent_intent: bool = False           # a live follow-up within the quiet period
    recent_shadow_followup: bool = False  # an earlier shadowed item would have sent one
    shadow_created: bool = False          # an earlier shadowed item would create the contact
    name_candidates: tuple[str, ...] = ()  # no identity: contacts with the extracted name


def planner_facts(route: str, extraction: dict[str, Any], identity: str | None,
                  policy: TenantPolicy, facts: ShadowFacts) -> planning.Facts:
    """The shadow facts as the planner takes them: an earlier shadowed item that would have
    created the contact makes this one match it; one that would have sent a follow-up counts
    for the quiet period. Nobody approved anything, and no ramp runs in shadow mode."""
    contact = (planning.ExistingContact(facts.contact_name, facts.contact_company,
                                        facts.contact_status or "active")
               if facts.contact_id is not None else None)
    return planning.Facts(
        policy=policy, route=route, identity=identity, extraction=extraction,
        name_candidates=facts.name_candidates, contact=contact,
        pending_contact=facts.contact_id is None and facts.shadow_created,
        followup=planning.FollowupFacts(
            suppressed=facts.suppressed,
            recent=facts.recent_intent or facts.recent_shadow_followup))


def shadow_plan(route: str, reasons: list[str], extraction: dict[str, Any],
                identity: str | None, policy: TenantPolicy, facts: ShadowFacts,
                second_opinion: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan a live tenant's item would have carried out: the workflow's route, then the
    planner's own decision (`planning.plan`) on the shadow facts, in the plan's words."""
    plan: dict[str, Any] = {
        "version": PLAN_VERSION, "route": route, "reasons": list(reasons),
        "outcome": WOULD_COMPLETE, "review_reason": None, "contact": None,
        "crm": None, "followup": None, "suppression": None,
        "second_opinion": second_opinion,
    }
    if route == "ignore":
        return plan | {"outcome": WOULD_IGNORE}
    if route == "review":
        return plan | {"outcome": WOULD_REVIEW,
                       "review_reason": reasons[0] if reasons else "extraction_review"}
    decided = planning.plan(planner_facts(route, extraction, identity, policy, facts))
    if decided.outcome == "opted_out":
        return plan | {"outcome": WOULD_SUPPRESS, "suppression": "recorded",
                       "contact": {"action": "existing" if facts.contact_id else "none",
                                   "contact_id": facts.contact_id, "fields": []}}
    if identity is None:
        return plan | {"outcome": WOULD_REVIEW, "review_reason": decided.reason}
    plan["contact"] = _contact(extraction, facts, decided)
    if decided.outcome == "review":
        return plan | {"outcome": WOULD_REVIEW, "review_reason": decided.reason}
    plan["crm"] = {"upsert": True, "note": True}
    assert decided.followup is not None
    plan["followup"] = followup = _followup(policy, decided.followup)
    if followup["action"] == "await_approval":
        plan |= {"outcome": WOULD_REVIEW, "review_reason": "followup_approval_required"}
    return plan


def _contact(extraction: dict[str, Any], facts: ShadowFacts,
             decided: planning.Plan) -> dict[str, Any]:
    """What happens to the contact, in the plan's words."""
    if facts.contact_id is None:
        if facts.shadow_created:
            # An earlier shadowed item would have created it: this one would match it.
            return {"action": "match_shadowed", "contact_id": None, "fields": []}
        fields = [f for f, v in (("name", planning.value(extraction, "contact_name")),
                                 ("company", planning.value(extraction, "company"))) if v]
        return {"action": "create", "contact_id": None, "fields": fields}
    if decided.outcome == "review":
        return {"action": "update", "contact_id": facts.contact_id, "fields": []}
    changed = list(decided.fill)
    return {"action": "update" if changed else "unchanged", "contact_id": facts.contact_id,
            "fields": changed}


def _followup(policy: TenantPolicy, decision: planning.FollowupDecision) -> dict[str, Any]:
    """The planner's follow-up decision, in the plan's words."""
    if decision.rule is None:
        return {"action": "none", "reason": "no_rule_for_intent"}
    # The version and words the live planner would plan (`TenantPolicy.rule_version`).
    base = {"rule_id": decision.rule.rule_id,
            "rule_version": policy.rule_version(decision.rule),
            "template_id": policy.template_for(decision.rule).ref}
    if decision.outcome == "awaiting_approval":
        return base | {"action": "await_approval", "reason": "followup_approval_required"}
    if decision.outcome == "queued":
        return base | {"action": "send", "reason": None}
    return base | {"action": "none", "reason": decision.outcome}


# --- the second extractor -----------------------------------------------------------------
def comparison_extractor(settings: Settings) -> Extractor | None:
    """The extractor a shadowed item is also shown to, to see where the two would route
    differently: the LLM when one is configured (`INBOXCRM_LLM_*`) but the rules extract, the
    rules when the LLM extracts; none when only the rules are configured."""
    primary = (settings.extractor or "rules").strip().lower()
    if primary == "llm":
        return RulesExtractor()
    if not settings.llm_base_url:
        return None
    return build_extractor(SimpleNamespace(
        extractor="llm", llm_base_url=settings.llm_base_url, llm_api_key=settings.llm_api_key,
        llm_model=settings.llm_model, llm_timeout_seconds=settings.llm_timeout_seconds,
        llm_max_schema_retries=settings.llm_max_schema_retries))


def not_compared(extractor: Extractor, why: str) -> dict[str, Any]:
    """The second opinion of an extractor that did not answer (`why`: its error's name, or
    `rate_limited` when the worker's budget of model calls for comparisons is spent)."""
    return {"extractor": extractor.name, "route": None, "reasons": [], "differs": False,
            "unavailable": why}


async def second_opinion(raw: bytes, policy: TenantPolicy, source: str, route: str,
                         extractor: Extractor, runner: Runner = IN_PROCESS) -> dict[str, Any]:
    """The second extractor's route for the same message under the same validation. An
    extractor that cannot answer is reported as such; it never holds the item up."""
    try:
        outcome = await extract_and_route(raw, policy, extractor, source=source, runner=runner)
    except ExtractorError as exc:
        return not_compared(extractor, type(exc).__name__)
    return {"extractor": outcome.extractor_version, "route": outcome.route,
            "reasons": list(outcome.reasons), "differs": outcome.route != route,
            "unavailable": None}


# --- the report ---------------------------------------------------------------------------
def summarise(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts over shadowed items (each `{"delivery_id", "route", "route_reasons",
    "shadow_plan", "state"}`): routes and reasons, contacts that would be created or updated,
    follow-ups that would go out (and why others would not), items that would wait for a
    person, and the messages the second extractor would have routed differently."""
    routes: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    contacts: Counter[str] = Counter()
    followups: Counter[str] = Counter()
    not_sent: Counter[str] = Counter()
    review: Counter[str] = Counter()
    differs: list[dict[str, Any]] = []
    compared = unavailable = unplanned = 0
    for item in items:
        plan = item.get("shadow_plan")
        if not plan:
            unplanned += 1
            continue
        routes[str(plan.get("route"))] += 1
        for reason in plan.get("reasons") or []:
            reasons[str(reason)] += 1
        outcomes[str(plan.get("outcome"))] += 1
        if plan.get("review_reason"):
            review[str(plan["review_reason"])] += 1
        contact = plan.get("contact") or {}
        if contact.get("action") in ("create", "update"):
            contacts[str(contact["action"])] += 1
        followup = plan.get("followup") or {}
        if followup.get("action") in ("send", "await_approval"):
            followups[str(followup["action"])] += 1
        elif followup.get("reason"):
            not_sent[str(followup["reason"])] += 1
        opinion = plan.get("second_opinion")
        if opinion:
            if opinion.get("unavailable"):
                unavailable += 1
            else:
                compared += 1
                if opinion.get("differs"):
                    differs.append({"delivery_id": item.get("delivery_id"),
                                    "route": plan.get("route"),
                                    "second_route": opinion.get("route"),
                                    "second_reasons": opinion.get("reasons") or [],
                                    "extractor": opinion.get("extractor")})
    return {
        "items": len(items), "not_planned_yet": unplanned,
        "by_route": dict(sorted(routes.items())), "by_reason": dict(sorted(reasons.items())),
        "by_outcome": dict(sorted(outcomes.items())),
        "contacts": {"would_create": contacts["create"], "would_update": contacts["update"]},
        "followups": {"would_send": followups["send"],
                      "would_wait_for_approval": followups["await_approval"],
                      "not_sent": dict(sorted(not_sent.items()))},
        "would_wait_for_a_person": dict(sorted(review.items())),
        "second_extractor": {"compared": compared, "unavailable": unavailable,
                             "routed_differently": differs},
    }


def describe(plan: dict[str, Any] | None) -> str:
    """One line for an item: what would have happened."""
    if not plan:
        return "not planned yet"
    outcome = plan.get("outcome")
    if outcome == WOULD_IGNORE:
        return "ignored"
    if outcome == WOULD_SUPPRESS:
        return "opt-out: suppression recorded, nothing sent"
    parts = []
    contact = plan.get("contact") or {}
    if contact.get("action"):
        fields = contact.get("fields") or []
        parts.append(f"contact {contact['action']}" + (f" ({', '.join(fields)})" if fields
                                                       else ""))
    followup = plan.get("followup") or {}
    if followup.get("action") == "send":
        parts.append(f"follow-up {followup.get('template_id')} sent")
    elif followup.get("action") == "await_approval":
        parts.append("follow-up awaits approval")
    elif followup.get("reason"):
        parts.append(f"no follow-up ({followup['reason']})")
    if plan.get("review_reason"):
        parts.append(f"waits for a person: {plan['review_reason']}")
    return "; ".join(parts) or str(outcome)
