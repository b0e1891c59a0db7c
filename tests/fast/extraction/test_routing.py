"""The labelled set through the rules extractor: expected routes and reasons, and the hard
bar - nothing that should be ignored, opted out or reviewed is routed auto, and no
identity is ever taken from a body, a quoted reply or an instruction."""

from __future__ import annotations

import importlib.util
import logging
from collections import Counter
from pathlib import Path

import pytest

from inboxcrm.domain.extraction import extract_and_route, minimise
from inboxcrm.domain.extraction.route import (
    ignore_reasons,
    validate_and_route,
)
from inboxcrm.domain.extraction.rules import extract_rules
from inboxcrm.domain.policy import TenantPolicy
from inboxcrm.schemas.extraction import ExtractedField, Extraction
from tests.helpers.corpus import CASES, ROUTES, Case, mail
from tests.helpers.routing import assert_safe

OPT_OUT_LANGUAGES = ("en", "de", "fr", "es", "pt", "it", "nl")


def test_corpus_size_and_coverage() -> None:
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)
    routes = Counter(c.route for c in CASES)
    assert all(routes[r] >= 5 for r in ROUTES), routes
    reasons = {r for c in CASES for r in c.reasons}
    required = {
        "auto_submitted", "auto_reply", "null_return_path", "multipart_report", "mailer_daemon",
        "bulk_list", "bulk_precedence", "own_mailbox", "own_domain", "opt_out_phrase",
        "missing_sender", "invalid_sender", "different_contact_address",
        "forwarded_sender_mismatch", "prompt_injection", "complaint", "legal_threat",
        "several_identities", "shared_mailbox", "noreply_sender", "empty_message",
    }
    assert required <= reasons, required - reasons
    tags = {t for c in CASES for t in c.tags}
    assert {"web_form", "shared_inbox", "plus_address", "idn", "html_only", "huge", "broken",
            "forwarded", "injection", "quoted", "rfc2047", "charset"} <= tags
    assert all(lang in tags for lang in OPT_OUT_LANGUAGES)
    for lang in OPT_OUT_LANGUAGES:
        assert any(c.route == "opt_out" and lang in c.tags for c in CASES), lang
    injection_places = {c.id for c in CASES if "injection" in c.tags}
    assert {"review_injection_body", "review_injection_display_name",
            "review_injection_subject"} <= injection_places


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_rules_route(case: Case, acme: TenantPolicy) -> None:
    outcome = await extract_and_route(case.raw, acme)
    expected = case.rules_miss or case.route
    assert outcome.route == expected, (outcome.route, outcome.reasons)
    for reason in case.reasons:
        assert reason in outcome.reasons, (reason, outcome.reasons)
    if case.canonical is not None and outcome.route in ("auto", "opt_out"):
        assert outcome.canonical_email == case.canonical
    if case.intent is not None:
        assert outcome.extraction.intent == case.intent
    if case.name is not None:
        assert outcome.extraction.contact_name.value == case.name
    if case.company is not None or "freemail" in case.tags:
        assert outcome.extraction.company.value == case.company
    assert outcome.extractor == "rules" and outcome.extractor_version.startswith("rules-")
    assert_safe(case, outcome, acme)


