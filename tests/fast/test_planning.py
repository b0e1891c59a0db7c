"""One planner: `planning.plan` is what the planning activity, the review card and shadow mode
decide with, and it keeps the promises of docs/architecture.md §5.

For generated facts — the tenant's rules, field policy and ramp, the message's route, intent
and fields, a reviewer's approval, the stored contact (or none), what an earlier run wrote,
the store's blockers (suppression, another event's live intent within the quiet period) and
the ramp's hour — the production `plan` is run and its decision checked against the
promises (one follow-up per contact per quiet period under any rule; never to a suppressed
identity or an inactive contact; a new prospect's follow-up waits for approval where the
rule says so; a ramp's hour never grants more than its cap; a re-run never plans twice),
and the review card's words for that decision are checked against it."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from inboxcrm.domain import planning
from inboxcrm.domain.policy import FollowupRule, Ramp, TenantPolicy, load_policies
from inboxcrm.domain.review_card import contact_update, proposed_status
from inboxcrm.domain.shadow import ShadowFacts, planner_facts, shadow_plan
from inboxcrm.schemas.extraction import INTENTS
from tests.helpers.stack import ROOT

FIELDS = ("name", "company")
VALUES = st.one_of(st.none(), st.sampled_from(["Jane", "jane", "JANE", "John", "Initech",
                                               "initech", "Globex", "  "]))
STATUSES = st.sampled_from(["active"] * 3 + ["suppressed", "forgotten", "bounced"])


@st.composite
def policies(draw: st.DrawFn) -> TenantPolicy:
    rules = []
    for number in range(draw(st.sampled_from([1, 2, 3, 0]))):
        rules.append(FollowupRule(
            rule_id=f"rule-{number}", version=draw(st.integers(1, 3)),
            intents=draw(st.lists(st.sampled_from(INTENTS), min_size=1, max_size=4,
                                  unique=True)),
            quiet_period_hours=draw(st.sampled_from([0.0, 1.0, 24.0, 72.0])),
            new_prospect_requires_approval=draw(st.booleans())))
    ramp = draw(st.one_of(st.none(), st.builds(
        Ramp, days=st.just(3.0), max_auto_followups_per_hour=st.integers(0, 3)), st.builds(
        Ramp, days=st.just(3.0), max_auto_followups_per_hour=st.integers(0, 3))))
    return TenantPolicy(
        tenant="acme", mailboxes=["sales@acme.test"], domains=["acme.test"],
        updatable_fields=draw(st.lists(st.sampled_from(FIELDS), unique=True)),
        review_on_conflict=draw(st.lists(st.sampled_from(FIELDS), unique=True)),
        followup_rules=rules, ramp=ramp)


def extraction(intent: str | None, name: str | None, company: str | None) -> dict[str, Any]:
    return {"intent": intent, "sender_email": {"value": "jane@example.test"},
            "contact_name": {"value": name}, "company": {"value": company}}


EARLIER = st.one_of(st.none(), st.builds(
    planning.EarlierPlan,
    decision=st.one_of(st.none(), st.sampled_from(["new_contact", "existing_contact"])),
    intent_id=st.one_of(st.none(), st.just("6f1c2d1e-0000-4000-8000-0000000000aa")),
    intent_status=st.sampled_from(["queued", "awaiting_approval", "sent", "cancelled"]),
    approval_reason=st.one_of(st.none(), st.just(planning.RAMP_LIMIT))))


CLEAR = planning.FollowupFacts(suppressed=False, recent=False)
RECENT = planning.FollowupFacts(suppressed=False, recent=True)


@st.composite
def all_facts(draw: st.DrawFn) -> planning.Facts:
    """Weighted towards the facts that reach the follow-up (an identity, a matching rule,
    nothing blocking, a ramp), where the promises are most easily broken."""
    policy = draw(policies())
    covered = sorted({i for r in policy.followup_rules for i in r.intents})
    intent = draw(st.sampled_from(covered) if covered and draw(st.integers(0, 3)) < 3
                  else st.one_of(st.none(), st.sampled_from(INTENTS)))
    asked = planning.questions(policy, {"intent": intent}, draw(st.sampled_from(
        [60.0, None, 10 * 86_400.0])))
    contact = draw(st.one_of(st.none(), st.builds(planning.ExistingContact, VALUES, VALUES,
                                                  STATUSES)))
    return planning.Facts(
        policy=policy, route=draw(st.sampled_from(["auto"] * 4 + ["review", "opt_out"])),
        identity=draw(st.sampled_from(["jane@example.test"] * 4 + [None])),
        extraction=extraction(intent, draw(VALUES), draw(VALUES)),
        approved=draw(st.booleans()),
        name_candidates=tuple(draw(st.lists(st.sampled_from(["c-1", "c-2"]), max_size=2))),
        contact=contact, pending_contact=contact is None and draw(st.booleans()),
        earlier=draw(st.one_of(st.none(), st.none(), EARLIER)),
        followup=draw(st.sampled_from([CLEAR, CLEAR, RECENT, None]) | st.builds(
            planning.FollowupFacts, st.booleans(), st.booleans())),
        ramp=(planning.RampFacts(asked.ramp_cap, draw(st.integers(0, 4)))
              if asked.ramp_cap is not None else None))


def _stored(facts: planning.Facts) -> dict[str, Any] | None:
    """The card's view of the stored contact."""
    c = facts.contact
    return None if c is None else {"contact_id": "c", "name": c.name, "company": c.company,
                                   "status": c.status}


