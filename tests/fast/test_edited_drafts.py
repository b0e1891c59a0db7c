"""Drafts a reviewer can edit (issue 37, docs/architecture.md §6 "Edited drafts"): the pure
parts. A draft is checked against the limits its rule declares (length, the fixed parts
that must stay) and refused naming the limit, never the text; the proof covers the draft's
hash (and a proof made before it still verifies); the workflow's own check takes a draft
only at a follow-up's approval under the patch; only the policy's approver approves; a rule
that sends automatically only to known customers holds anyone else's follow-up; a
sensitive attribute in the writer's text routes to review; the desk's card offers the text
to edit with its limits."""

from __future__ import annotations

import json
import shutil
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from inboxcrm.domain import planning
from inboxcrm.domain.drafts import check, terms_of
from inboxcrm.domain.extraction import signals
from inboxcrm.domain.followup import (
    DraftTerms,
    draft_refusal,
    draft_refusal_text,
    draft_sha256,
    normalised_draft,
)
from inboxcrm.domain.policy import PolicyError, get_policy, load_policies
from inboxcrm.domain.templates import from_sources
from inboxcrm.ingress.review import decision_request, edited_draft
from inboxcrm.platform.config import Settings
from inboxcrm.platform.decisions import DecisionRequest, decision_body, lacks_authority
from inboxcrm.platform.reviewer_identity import (
    DecisionClaim,
    Principal,
    sign_decision,
    verify_decision,
)
from inboxcrm.schemas.contract import Decision
from inboxcrm.schemas.models import ItemState, OpenReview, ReviewDecision
from inboxcrm.workflows.decisions import REVIEW_ACTIONS, Waiting, check_action, parse_decision

WF = "inbound/initech/standard/sales/7"
SECRET = "s" * 40
TERMS = DraftTerms(60, (("opt_out_url", "https://x.test/u/T"), ("postal_address", "1 Road"),
                        ("signature", "The team")))
GOOD = "Hi Jo,\nsee you Monday.\nThe team\n1 Road\nhttps://x.test/u/T"


ROOT = Path(__file__).resolve().parents[2]


def test_a_draft_within_its_limits_passes_and_each_limit_is_named() -> None:
    assert draft_refusal(GOOD, TERMS) is None
    assert draft_refusal(GOOD + "x" * 60, TERMS) == "draft_too_long"
    assert draft_refusal(GOOD.replace("The team", "Jo"), TERMS) == "draft_missing:signature"
    assert draft_refusal(GOOD.replace("https://x.test/u/T", ""), TERMS) == (
        "draft_missing:opt_out_url")
    assert draft_refusal("  \n", TERMS) == "draft_empty"
    assert draft_refusal(GOOD, None) == "draft_not_editable"
    # The words a person reads name the limit, and never the text.
    too_long = draft_refusal_text("draft_too_long", TERMS)
    assert "at most 60 characters" in too_long and "max_chars" in too_long
    missing = draft_refusal_text("draft_missing:signature", TERMS)
    assert "the signature" in missing and "draft.keep" in missing
    for code in ("draft_too_long", "draft_missing:signature", "draft_not_found"):
        assert "see you Monday" not in draft_refusal_text(code, TERMS)


def test_line_ends_are_normalised_before_hashing() -> None:
    assert normalised_draft("a\r\nb\rc") == "a\nb\nc"
    assert draft_sha256("a\r\nb") == draft_sha256("a\nb")
    assert draft_sha256("a\nb") != draft_sha256("a\nb ")


def test_the_policys_template_declares_the_limits_and_the_fixed_parts_render() -> None:
    settings = Settings(unsubscribe_secret="u" * 32)
    terms = terms_of("initech", "ack", "00000000-0000-0000-0000-000000000001", settings)
    assert terms is not None and terms.max_chars == 1200
    fixed = dict(terms.fixed)
    assert set(fixed) == {"opt_out_url", "postal_address", "signature"}
    assert fixed["signature"] == "The Initech sales team"
    assert fixed["opt_out_url"].startswith(settings.public_relay_base_url)
    assert terms_of("acme", "ack", None, settings) is None  # acme declares no draft
    assert check("x", None).refused == "draft_not_editable"


def _claim(sha: str | None) -> DecisionClaim:
    return DecisionClaim(decider="reviewer:ann", path="cli", workflow_id=WF, wait_id="w2-followup",
                         action="approve", reviewer="ann", draft_sha256=sha)


