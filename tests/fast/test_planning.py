"""One planner: the review card proposes what the planner decides (`inboxcrm.domain.planning`).

For generated states — the tenant's rules and field policy, the message's intent and
fields, the stored contact (or none), and the store's facts (suppression, another event's
live intent within the quiet period) — the card's proposal equals the planning activity's
decision, and both keep the promises of docs/architecture.md §5 (one follow-up per contact
per quiet period under any rule; never to a suppressed identity or an inactive contact; a
new prospect's follow-up waits for approval where the rule says so)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from inboxcrm.domain import planning
from inboxcrm.domain.policy import FollowupRule, TenantPolicy
from inboxcrm.domain.review_card import contact_update, proposed_status
from schemas.extraction import INTENTS

FIELDS = ("name", "company")
VALUES = st.one_of(st.none(), st.sampled_from(["Jane", "jane", "JANE", "John", "Initech",
                                               "initech", "Globex"]))


@st.composite
def policies(draw: st.DrawFn) -> TenantPolicy:
    rules = []
    for number in range(draw(st.integers(0, 3))):
        rules.append(FollowupRule(
            rule_id=f"rule-{number}", version=draw(st.integers(1, 3)),
            intents=draw(st.lists(st.sampled_from(INTENTS), max_size=4, unique=True)),
            quiet_period_hours=draw(st.sampled_from([0.0, 1.0, 24.0, 72.0])),
            new_prospect_requires_approval=draw(st.booleans())))
    return TenantPolicy(
        tenant="acme", mailboxes=["sales@acme.test"], domains=["acme.test"],
        updatable_fields=draw(st.lists(st.sampled_from(FIELDS), unique=True)),
        review_on_conflict=draw(st.lists(st.sampled_from(FIELDS), unique=True)),
        followup_rules=rules)


CONTACTS = st.one_of(st.none(), st.fixed_dictionaries({
    "contact_id": st.just("6f1c2d1e-0000-4000-8000-000000000001"),
    "name": VALUES, "company": VALUES,
    "status": st.sampled_from(["active", "suppressed", "forgotten", "bounced"]),
}))
FACTS = st.builds(planning.FollowupFacts, suppressed=st.booleans(), recent=st.booleans())


def planner_decision(policy: TenantPolicy, intent: str | None, contact: dict[str, Any] | None,
                     facts: planning.FollowupFacts) -> planning.FollowupDecision:
    """What `activities/match.py` decides in its transaction: the upsert creates a missing
    contact (new, active); the store is asked only for an active contact under a rule."""
    rule = planning.followup_rule(policy, intent)
    status = contact["status"] if contact is not None else "active"
    asked = facts if rule is not None and planning.needs_blockers(status) else None
    return planning.decide_followup(rule, new_contact=contact is None, contact_status=status,
                                    facts=asked)


def card_proposal(policy: TenantPolicy, intent: str | None, contact: dict[str, Any] | None,
                  facts: planning.FollowupFacts) -> str | None:
    """What the review card shows for a follow-up not planned yet (None: no follow-up
    section), as `review_card._followup` builds it once the store answered."""
    rule = planning.followup_rule(policy, intent)
    if rule is None:
        return None
    status = contact["status"] if contact is not None else "active"
    asked = facts if planning.needs_blockers(status) else None
    return proposed_status(rule, contact, asked)


EXPECTED = {
    "suppressed": ("not sent: suppressed", "not sent: contact "),
    "quiet_period": ("not sent: quiet period",),
    "awaiting_approval": ("proposed; a new prospect: its send needs a second approval",),
    "queued": ("proposed; sent after approval",),
}


@settings(max_examples=150, deadline=None, database=None)
@given(policy=policies(), intent=st.one_of(st.none(), st.sampled_from(INTENTS)),
       contact=CONTACTS, facts=FACTS)
def test_the_card_proposes_what_the_planner_decides(
        policy: TenantPolicy, intent: str | None, contact: dict[str, Any] | None,
        facts: planning.FollowupFacts) -> None:
    decision = planner_decision(policy, intent, contact, facts)
    proposal = card_proposal(policy, intent, contact, facts)

    if decision.outcome == "no_rule":
        assert proposal is None
        return
    assert proposal is not None
    assert proposal.startswith(EXPECTED[decision.outcome]), (decision, proposal)
    # The promises, independently of either implementation.
    if proposal.startswith("proposed"):
        assert decision.planned
        assert not facts.suppressed and not facts.recent
        assert contact is None or contact["status"] == "active"
    if decision.outcome == "awaiting_approval":
        assert contact is None and decision.rule is not None
        assert decision.rule.new_prospect_requires_approval


@settings(max_examples=150, deadline=None, database=None)
@given(policy=policies(), stored_name=VALUES, stored_company=VALUES, name=VALUES,
       company=VALUES)
def test_the_card_names_the_planners_conflict_and_fills(
        policy: TenantPolicy, stored_name: str | None, stored_company: str | None,
        name: str | None, company: str | None) -> None:
    existing = planning.ExistingContact(stored_name, stored_company)
    conflict = planning.conflicting_field(policy, existing, name, company)
    fill = planning.fields_to_fill(policy, existing, name, company)
    words = contact_update(policy, existing, name, company)

    assert (f"field_conflict:{conflict}" in words) if conflict else ("field_conflict" not in
                                                                     words)
    assert all(field in words for field in fill)
    # The conflict rule itself: a reviewed field, both values given, different beyond case.
    proposed = {"name": name, "company": company}
    stored = {"name": stored_name, "company": stored_company}
    if conflict is not None:
        assert conflict in policy.review_on_conflict
        new, old = proposed[conflict], stored[conflict]
        assert new and old and new.casefold() != old.casefold()
    else:
        assert not any(proposed[f] and stored[f]
                       and str(proposed[f]).casefold() != str(stored[f]).casefold()
                       for f in policy.review_on_conflict)
    for field, value in fill.items():
        assert field in policy.updatable_fields and value == proposed[field] != stored[field]


def test_an_inactive_contact_is_not_promised_a_follow_up() -> None:
    """The drift this closes: the card matched the word "suppressed" in its own display lines,
    so a forgotten contact was shown "proposed; sent after approval" while the planner sends
    nothing to a contact that is not active."""
    rule = FollowupRule(rule_id="ack", version=1, intents=["pricing_request"])
    contact = {"contact_id": "c", "name": None, "company": None, "status": "forgotten"}
    assert proposed_status(rule, contact, None) == "not sent: contact forgotten"


def test_a_follow_up_under_another_rule_keeps_the_quiet_period() -> None:
    """The planner's quiet period spans every rule (`FOLLOWUP_BLOCKERS`); the card asks the
    same statement, so another rule's recent intent is reported as the planner sees it."""
    rule = FollowupRule(rule_id="renewal", version=1, intents=["pricing_request"],
                        quiet_period_hours=24)
    contact = {"contact_id": "c", "name": None, "company": None, "status": "active"}
    recent = planning.FollowupFacts(suppressed=False, recent=True)
    assert proposed_status(rule, contact, recent) == "not sent: quiet period (24 h)"