@settings(max_examples=400, deadline=None, database=None)
@given(facts=all_facts())
def test_the_plan_keeps_its_promises(facts: planning.Facts) -> None:
    decided = planning.plan(facts)
    policy = facts.policy
    name = planning.value(facts.extraction, "contact_name")
    company = planning.value(facts.extraction, "company")
    rule = policy.rule_for_intent(str(facts.extraction["intent"]))

    if facts.identity is None:
        # Never a merge by name: a person confirms or supplies the identity.
        assert decided.outcome == "review" and decided.followup is None
        assert decided.reason == ("candidates" if facts.name_candidates else "no_identity")
        assert decided.candidates == facts.name_candidates
        return
    if facts.route == "opt_out":
        assert decided.outcome == "opted_out" and decided.followup is None
        assert decided.match == ("existing_contact" if facts.contact else "no_contact")
        return
    earlier = facts.earlier
    rerun = earlier is not None and earlier.decision is not None
    if rerun:
        assert decided.match is None and not decided.fill  # nothing recorded twice
    if decided.outcome == "review":
        # Only a conflicting field of a stored contact, and only before approval.
        assert not facts.approved and not rerun and facts.contact is not None
        assert decided.conflict is not None
        assert decided.reason == f"field_conflict:{decided.conflict}"
    if decided.conflict is not None:
        assert decided.conflict in policy.review_on_conflict and facts.contact is not None
        new = {"name": name, "company": company}[decided.conflict]
        old = {"name": facts.contact.name, "company": facts.contact.company}[decided.conflict]
        assert new and old and new.casefold() != old.casefold()
    elif facts.contact is not None and not rerun:
        assert not any({"name": name, "company": company}[f]
                       and {"name": facts.contact.name, "company": facts.contact.company}[f]
                       and str({"name": name, "company": company}[f]).casefold()
                       != str({"name": facts.contact.name,
                               "company": facts.contact.company}[f]).casefold()
                       for f in policy.review_on_conflict)
    for field, value in decided.fill.items():
        assert field in policy.updatable_fields and facts.contact is not None
        assert value == {"name": name, "company": company}[field]
        assert value != {"name": facts.contact.name, "company": facts.contact.company}[field]
    if decided.outcome != "planned":
        return
    followup = decided.followup
    assert followup is not None
    if earlier is not None and earlier.intent_id is not None:
        assert followup.outcome == "reused" and followup.ramp is None  # never a second intent
        return
    if rule is None:
        assert followup.outcome == "no_rule"
        return
    if followup.outcome in ("queued", "awaiting_approval"):
        blockers = facts.followup
        assert blockers is not None and not blockers.suppressed and not blockers.recent
        assert facts.contact is None or facts.contact.status == "active"
    if followup.outcome == "queued" and facts.ramp is not None:
        assert followup.ramp == "granted" and facts.ramp.granted < facts.ramp.cap
    if facts.ramp is not None and facts.ramp.granted >= facts.ramp.cap:
        assert followup.outcome != "queued"
    if followup.outcome == "awaiting_approval" and followup.approval_reason is None:
        assert decided.new_contact and rule.new_prospect_requires_approval
    if followup.approval_reason == planning.RAMP_LIMIT:
        assert facts.ramp is not None and followup.ramp == "held"