def test_the_proof_covers_the_drafts_hash_and_old_proofs_still_verify() -> None:
    proof = sign_decision(SECRET, _claim(draft_sha256(GOOD)))
    assert verify_decision(SECRET, proof, _claim(draft_sha256(GOOD)))
    # The proof replayed with another text (its hash) is not this decision's.
    assert not verify_decision(SECRET, proof, _claim(draft_sha256(GOOD + "!")))
    assert not verify_decision(SECRET, proof, _claim(None))
    # Without a draft the signed message is the one signed before drafts existed.
    assert b"draft_sha256" not in _claim(None).message()
    ann = Principal("reviewer:ann", "ann", frozenset({"initech"}), 2, role="approver")
    body = decision_body(DecisionRequest(WF, Decision.APPROVE, ann, "cli", reviewer="ann",
                                         draft_sha256=draft_sha256(GOOD)), SECRET,
                         "w2-followup")
    assert body.draft_sha256 == draft_sha256(GOOD)
    assert verify_decision(SECRET, body.proof, _claim(draft_sha256(GOOD)))


def _followup_wait(drafts: bool = True, role: str | None = "approver") -> Waiting:
    return Waiting("followup", "unknown_customer", set(REVIEW_ACTIONS), intent_id="i-1",
                   seq=2, required_role=role, drafts=drafts)


def _approve(**kw: object) -> ReviewDecision:
    return ReviewDecision(action="approve", reviewer="ann", proof="p", **kw)  # type: ignore[arg-type]


def test_the_workflow_takes_a_draft_only_at_a_followups_approval_under_the_patch() -> None:
    sha = draft_sha256(GOOD)
    assert check_action(_followup_wait(), _approve(draft_sha256=sha)) is None
    old = check_action(_followup_wait(drafts=False), _approve(draft_sha256=sha))
    assert old is not None and old.code == "draft_not_editable"
    review = Waiting("review", "low_confidence:company", set(REVIEW_ACTIONS), seq=1)
    refused = check_action(review, _approve(draft_sha256=sha))
    assert refused is not None and refused.code == "draft_not_editable"
    bad = check_action(_followup_wait(), _approve(draft_sha256="ABC"))
    assert bad is not None and bad.code == "draft_sha256_invalid"
    unsent = check_action(_followup_wait(), _approve(draft_sha256=sha, send_followup=False))
    assert unsent is not None and unsent.code == "draft_not_sent"
    decision, problem = parse_decision("approve", {"reviewer": "ann", "draft_sha256": sha})
    assert problem is None and decision is not None and decision.draft_sha256 == sha


def test_only_the_approver_role_approves_a_followup() -> None:
    unproven = ReviewDecision(action="approve", reviewer="ann")
    refused = check_action(_followup_wait(), unproven)
    assert refused is not None and refused.code == "authority_required"
    assert "approve_followup" in refused.message
    assert check_action(_followup_wait(role=None), unproven) is None
    review = OpenReview(reason="unknown_customer", owner="sales-ops", since="", allowed=[],
                        wait_id="w2-followup", approve_role="approver")
    sales = Principal("reviewer:sid", "sid", frozenset({"initech"}), 2, role="reviewer")
    boss = Principal("reviewer:ann", "ann", frozenset({"initech"}), 2, role="approver")
    answer = lacks_authority(DecisionRequest(WF, Decision.APPROVE, sales, "cli"), review,
                             "w2-followup")
    assert answer is not None and "authority_required" in answer.message
    assert lacks_authority(DecisionRequest(WF, Decision.APPROVE, boss, "cli"), review,
                           "w2-followup") is None
    # The approver role asks nothing of a hold or a reject.
    assert lacks_authority(DecisionRequest(WF, Decision.HOLD, sales, "cli"), review,
                           "w2-followup") is None


@pytest.mark.parametrize(("contact", "outcome", "reason"), [
    (None, "awaiting_approval", planning.UNKNOWN_CUSTOMER),
    (planning.ExistingContact("Jo", None, in_crm=False), "awaiting_approval",
     planning.UNKNOWN_CUSTOMER),
    (planning.ExistingContact("Jo", None, in_crm=True), "queued", None),
])
def test_auto_only_for_known_customers(contact: planning.ExistingContact | None,
                                       outcome: str, reason: str | None) -> None:
    facts = planning.Facts(policy=get_policy("initech"), route="auto",
                           identity="jo@example.com",
                           extraction={"intent": "pricing_request"}, contact=contact,
                           followup=planning.FollowupFacts(False, False))
    decided = planning.plan(facts).followup
    assert decided is not None
    assert (decided.outcome, decided.approval_reason) == (outcome, reason)
    # acme sends to anyone automatically, as before.
    acme = planning.plan(planning.Facts(policy=get_policy("acme"), route="auto",
                                        identity="jo@example.com",
                                        extraction={"intent": "pricing_request"},
                                        followup=planning.FollowupFacts(False, False)))
    assert acme.followup is not None and acme.followup.outcome == "queued"


