"""The planner's decisions, pure: which field conflicts, which fields to fill, and whether a
follow-up is planned (docs/architecture.md §5). No I/O: the caller gathers the facts from
the store — the planning activity inside its transaction (`activities/match.py`), the review
card with read-only queries (`inboxcrm.domain.review_card`) — using the same store
statements, and both call these functions, so the card never promises what the planner
will not do (`tests/fast/test_planning.py` holds both to it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from inboxcrm.domain.policy import FollowupRule, TenantPolicy

# What planning does about a follow-up:
# - no_rule: no rule of the tenant covers the message's intent;
# - suppressed: the identity is suppressed, or the contact is no longer active;
# - quiet_period: another event's live intent for this contact (under any rule) is younger
#   than the rule's quiet period;
# - queued: an intent is created and sent when the item continues;
# - awaiting_approval: an intent is created for a new prospect and waits for a reviewer.
FollowupOutcome = Literal["no_rule", "suppressed", "quiet_period", "queued",
                          "awaiting_approval"]

FIELDS = ("name", "company")


@dataclass(frozen=True)
class ExistingContact:
    """The stored contact as planning finds it (its fields before this event)."""

    name: str | None
    company: str | None
    status: str = "active"


@dataclass(frozen=True)
class FollowupFacts:
    """What the store says about a follow-up for this identity (`intents.FOLLOWUP_BLOCKERS`,
    asked with the rule's quiet period)."""

    suppressed: bool
    recent: bool


@dataclass(frozen=True)
class FollowupDecision:
    outcome: FollowupOutcome
    rule: FollowupRule | None = None

    @property
    def planned(self) -> bool:
        """An intent is (or was) created."""
        return self.outcome in ("queued", "awaiting_approval")


def conflicting_field(policy: TenantPolicy, existing: ExistingContact, name: str | None,
                      company: str | None) -> str | None:
    """The first field the policy reviews on conflict whose new value differs (ignoring
    case) from a stored one; None when nothing conflicts. A missing value never conflicts."""
    proposed = {"name": name, "company": company}
    stored = {"name": existing.name, "company": existing.company}
    for field in policy.review_on_conflict:
        new, old = proposed.get(field), stored.get(field)
        if new and old and new.casefold() != str(old).casefold():
            return field
    return None


def fields_to_fill(policy: TenantPolicy, existing: ExistingContact, name: str | None,
                   company: str | None) -> dict[str, str]:
    """The fields planning writes onto an existing contact: those the policy lets it update,
    given in the message and different from what is stored."""
    allowed = set(policy.updatable_fields)
    proposed = {"name": name, "company": company}
    stored = {"name": existing.name, "company": existing.company}
    return {field: value for field in FIELDS
            if field in allowed and (value := proposed[field]) and value != stored[field]}


def followup_rule(policy: TenantPolicy, intent: str | None) -> FollowupRule | None:
    """The tenant's rule for the message's intent (its quiet period is what the facts are
    asked with)."""
    return policy.rule_for_intent(str(intent))


def needs_blockers(contact_status: str) -> bool:
    """Whether the store must be asked (`FOLLOWUP_BLOCKERS`): only an active contact can be
    followed up."""
    return contact_status == "active"


def decide_followup(rule: FollowupRule | None, *, new_contact: bool, contact_status: str,
                    facts: FollowupFacts | None) -> FollowupDecision:
    """Whether this event gets a follow-up. `facts` may be None when the contact is not
    active (nothing to ask: no follow-up)."""
    if rule is None:
        return FollowupDecision("no_rule")
    if not needs_blockers(contact_status) or facts is None or facts.suppressed:
        return FollowupDecision("suppressed", rule)
    if facts.recent:
        return FollowupDecision("quiet_period", rule)
    if new_contact and rule.new_prospect_requires_approval:
        return FollowupDecision("awaiting_approval", rule)
    return FollowupDecision("queued", rule)