EXPECTED = {
    "suppressed": ("not sent: suppressed", "not sent: contact "),
    "quiet_period": ("not sent: quiet period",),
    "awaiting_approval": ("proposed; a new prospect: its send needs a second approval",
                          "proposed; the ramp's automatic follow-ups for this hour are used up"),
    "queued": ("proposed; sent after approval",),
}


@settings(max_examples=300, deadline=None, database=None)
@given(facts=all_facts())
def test_the_card_promises_what_the_plan_decides(facts: planning.Facts) -> None:
    """The card shows `plan`'s decision on the facts as the card reads them (approved, no
    earlier run): "proposed" only for a follow-up the planner creates, and a ramp's hold is
    shown as a hold."""
    facts = planning.Facts(**{**facts.__dict__, "approved": True, "earlier": None,
                              "pending_contact": False})
    decided = planning.plan(facts)
    if decided.followup is None or decided.followup.outcome == "no_rule":
        return
    words = proposed_status(decided, _stored(facts))
    assert words.startswith(EXPECTED[decided.followup.outcome]), (decided, words)
    assert words.startswith("proposed") == decided.followup.planned
    assert ("ramp_limit" in words) == (decided.followup.approval_reason == planning.RAMP_LIMIT)
    update = contact_update(decided)
    assert (f"field_conflict:{decided.conflict}" in update) if decided.conflict else (
        "field_conflict" not in update)
    assert all(field in update for field in decided.fill)


def test_the_card_does_not_promise_what_the_ramp_holds() -> None:
    """The drift this closes: the ramp lived only in the planning activity, so the card said
    "proposed; sent after approval" for a follow-up the planner then held (`ramp_limit`)."""
    rule = FollowupRule(rule_id="ack", version=1, intents=["pricing_request"])
    policy = TenantPolicy(tenant="acme", mailboxes=["sales@acme.test"], domains=["acme.test"],
                          followup_rules=[rule],
                          ramp=Ramp(days=3, max_auto_followups_per_hour=2))
    clear = planning.FollowupFacts(suppressed=False, recent=False)
    cap = planning.ramp_cap(policy, live_for_seconds=3600)
    assert cap == 2
    base = planning.Facts(policy=policy, route="auto", identity="jane@example.test",
                          extraction=extraction("pricing_request", None, None), approved=True,
                          contact=planning.ExistingContact(None, None), followup=clear)
    full = planning.plan(planning.Facts(**{**base.__dict__,
                                          "ramp": planning.RampFacts(cap, granted=2)}))
    assert full.followup is not None and full.followup.ramp == "held"
    assert "ramp_limit" in proposed_status(full, {"status": "active"})
    assert not proposed_status(full, {"status": "active"}).startswith(
        "proposed; sent after approval")
    room = planning.plan(planning.Facts(**{**base.__dict__,
                                          "ramp": planning.RampFacts(cap, granted=1)}))
    assert room.followup is not None and room.followup.ramp == "granted"
    assert proposed_status(room, {"status": "active"}) == "proposed; sent after approval"
    # Past the ramp's days there is no cap to ask about.
    assert planning.ramp_cap(policy, live_for_seconds=4 * 86_400) is None


