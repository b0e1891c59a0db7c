"""The scope rule of docs/consent.md, held in the pure parts the planner, the review card and
the send share: a `marketing` suppression stops a marketing rule's follow-up and leaves a
service reply alone; `all` stops both; the CRM's opt-out stops any send; a policy cannot
narrow a bounce or a complaint."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from inboxcrm.activities.consent import INBOXCRM_ONLY, ConsentView
from inboxcrm.activities.send import _ineligible
from inboxcrm.domain import planning
from inboxcrm.domain.policy import FollowupRule, TenantPolicy
from inboxcrm.operator.audit_story import sentence


def _rule(purpose: str) -> FollowupRule:
    return FollowupRule.model_validate({"rule_id": "r", "version": 1,
                                        "intents": ["pricing_request"], "purpose": purpose})


def _row(**over: Any) -> dict[str, Any]:
    return {"status": "queued", "suppressed": False, "suppression_scope": None,
            "contact_status": "active", **over}


@pytest.mark.parametrize("scope, purpose, stopped", [
    ("all", "service", True), ("all", "marketing", True),
    ("marketing", "service", False), ("marketing", "marketing", True)])
def test_a_suppression_stops_what_its_scope_says(scope: str, purpose: str,
                                                 stopped: bool) -> None:
    row = _row(suppressed=True, suppression_scope=scope)
    assert (_ineligible(row, purpose) == "suppressed") is stopped  # type: ignore[arg-type]


def test_the_crms_opt_out_stops_any_send_and_nothing_else_does() -> None:
    opted = ConsentView(checked="crm_and_inboxcrm", opted_out=True, provider="hubspot",
                        field="hs_email_optout", record_id="1")
    assert _ineligible(_row(), "service", opted) == "crm_opt_out"  # type: ignore[arg-type]
    assert _ineligible(_row(), "service", INBOXCRM_ONLY) is None  # type: ignore[arg-type]
    detail = {"intent_id": "x", "eligible": False, "reason": "crm_opt_out",
              "crm_field": "hs_email_optout",
              "consent": {**opted.detail(), "purpose": "service",
                          "lawful_basis": "reply_to_inquiry"}}
    told = sentence("eligibility_checked", detail)
    assert "hs_email_optout says opted out" in told and "reply_to_inquiry" in told


def test_a_policy_cannot_narrow_a_bounce() -> None:
    base = {"tenant": "t", "mailboxes": ["a@t.test"], "domains": ["t.test"]}
    policy = TenantPolicy.model_validate({**base,
                                          "suppression_scopes": {"list_unsubscribe":
                                                                 "marketing"}})
    assert policy.suppression_scope("list_unsubscribe") == "marketing"
    assert policy.suppression_scope("opt_out_request") == "all"
    with pytest.raises(ValidationError, match="bounces and complaints"):
        TenantPolicy.model_validate({**base, "suppression_scopes": {"bounced": "marketing"}})


def test_rules_are_service_replies_to_an_inquiry_unless_told() -> None:
    rule = FollowupRule.model_validate({"rule_id": "r", "version": 1,
                                        "intents": ["pricing_request"]})
    assert (rule.purpose, rule.lawful_basis) == ("service", "reply_to_inquiry")
    assert _rule("marketing").purpose == "marketing"


@pytest.mark.parametrize("purpose, outcome", [("service", "queued"),
                                              ("marketing", "suppressed")])
def test_the_planner_holds_a_marketing_suppression_to_marketing_rules(
        purpose: str, outcome: str) -> None:
    policy = TenantPolicy.model_validate({
        "tenant": "t", "mailboxes": ["a@t.test"], "domains": ["t.test"],
        "followup_rules": [{"rule_id": "r", "version": 1, "intents": ["pricing_request"],
                            "purpose": purpose}]})
    facts = planning.Facts(
        policy=policy, route="auto", identity="p@example.com",
        extraction={"intent": "pricing_request"},
        contact=planning.ExistingContact(None, None),
        followup=planning.FollowupFacts(suppressed=False, recent=False,
                                        marketing_suppressed=True))
    decision = planning.plan(facts).followup
    assert decision is not None and decision.outcome == outcome