def _message(body: str) -> bytes:
    msg = EmailMessage()
    msg["From"] = "Jo Doe <jo@example.com>"
    msg["To"] = "sales@acme.test"
    msg["Subject"] = "Pricing"
    msg["Message-ID"] = "<s-1@example.com>"
    msg.set_content(body)
    return msg.as_bytes()


def test_a_sensitive_attribute_is_a_deterministic_signal() -> None:
    assert signals.sensitive_attribute("I was diagnosed with diabetes last year.", "")
    assert signals.sensitive_attribute("Because of my disability I need large print.", "")
    assert not signals.sensitive_attribute("Pricing for 20 seats, please.", "Pricing")


def test_a_sensitive_attribute_routes_to_review() -> None:
    from inboxcrm.domain.extraction import extract_with_rules

    def route_raw(raw: bytes) -> object:
        return extract_with_rules(raw, len(raw), get_policy("acme"), "standard")

    decided: Any = route_raw(_message("Hi, I was diagnosed with diabetes; do you offer a "
                                 "discount? Pricing for 20 seats please.\n\nJo"))
    assert decided.route == "review" and "sensitive_attribute" in decided.reasons
    assert decided.extraction.sensitive_attribute
    plain: Any = route_raw(_message("Hi, pricing for 20 seats please.\n\nJo"))
    assert "sensitive_attribute" not in plain.reasons and not plain.extraction.sensitive_attribute


def test_the_desk_takes_an_edited_draft_unless_it_is_the_rendered_text() -> None:
    rendered = "Hello,\nThe team"
    form = {"action": ["approve"], "wait_id": ["w2-followup"], "draft": ["Hi!\r\nThe team"],
            "rendered_sha256": [draft_sha256(rendered)], "intent_id": ["i-1"]}
    assert edited_draft(form) == "Hi!\r\nThe team"
    assert edited_draft(form | {"draft": [rendered]}) is None
    assert edited_draft(form | {"draft": ["  "]}) is None
    ann = Principal("reviewer:ann", "ann", frozenset({"initech"}), 2, role="approver")
    assert isinstance(decision_request(form, ann, WF), DecisionRequest)


def test_the_card_offers_the_text_with_its_limits() -> None:
    from inboxcrm.domain.review_card import DecisionOption, Followup, ReviewCard
    from inboxcrm.ingress.review import DeskForms, render_html
    from inboxcrm.schemas.contract import decision_body as example_body

    card = ReviewCard(workflow_id=WF, tenant="initech", source="standard", mailbox="sales",
                      state="awaiting_review", reason="unknown_customer", reasons=[],
                      waiting=True, wait_id="w2-followup", wait_reason="unknown_customer")
    card.followup = Followup("ack v1", "ack@x", "jo@example.com", "Thanks", "Hello <Jo>",
                             "planned", editable=True, max_chars=1200,
                             keep=["the opt-out link", "the signature"], intent_id="i-1")
    card.decisions = [DecisionOption(a, example_body(a, "w2-followup"))
                      for a in ("approve", "hold", "reject")]
    ann = Principal("reviewer:ann", "ann", frozenset({"initech"}), 2, role="approver")
    page = render_html(card, DeskForms("csrf-token", ann, True))
    form = page[page.index("id='decide-approve'"):]
    form = form[:form.index("</form>")]
    assert "<textarea name='draft'" in form and "Hello &lt;Jo&gt;</textarea>" in form
    assert "at most 1200 characters" in form and "the signature" in form
    assert f"value='{draft_sha256('Hello <Jo>')}'" in form and "value='i-1'" in form


async def test_the_desk_stores_the_draft_first_and_a_refusal_sends_nothing() -> None:
    from inboxcrm.domain.drafts import DraftCheck
    from inboxcrm.ingress.review import send_form_decision

    ann = Principal("reviewer:ann", "ann", frozenset({"initech"}), 2, role="approver")
    form = {"action": ["approve"], "wait_id": ["w2-followup"], "intent_id": ["i-1"],
            "draft": ["Hi!\nThe team"], "rendered_sha256": [draft_sha256("Hello")]}
    proposed: list[tuple[str, str]] = []
    connected: list[bool] = []

    async def refuse(intent_id: str, text: str) -> DraftCheck:
        proposed.append((intent_id, text))
        return DraftCheck("draft_too_long", draft_refusal_text("draft_too_long", TERMS))

    async def connect() -> Any:
        connected.append(True)
        raise OSError("no Temporal in the fast tier")

    answer = await send_form_decision(connect, SECRET, ann, WF, form, refuse)
    assert not answer.accepted and "draft_too_long" in answer.message
    assert proposed == [("i-1", "Hi!\nThe team")] and connected == []
    # Stored and within the limits: the decision carries the draft's hash (sent next).
    async def accept(intent_id: str, text: str) -> DraftCheck:
        return DraftCheck(None, "ok", draft_sha256(text))

    answer = await send_form_decision(connect, SECRET, ann, WF, form, accept)
    assert connected == [True] and answer.outcome == "unavailable"
    # A desk that cannot store drafts refuses an edit instead of sending the rendered words.
    answer = await send_form_decision(connect, SECRET, ann, WF, form, None)
    assert not answer.accepted and "cannot store an edited draft" in answer.message


