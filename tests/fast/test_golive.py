"""Going live without a stack: the shadow plan (the planner's rules as a pure function), the
report's counts, the second extractor over real HTTP (the OpenAI-compatible stub), and the
policy's go-live settings. What the steps do to PostgreSQL and the sandbox is
tests/test_golive.py's job."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inboxcrm.domain.extraction import RulesExtractor
from inboxcrm.domain.extraction.llm import LLMExtractor
from inboxcrm.domain.policy import (
    FollowupRule,
    PolicyError,
    TenantPolicy,
    get_policy,
    load_policies,
)
from inboxcrm.domain.shadow import (
    ShadowFacts,
    comparison_extractor,
    describe,
    second_opinion,
    shadow_plan,
    summarise,
)
from inboxcrm.platform.config import Settings
from tests.helpers.corpus import CASES
from tests.helpers.llm_stub import StubServer, content

JANE = "jane.doe@initech.example"


def extraction(intent: str = "pricing_request", name: str | None = "Jane Doe",
               company: str | None = "Initech") -> dict[str, Any]:
    def field(value: str | None) -> dict[str, Any]:
        return {"value": value, "confidence": 0.9 if value else 0.0, "evidence": value}
    return {"sender_email": field(JANE), "contact_name": field(name),
            "company": field(company), "intent": intent, "possible_opt_out": False,
            "needs_human_review": False}


@pytest.fixture
def acme(monkeypatch: pytest.MonkeyPatch) -> TenantPolicy:
    monkeypatch.delenv("INBOXCRM_POLICY_DIR", raising=False)
    return get_policy("acme")


@pytest.fixture
def globex(monkeypatch: pytest.MonkeyPatch) -> TenantPolicy:
    monkeypatch.delenv("INBOXCRM_POLICY_DIR", raising=False)
    return get_policy("globex")


def test_a_new_prospect_would_be_created_and_acknowledged(acme: TenantPolicy) -> None:
    plan = shadow_plan("auto", [], extraction(), JANE, acme, ShadowFacts())
    assert plan["outcome"] == "would_complete"
    assert plan["contact"] == {"action": "create", "contact_id": None,
                               "fields": ["name", "company"]}
    assert plan["crm"] == {"upsert": True, "note": True}
    assert plan["followup"]["action"] == "send"
    ack = acme.rule_by_id("ack")
    assert ack is not None
    ref = acme.template_for(ack).ref
    assert plan["followup"]["rule_id"] == "ack" and plan["followup"]["template_id"] == ref
    assert plan["followup"]["rule_version"] == acme.rule_version(ack)
    assert describe(plan) == f"contact create (name, company); follow-up {ref} sent"


def ack_rule(policy: TenantPolicy) -> FollowupRule:
    rule = policy.rule_by_id("ack")
    assert rule is not None
    return rule


def test_the_plan_holds_no_personal_data(acme: TenantPolicy) -> None:
    """Stored on the event and printed by the report: references, reasons, field names."""
    for route in ("auto", "review", "ignore", "opt_out"):
        for facts in (ShadowFacts(), ShadowFacts(contact_id="c-1", contact_name="Jane Roe",
                                                 contact_company="Initech")):
            text = json.dumps(shadow_plan(route, ["opt_out_phrase"], extraction(), JANE,
                                          acme, facts))
            # A template reference is `<name>@<version>`: not an address.
            text = text.replace(acme.template_for(ack_rule(acme)).ref, "")
            for secret in ("jane", "Jane", "@", "Initech"):
                assert secret not in text, (route, text)


def test_a_second_message_of_the_same_person_matches_and_keeps_the_quiet_period(
    acme: TenantPolicy,
) -> None:
    plan = shadow_plan("auto", [], extraction(), JANE, acme,
                       ShadowFacts(shadow_created=True, recent_shadow_followup=True))
    assert plan["contact"]["action"] == "match_shadowed"
    ack = acme.rule_by_id("ack")
    assert ack is not None
    assert plan["followup"] == {"action": "none", "reason": "quiet_period", "rule_id": "ack",
                                "rule_version": acme.rule_version(ack),
                                "template_id": acme.template_for(ack).ref}
    assert plan["outcome"] == "would_complete"


def test_an_existing_contact_is_updated_or_sent_to_a_person_as_the_planner_would(
    acme: TenantPolicy,
) -> None:
    same = ShadowFacts(contact_id="c-1", contact_name="Jane Doe", contact_company=None,
                       contact_status="active")
    plan = shadow_plan("auto", [], extraction(), JANE, acme, same)
    assert plan["contact"] == {"action": "update", "contact_id": "c-1", "fields": ["company"]}
    conflict = ShadowFacts(contact_id="c-1", contact_name="Janet Smith",
                           contact_status="active")
    plan = shadow_plan("auto", [], extraction(), JANE, acme, conflict)
    assert plan["outcome"] == "would_review" and plan["review_reason"] == "field_conflict:name"
    assert plan["crm"] is None and plan["followup"] is None
    suppressed = ShadowFacts(contact_id="c-1", contact_name="Jane Doe",
                             contact_status="suppressed", suppressed=True)
    plan = shadow_plan("auto", [], extraction(), JANE, acme, suppressed)
    assert plan["followup"]["action"] == "none" and plan["followup"]["reason"] == "suppressed"


def test_routes_that_need_no_planner(acme: TenantPolicy, globex: TenantPolicy) -> None:
    assert shadow_plan("ignore", ["auto_reply"], {}, None, acme, ShadowFacts())["outcome"] == \
        "would_ignore"
    review = shadow_plan("review", ["prompt_injection"], {}, None, acme, ShadowFacts())
    assert (review["outcome"], review["review_reason"]) == ("would_review", "prompt_injection")
    nobody = shadow_plan("auto", [], extraction(), None, acme,
                         ShadowFacts(name_candidates=("c-1", "c-2")))
    assert nobody["review_reason"] == "candidates"
    opt_out = shadow_plan("opt_out", ["opt_out_phrase"], {}, JANE, acme, ShadowFacts())
    assert (opt_out["outcome"], opt_out["suppression"]) == ("would_suppress", "recorded")
    # globex asks a reviewer before the first follow-up to a new prospect.
    approval = shadow_plan("auto", [], extraction(), JANE, globex, ShadowFacts())
    assert approval["outcome"] == "would_review"
    assert approval["followup"]["action"] == "await_approval"
    assert approval["contact"]["action"] == "create"  # the CRM writes happen before the wait


def test_the_report_counts_what_would_have_happened(acme: TenantPolicy) -> None:
    differs = {"extractor": "llm:m", "route": "review", "reasons": ["prompt_injection"],
               "differs": True, "unavailable": None}
    plans = [
        shadow_plan("auto", [], extraction(), JANE, acme, ShadowFacts(), differs),
        shadow_plan("auto", [], extraction(), JANE, acme,
                    ShadowFacts(shadow_created=True, recent_shadow_followup=True)),
        shadow_plan("review", ["prompt_injection"], {}, None, acme, ShadowFacts()),
        shadow_plan("ignore", ["auto_reply"], {}, None, acme, ShadowFacts()),
    ]
    items = [{"delivery_id": f"D-{n}", "shadow_plan": p} for n, p in enumerate(plans)]
    items.append({"delivery_id": "D-in-flight", "shadow_plan": None})
    summary = summarise(items)
    assert summary["items"] == 5 and summary["not_planned_yet"] == 1
    assert summary["by_route"] == {"auto": 2, "ignore": 1, "review": 1}
    assert summary["by_reason"] == {"auto_reply": 1, "prompt_injection": 1}
    assert summary["contacts"] == {"would_create": 1, "would_update": 0}
    assert summary["followups"]["would_send"] == 1
    assert summary["followups"]["not_sent"] == {"quiet_period": 1}
    assert summary["would_wait_for_a_person"] == {"prompt_injection": 1}
    assert summary["second_extractor"]["compared"] == 1
    assert summary["second_extractor"]["routed_differently"] == [{
        "delivery_id": "D-0", "route": "auto", "second_route": "review",
        "second_reasons": ["prompt_injection"], "extractor": "llm:m"}]


def test_the_second_extractor_is_the_one_not_in_use() -> None:
    assert comparison_extractor(Settings(extractor="rules", llm_base_url=None)) is None
    llm = comparison_extractor(Settings(extractor="rules", llm_base_url="http://127.0.0.1:9/v1",
                                        llm_model="m"))
    assert isinstance(llm, LLMExtractor)
    rules = comparison_extractor(Settings(extractor="llm", llm_base_url="http://127.0.0.1:9/v1"))
    assert isinstance(rules, RulesExtractor)


@pytest.fixture(scope="module")
def llm_stub() -> Iterator[StubServer]:
    server = StubServer().start()
    yield server
    server.stop()


async def test_the_llm_would_route_a_message_differently(
    llm_stub: StubServer, acme: TenantPolicy,
) -> None:
    """The rules route a plain pricing question `auto`; a model that finds no sender sends it
    to review: the second opinion says so. A model that cannot answer never holds it up."""
    case = next(c for c in CASES if c.id == "auto_pricing_plain")
    llm = comparison_extractor(Settings(extractor="rules", llm_base_url=llm_stub.base_url,
                                        llm_model="stub-model", llm_api_key="k"))
    assert isinstance(llm, LLMExtractor)
    llm.backoff_seconds = 0.01
    no_sender = {"sender_email": {"value": None, "confidence": 0.0, "evidence": None},
                 "contact_name": {"value": None, "confidence": 0.0, "evidence": None},
                 "company": {"value": None, "confidence": 0.0, "evidence": None},
                 "intent": "pricing_request", "possible_opt_out": False,
                 "needs_human_review": True}
    llm_stub.script(content(json.dumps(no_sender)))
    opinion = await second_opinion(case.raw, acme, "standard", "auto", llm)
    assert opinion["differs"] is True and opinion["route"] == "review"
    assert opinion["extractor"] == "llm:stub-model:prompt-v2"
    llm_stub.script()  # no answer left: the stub answers 503
    unavailable = await second_opinion(case.raw, acme, "standard", "auto", llm)
    assert unavailable["differs"] is False and unavailable["unavailable"]


def _policy_dir(tmp_path: Path, extra: dict[str, Any]) -> Path:
    policies = Path(__file__).parents[2] / "policies"
    tmp_path.mkdir(parents=True, exist_ok=True)
    document = json.loads((policies / "acme.json").read_text())
    (tmp_path / "acme.json").write_text(json.dumps(document | extra))
    shutil.copytree(policies / "acme", tmp_path / "acme")  # its templates
    return tmp_path


def test_a_policy_may_start_in_shadow_with_a_ramp(tmp_path: Path) -> None:
    policies = load_policies(_policy_dir(tmp_path, {
        "mode": "shadow", "ramp": {"days": 3, "max_auto_followups_per_hour": 20},
        "notifications": {"webhook": {"url_env": "INBOXCRM_TENANT_ACME_WEBHOOK"}}}))
    acme = policies["acme"]
    assert acme.mode == "shadow" and acme.ramp is not None
    assert acme.ramp.max_auto_followups_per_hour == 20
    assert acme.notifications is not None and acme.notifications.webhook is not None
    assert get_policy("acme").mode == "live"  # the demo tenant is live


@pytest.mark.parametrize("webhook", [
    {"url": "https://hooks.slack.com/services/T000/B000/XXXX"},
    "https://hooks.slack.com/services/T000/B000/XXXX",
])
def test_a_webhook_url_in_the_policy_file_is_refused(tmp_path: Path, webhook: Any) -> None:
    with pytest.raises(PolicyError, match="by reference") as refused:
        load_policies(_policy_dir(tmp_path, {"notifications": {"webhook": webhook}}))
    assert "hooks.slack.com" not in str(refused.value)


@pytest.mark.parametrize("reference", [
    {"url_env": "DATABASE_URL"},                      # the installation's own
    {"url_env": "INBOXCRM_DECISION_SECRET"},
    {"url_env": "INBOXCRM_TENANT_GLOBEX_WEBHOOK"},    # another tenant's
    {"url_env": "INBOXCRM_TENANT_ACME_"},             # the bare prefix
    {"url_file": "/etc/inboxcrm/webhook.url"},        # no tenant secrets directory
    {"url_file": ".data/notify/../../policies/acme.json"},
    {"url_file": "README.md"},
])
def test_a_webhook_reference_outside_the_tenants_namespace_is_refused(
    tmp_path: Path, reference: dict[str, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("INBOXCRM_TENANT_SECRETS_DIR", raising=False)
    with pytest.raises(PolicyError, match="notifications.webhook.*outside the tenant's "
                       "namespace"):
        load_policies(_policy_dir(tmp_path / "p", {"notifications": {"webhook": reference}}))


def test_a_webhook_reference_inside_the_tenants_namespace_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    secrets = tmp_path / "secrets"
    (secrets / "acme").mkdir(parents=True)
    (secrets / "acme" / "webhook.url").write_text("https://hooks.example/T/B/x\n")
    monkeypatch.setenv("INBOXCRM_TENANT_SECRETS_DIR", str(secrets))
    for n, reference in enumerate([
        {"url_env": "INBOXCRM_TENANT_ACME_WEBHOOK"},
        {"url_file": str(secrets / "acme" / "webhook.url")},
        {"url_file": ".data/notify/acme-webhook.url"},
    ]):
        policies = load_policies(_policy_dir(tmp_path / str(n),
                                             {"notifications": {"webhook": reference}}))
        assert policies["acme"].notifications is not None


def test_a_webhook_needs_exactly_one_reference(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="exactly one of url_env or url_file"):
        load_policies(_policy_dir(tmp_path, {"notifications": {"webhook": {
            "url_env": "A_URL", "url_file": "/run/secrets/url"}}}))


def test_a_notice_message_links_the_card_and_says_why(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from inboxcrm.domain.notices import slack_message

    seen = datetime(2024, 6, 4, 10, 0, tzinfo=UTC)
    workflow_id = "inbound/acme/standard/sales@acme.test/D-1"
    message = slack_message("acme", [
        {"kind": "new", "workflow_id": workflow_id, "reason": "field_conflict:name",
         "owner": "sales-ops", "state": "awaiting_review", "first_seen": seen,
         "escalate_at": seen},
        {"kind": "overdue", "workflow_id": workflow_id, "reason": "<script>", "owner": "ops",
         "state": "blocked", "first_seen": seen, "escalate_at": seen},
    ], "https://relay.example/")
    assert message["text"] == "inboxcrm · acme: 1 new review task, 1 overdue review task"
    first, second = (b["text"]["text"] for b in message["blocks"][1:])
    assert first.startswith("*new* · `field_conflict:name` · awaiting_review · owner sales-ops")
    assert ("<https://relay.example/review/inbound%2Facme%2Fstandard%2Fsales%40acme.test%2FD-1"
            "|review card>") in first
    assert "&lt;script&gt;" in second and "due 2024-06-04 10:00 UTC" in second
    assert "@" not in json.dumps(message)


def test_the_webhook_url_is_read_from_where_the_policy_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from inboxcrm.domain.notices import webhook_url
    from inboxcrm.domain.policy import WebhookChannel

    monkeypatch.setenv("INBOXCRM_TEST_WEBHOOK", " https://hooks.example/T/B/x \n")
    assert webhook_url(WebhookChannel(url_env="INBOXCRM_TEST_WEBHOOK")) == \
        "https://hooks.example/T/B/x"
    monkeypatch.delenv("INBOXCRM_TEST_WEBHOOK")
    assert webhook_url(WebhookChannel(url_env="INBOXCRM_TEST_WEBHOOK")) is None
    (tmp_path / "url").write_text("ftp://nope\n")
    assert webhook_url(WebhookChannel(url_file="url"), root=tmp_path) is None
    (tmp_path / "url").write_text("http://127.0.0.1:9/hook\n")
    assert webhook_url(WebhookChannel(url_file="url"), root=tmp_path) == \
        "http://127.0.0.1:9/hook"
    assert webhook_url(WebhookChannel(url_file=str(tmp_path / "missing"))) is None


def test_retention_periods_load_and_the_audit_trail_outlives_the_content(
    tmp_path: Path,
) -> None:
    policies = load_policies(_policy_dir(tmp_path / "ok", {
        "retention": {"raw_days": 30, "evidence_days": 60, "audit_days": 60}}))
    assert policies["acme"].retention.raw_days == 30
    for n, periods in enumerate([{"raw_days": 90, "audit_days": 30},
                                 {"audit_days": 30},            # content kept for ever
                                 {"raw_days": 0},
                                 {"raw_days": 10, "messages_days": 5}]):
        with pytest.raises(PolicyError, match="retention"):
            load_policies(_policy_dir(tmp_path / str(n), {"retention": periods}))