def test_an_inactive_contact_is_not_promised_a_follow_up() -> None:
    """The card once matched the word "suppressed" in its own display lines, so a forgotten
    contact was shown "proposed; sent after approval" while the planner sends nothing to a
    contact that is not active."""
    rule = FollowupRule(rule_id="ack", version=1, intents=["pricing_request"])
    policy = TenantPolicy(tenant="acme", mailboxes=["sales@acme.test"], domains=["acme.test"],
                          followup_rules=[rule])
    decided = planning.plan(planning.Facts(
        policy=policy, route="auto", identity="jane@example.test",
        extraction=extraction("pricing_request", None, None), approved=True,
        contact=planning.ExistingContact(None, None, "forgotten")))
    assert proposed_status(decided, {"status": "forgotten"}) == "not sent: contact forgotten"


def test_a_follow_up_under_another_rule_keeps_the_quiet_period() -> None:
    """The planner's quiet period spans every rule (`FOLLOWUP_BLOCKERS`); the card asks the
    same statement, so another rule's recent intent is reported as the planner sees it."""
    rule = FollowupRule(rule_id="renewal", version=1, intents=["pricing_request"],
                        quiet_period_hours=24)
    policy = TenantPolicy(tenant="acme", mailboxes=["sales@acme.test"], domains=["acme.test"],
                          followup_rules=[rule])
    decided = planning.plan(planning.Facts(
        policy=policy, route="auto", identity="jane@example.test",
        extraction=extraction("pricing_request", None, None), approved=True,
        contact=planning.ExistingContact(None, None),
        followup=planning.FollowupFacts(suppressed=False, recent=True)))
    assert proposed_status(decided, {"status": "active"}) == "not sent: quiet period (24 h)"


ACME = load_policies(ROOT / "policies")["acme"]


@st.composite
def worded_policies(draw: st.DrawFn) -> TenantPolicy:
    """Generated rules and field policy over the stored acme policy, so its templates
    exist (a shadow plan names the rule's version and template)."""
    shape = draw(policies())
    rules = [r.model_copy(update={"template_id": ACME.followup_rules[0].template_id})
             for r in shape.followup_rules]
    return ACME.model_copy(update={"followup_rules": rules,
                                   "updatable_fields": shape.updatable_fields,
                                   "review_on_conflict": shape.review_on_conflict})


@settings(max_examples=200, deadline=None, database=None)
@given(policy=worded_policies(), intent=st.one_of(st.none(), st.sampled_from(INTENTS)),
       name=VALUES, company=VALUES, stored_name=VALUES, stored_company=VALUES,
       known=st.booleans(), created=st.booleans(), status=STATUSES,
       suppressed=st.booleans(), recent=st.booleans())
def test_shadow_mode_plans_with_the_planner(
        policy: TenantPolicy, intent: str | None, name: str | None, company: str | None,
        stored_name: str | None, stored_company: str | None, known: bool, created: bool,
        status: str, suppressed: bool, recent: bool) -> None:
    """A shadowed item's stored plan is `plan`'s decision on the shadow facts, in its words."""
    shadow = ShadowFacts(contact_id="c-1" if known else None, contact_name=stored_name,
                         contact_company=stored_company, contact_status=status,
                         suppressed=suppressed, recent_intent=recent,
                         shadow_created=created)
    given_extraction = extraction(intent, name, company)
    stored = shadow_plan("auto", [], given_extraction, "jane@example.test", policy, shadow)
    decided = planning.plan(planner_facts("auto", given_extraction, "jane@example.test",
                                          policy, shadow))
    if decided.outcome == "review":
        assert stored["review_reason"] == decided.reason and stored["followup"] is None
        return
    assert decided.followup is not None
    action = stored["followup"]["action"]
    assert action == {"queued": "send", "awaiting_approval": "await_approval"}.get(
        decided.followup.outcome, "none")
    assert stored["contact"]["fields"] == (list(decided.fill) if known else
                                           stored["contact"]["fields"])