def test_the_followup_waits_details_name_the_approver_role() -> None:
    from inboxcrm.workflows.decisions import details

    text = details(_followup_wait(), ItemState.AWAITING_REVIEW)
    assert "approve only by a reviewer with the role `approver`" in text
    assert "retry" not in text.split("approve only")[1].split("\n")[0]


def _tenant_with_template_draft(tmp_path: Path, template_draft: str | None,
                                rule_draft: dict[str, object] | None) -> Path:
    """initech's policy and templates copied, the draft limits declared where asked."""
    policies = tmp_path / "policies"
    shutil.copytree(ROOT / "policies" / "initech", policies / "initech")
    policy = json.loads((ROOT / "policies" / "initech.json").read_text())
    for rule in policy["followup_rules"]:
        rule.pop("draft", None)
        if rule_draft is not None:
            rule["draft"] = rule_draft
    (policies / "initech.json").write_text(json.dumps(policy))
    draft_file = policies / "initech" / "templates" / "ack.draft.json"
    if template_draft is None:
        draft_file.unlink()
    else:
        draft_file.write_text(template_draft)
    return policies


def test_the_template_declares_the_limits_and_a_rule_only_narrows_them(tmp_path: Path) -> None:
    policies = _tenant_with_template_draft(
        tmp_path, '{"max_chars": 900, "keep": ["signature"]}',
        {"max_chars": 2000, "keep": ["sender_name"]})
    policy = load_policies(policies)["initech"]
    rule = policy.followup_rules[0]
    limits = policy.draft_limits(rule)
    assert limits is not None and limits.max_chars == 900  # the rule cannot widen it
    assert set(limits.fixed()) == {"opt_out_url", "postal_address", "signature", "sender_name"}
    narrower = _tenant_with_template_draft(tmp_path / "b", '{"max_chars": 900}',
                                           {"max_chars": 300, "keep": []})
    narrowed = load_policies(narrower)["initech"]
    limits = narrowed.draft_limits(narrowed.followup_rules[0])
    assert limits is not None and limits.max_chars == 300
    neither = load_policies(_tenant_with_template_draft(tmp_path / "c", None, None))["initech"]
    assert neither.draft_limits(neither.followup_rules[0]) is None


def test_the_draft_limits_are_part_of_the_templates_version(tmp_path: Path) -> None:
    loose = load_policies(_tenant_with_template_draft(tmp_path / "a", '{"max_chars": 900}', None))
    tight = load_policies(_tenant_with_template_draft(tmp_path / "b", '{"max_chars": 800}', None))
    none = load_policies(_tenant_with_template_draft(tmp_path / "c", None, None))
    versions = {p["initech"].templates["ack"].version for p in (loose, tight, none)}
    assert len(versions) == 3  # a changed limit is a new rule version, as a changed word is
    stored = loose["initech"].templates["ack"].sources()
    assert from_sources(stored).draft == {"max_chars": 900}
    assert from_sources(stored).version == loose["initech"].templates["ack"].version


@pytest.mark.parametrize(("written", "said"), [
    ('{"max_chars": 0}', "max_chars"),
    ('{"max_chars": 900, "keep": ["the_body"]}', "keep"),
    ('{"max_chars": 900, "colour": "red"}', "colour"),
    ('[900]', "must be a JSON object"),
    ('{"max_chars": ', "not a readable JSON file"),
])
def test_a_bad_template_draft_file_refuses_the_policy_naming_it(
        tmp_path: Path, written: str, said: str) -> None:
    policies = _tenant_with_template_draft(tmp_path, written, None)
    with pytest.raises(PolicyError) as refused:
        load_policies(policies)
    assert "ack.draft.json" in str(refused.value) and said in str(refused.value)


def test_a_draft_file_without_its_template_refuses(tmp_path: Path) -> None:
    policies = _tenant_with_template_draft(tmp_path, '{"max_chars": 900}', None)
    (policies / "initech" / "templates" / "welcome.draft.json").write_text('{"max_chars": 9}')
    with pytest.raises(PolicyError, match="welcome.draft.json: there is no template"):
        load_policies(policies)