async def test_no_logging_of_content(acme: TenantPolicy, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for case in CASES:
        await extract_and_route(case.raw, acme)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "initech" not in text and "@" not in text


def test_ignore_is_header_only(acme: TenantPolicy) -> None:
    raw = mail(headers=[("Auto-Submitted", "auto-replied; owner-email=x@y.example")])
    assert ignore_reasons(minimise(raw), acme) == ["auto_submitted"]
    raw = mail(headers=[("List-Unsubscribe", "<mailto:u@x.example>")])
    assert ignore_reasons(minimise(raw), acme) == []  # a lone List-Unsubscribe is not a list


def _extraction(**fields: ExtractedField) -> Extraction:
    base = extract_rules(minimise(mail(subject="Pricing", body="How much?\n\nJane")))
    return base.model_copy(update=fields)


def test_evidence_must_occur_in_message(acme: TenantPolicy) -> None:
    msg = minimise(mail(subject="Pricing", body="How much?\n\nJane"))
    fake = ExtractedField(value="Globex Inc", confidence=0.99, evidence="Globex Inc, Berlin")
    decision = validate_and_route(msg, _extraction(company=fake), acme)
    assert decision.route == "review"
    assert "evidence_not_found:company" in decision.reasons
    assert decision.extraction.company.value is None  # distrusted field dropped
    missing = ExtractedField(value="Jane", confidence=0.99, evidence=None)
    decision = validate_and_route(msg, _extraction(contact_name=missing), acme)
    assert "evidence_not_found:contact_name" in decision.reasons


def test_confidence_thresholds_from_policy(acme: TenantPolicy) -> None:
    msg = minimise(mail(subject="Pricing", body="How much?\n\nJane"))
    weak = ExtractedField(value="jane.doe@initech.example", confidence=0.5,
                          evidence="jane.doe@initech.example")
    decision = validate_and_route(msg, _extraction(sender_email=weak), acme)
    assert decision.route == "review" and decision.canonical_email is None
    assert "low_confidence:sender_email" in decision.reasons
    lenient = acme.model_copy(update={"thresholds": acme.thresholds.model_copy(
        update={"sender_email": 0.4})})
    decision = validate_and_route(msg, _extraction(sender_email=weak), lenient)
    assert decision.route == "auto" and decision.canonical_email == "jane.doe@initech.example"


def test_sender_corroborated_against_headers(acme: TenantPolicy) -> None:
    msg = minimise(mail(subject="Pricing", body="How much? Also cc jane.doe@initech.example"))
    body_only = ExtractedField(value="other@initech.example", confidence=1.0,
                               evidence="How much?")
    decision = validate_and_route(msg, _extraction(sender_email=body_only), acme)
    assert "sender_not_corroborated" in decision.reasons and decision.canonical_email is None


def test_model_only_opt_out_goes_to_review(acme: TenantPolicy) -> None:
    msg = minimise(mail(subject="Pricing", body="How much?\n\nJane"))
    decision = validate_and_route(
        msg, _extraction().model_copy(update={"possible_opt_out": True}), acme)
    assert decision.route == "review" and "possible_opt_out" in decision.reasons


def test_plus_address_folding_policy(acme: TenantPolicy) -> None:
    raw = mail(from_="Jane <Jane+News@Initech.example>", subject="Pricing", body="Price?")
    folded = acme.model_copy(update={"identity": acme.identity.model_copy(
        update={"fold_plus": True})})
    msg = minimise(raw)
    assert validate_and_route(msg, extract_rules(msg), acme).canonical_email == \
        "jane+news@initech.example"
    assert validate_and_route(msg, extract_rules(msg), folded).canonical_email == \
        "jane@initech.example"


class _Broken:
    name = "broken"
    version = "broken-1"

    async def extract(self, message: object) -> Extraction:
        raise KeyError("a defect")


async def test_extractor_defect_goes_to_review(acme: TenantPolicy) -> None:
    outcome = await extract_and_route(mail(subject="Pricing", body="Price?"), acme, _Broken())
    assert outcome.route == "review" and outcome.reasons[0] == "extractor_failed"
    assert outcome.canonical_email is None


BENCH = Path(__file__).resolve().parents[3] / "bench" / "extraction_quality.py"


async def test_bench_reports_no_unsafe_routing() -> None:
    path = BENCH
    spec = importlib.util.spec_from_file_location("extraction_quality_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = await module.run("acme")
    assert result["messages"] == len(CASES)
    assert result["unsafe_auto_routings"] == [] and result["identity_leaks"] == []
    assert set(result["per_route"]) == set(ROUTES)
    assert result["per_route"]["ignore"]["precision"] == 1.0
    assert result["per_route"]["opt_out"]["recall"] == 1.0
