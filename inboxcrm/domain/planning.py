"""The planner, pure: `plan(facts) -> Plan` decides who the sender is and what to do about
them (docs/architecture.md §5) from facts read once. No I/O. Three callers, one function:

- the planning activity (`inboxcrm/activities/match.py`) reads the facts inside its transaction,
  under the locks that serialise our writers, calls `plan`, then writes what it returns;
- the review card (`inboxcrm.domain.review_card`) reads them with read-only queries and
  shows what `plan` returns, so it never promises what the planner would hold;
- shadow mode (`inboxcrm.domain.shadow`) reads them read-only and stores `plan`'s answer.

`tests/fast/test_planning.py` runs this function on generated facts and checks the promises
of docs/architecture.md §5 against it, and the card's words against it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from inboxcrm.domain.policy import FollowupRule, TenantPolicy

# What planning does about a follow-up:
# - no_rule: no rule of the tenant covers the message's intent;
# - suppressed: the identity is suppressed, or the contact is no longer active;
# - quiet_period: another event's live intent for this contact (under any rule) is younger
#   than the rule's quiet period;
# - queued: an intent is created and sent when the item continues;
# - awaiting_approval: an intent is created and waits for a reviewer (a new prospect under a
#   rule that says so; `unknown_customer`: a rule that sends automatically only to known
#   customers, the contact is new or has no CRM record; or `ramp_limit`: the ramp's
#   automatic follow-ups of the hour are used);
# - reused: an earlier run of this plan created the intent; that decision stands;
# - thread_reply: the message answers our follow-up or an earlier inbound message of the
#   tenant (`Facts.thread`): the conversation goes on, it is not acknowledged again.
FollowupOutcome = Literal["no_rule", "suppressed", "quiet_period", "queued",
                          "awaiting_approval", "reused", "thread_reply"]
# Who the sender is, as `match_decisions.decision` stores it.
MatchDecision = Literal["new_contact", "existing_contact", "no_contact", "candidates",
                        "no_identity"]
PlanOutcome = Literal["planned", "review", "opted_out"]

FIELDS = ("name", "company")
RAMP_LIMIT = "ramp_limit"
# A rule that sends automatically only to known customers, for someone who is not one.
UNKNOWN_CUSTOMER = "unknown_customer"


@dataclass(frozen=True)
class ExistingContact:
    """The stored contact as planning finds it (its fields before this event)."""

    name: str | None
    company: str | None
    status: str = "active"
    # It has a record in the CRM (created by us or adopted): a known customer for a rule
    # whose `auto_send` is `known_customers`.
    in_crm: bool = True


@dataclass(frozen=True)
class FollowupFacts:
    """What the store says about a follow-up for this identity (`intents.FOLLOWUP_BLOCKERS`,
    asked with the rule's quiet period)."""

    suppressed: bool
    recent: bool
    # Suppressed for marketing only (docs/consent.md): stops a rule whose purpose is that.
    marketing_suppressed: bool = False


@dataclass(frozen=True)
class EarlierPlan:
    """What an earlier run of this event's plan wrote (`matches.PLAN_FACTS`): a local
    activity's result dies with a killed worker, so a plan can run again."""

    decision: str | None = None          # its match by address, if it got that far
    intent_id: str | None = None         # the follow-up it created
    intent_status: str | None = None
    approval_reason: str | None = None


@dataclass(frozen=True)
class RampFacts:
    """A first live run's hour (docs/architecture.md §6): the cap, and how many automatic
    follow-ups the hour has granted (read under the hour row's lock by the planner)."""

    cap: int
    granted: int


@dataclass(frozen=True)
class Questions:
    """What the store is asked for one plan: the quiet period of the message's rule (None:
    no rule) and the ramp's hourly cap (None: no ramp now, or no rule to need a slot)."""

    rule: FollowupRule | None
    quiet_period_hours: float | None
    ramp_cap: int | None


@dataclass(frozen=True)
class Facts:
    """Everything `plan` looks at, read in one go by its caller.

    `contact`: the stored contact with the sender's address before this event (None: this
    plan creates it). `pending_contact`: shadow mode only, an earlier shadowed item would
    have created it (so this one matches it, and it is not new). `earlier`: what an earlier
    run of this plan wrote (live re-runs only). `followup`: `FOLLOWUP_BLOCKERS` (None: not
    asked). `ramp`: the hour of a running ramp (None: no ramp)."""

    policy: TenantPolicy
    route: str
    identity: str | None
    extraction: dict[str, Any]
    approved: bool = False
    name_candidates: tuple[str, ...] = ()
    contact: ExistingContact | None = None
    pending_contact: bool = False
    earlier: EarlierPlan | None = None
    followup: FollowupFacts | None = None
    ramp: RampFacts | None = None
    thread: str | None = None


@dataclass(frozen=True)
class FollowupDecision:
    outcome: FollowupOutcome
    rule: FollowupRule | None = None
    # Why it waits for approval beyond the policy (`ramp_limit`); None otherwise.
    approval_reason: str | None = None
    # What the ramp's hour row records: a slot granted, or a follow-up held; None: untouched.
    ramp: Literal["granted", "held"] | None = None

    @property
    def planned(self) -> bool:
        """An intent is (or was) created."""
        return self.outcome in ("queued", "awaiting_approval", "reused")

    @property
    def needs_approval(self) -> bool:
        return self.outcome == "awaiting_approval"


@dataclass(frozen=True)
class Plan:
    """What the planner does with one item. `match` None: an earlier run's match stands
    (nothing to record). `followup` None: not reached (review, opt-out)."""

    outcome: PlanOutcome
    reason: str | None = None
    match: MatchDecision | None = None
    candidates: tuple[str, ...] = ()
    new_contact: bool = False
    conflict: str | None = None
    fill: dict[str, str] = field(default_factory=dict)
    followup: FollowupDecision | None = None


def value(extraction: dict[str, Any], name: str) -> str | None:
    """An extracted field's value, stripped; None when missing or blank."""
    found = (extraction.get(name) or {}).get("value")
    return found.strip() if isinstance(found, str) and found.strip() else None


def conflicting_field(policy: TenantPolicy, existing: ExistingContact, name: str | None,
                      company: str | None) -> str | None:
    """The first field the policy reviews on conflict whose new value differs (ignoring
    case) from a stored one; None when nothing conflicts. A missing value never conflicts."""
    proposed = {"name": name, "company": company}
    stored = {"name": existing.name, "company": existing.company}
    for name_ in policy.review_on_conflict:
        new, old = proposed.get(name_), stored.get(name_)
        if new and old and new.casefold() != str(old).casefold():
            return name_
    return None


def fields_to_fill(policy: TenantPolicy, existing: ExistingContact, name: str | None,
                   company: str | None) -> dict[str, str]:
    """The fields planning writes onto an existing contact: those the policy lets it update,
    given in the message and different from what is stored."""
    allowed = set(policy.updatable_fields)
    proposed = {"name": name, "company": company}
    stored = {"name": existing.name, "company": existing.company}
    return {name_: new for name_ in FIELDS
            if name_ in allowed and (new := proposed[name_]) and new != stored[name_]}


def ramp_cap(policy: TenantPolicy, live_for_seconds: float | None) -> int | None:
    """The hourly cap of automatic follow-ups while the tenant's ramp runs: for the policy's
    `ramp.days` after an operator switched it to live (docs/architecture.md §6)."""
    if policy.ramp is None or live_for_seconds is None:
        return None
    if float(live_for_seconds) >= policy.ramp.days * 86_400:
        return None
    return policy.ramp.max_auto_followups_per_hour


def questions(policy: TenantPolicy, extraction: dict[str, Any],
              live_for_seconds: float | None) -> Questions:
    """What to ask the store before `plan`: the rule's quiet period, and the ramp's cap only
    when a rule could need a slot."""
    rule = policy.rule_for_intent(str(extraction.get("intent")))
    if rule is None:
        return Questions(None, None, None)
    return Questions(rule, float(rule.quiet_period_hours), ramp_cap(policy, live_for_seconds))


def plan(facts: Facts) -> Plan:
    """The planner's decision, in the order the planning activity writes it: the identity,
    an opt-out, the contact (a conflicting field waits for a reviewer unless one approved),
    the fields to fill, then the follow-up."""
    policy = facts.policy
    if facts.identity is None:
        # No trusted address: a matching name is a *candidate* for a person to confirm,
        # never a merge. Either way a reviewer must supply or confirm the identity.
        if facts.name_candidates:
            return Plan("review", "candidates", "candidates", facts.name_candidates)
        return Plan("review", "no_identity", "no_identity")
    if facts.route == "opt_out":
        return Plan("opted_out", "opt_out_recorded",
                    "existing_contact" if facts.contact is not None else "no_contact")
    name, company = value(facts.extraction, "contact_name"), value(facts.extraction, "company")
    earlier = facts.earlier
    if earlier is not None and earlier.decision is not None:
        # A re-run of a plan that matched already: the contact this run sees was made by
        # that run; its decision and operations stand.
        new_contact = earlier.decision == "new_contact"
        return Plan("planned", new_contact=new_contact,
                    followup=_followup(facts, new_contact))
    new_contact = facts.contact is None and not facts.pending_contact
    conflict: str | None = None
    fill: dict[str, str] = {}
    if facts.contact is not None:
        conflict = conflicting_field(policy, facts.contact, name, company)
        if conflict and not facts.approved:
            return Plan("review", f"field_conflict:{conflict}", "existing_contact",
                        conflict=conflict)
        fill = fields_to_fill(policy, facts.contact, name, company)
    return Plan("planned", match="new_contact" if new_contact else "existing_contact",
                new_contact=new_contact, conflict=conflict, fill=fill,
                followup=_followup(facts, new_contact))


def _followup(facts: Facts, new_contact: bool) -> FollowupDecision:
    """Whether this event gets a follow-up, and whether it waits for a person."""
    earlier = facts.earlier
    if earlier is not None and earlier.intent_id is not None:
        # Decided before: that decision stands, whatever changed since (an opt-out, the
        # quiet period). The send step re-checks eligibility, and it alone knows whether
        # an earlier attempt may have gone out (then the item is held, not suppressed).
        return FollowupDecision("reused", approval_reason=earlier.approval_reason)
    if facts.thread is not None:
        return FollowupDecision("thread_reply")
    rule = facts.policy.rule_for_intent(str(facts.extraction.get("intent")))
    if rule is None:
        return FollowupDecision("no_rule")
    status = facts.contact.status if facts.contact is not None else "active"
    blockers = facts.followup
    if (status != "active" or blockers is None or blockers.suppressed
            or (blockers.marketing_suppressed and rule.purpose == "marketing")):
        return FollowupDecision("suppressed", rule)
    if blockers.recent:
        return FollowupDecision("quiet_period", rule)
    if new_contact and rule.new_prospect_requires_approval:
        return FollowupDecision("awaiting_approval", rule)
    if rule.auto_send == "known_customers" and (
            new_contact or facts.contact is None or not facts.contact.in_crm):
        return FollowupDecision("awaiting_approval", rule, approval_reason=UNKNOWN_CUSTOMER)
    ramp = facts.ramp
    if ramp is None:
        return FollowupDecision("queued", rule)
    if ramp.granted < ramp.cap:
        return FollowupDecision("queued", rule, ramp="granted")
    return FollowupDecision("awaiting_approval", rule, approval_reason=RAMP_LIMIT, ramp="held")
