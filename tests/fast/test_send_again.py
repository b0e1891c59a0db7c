"""A deliberate second send (issue 37, docs/architecture.md §6 "Authority"): the pure parts.
The keys of a later generation never reuse the first send's; the workflow's own check asks
the policy's role, a proof and a reason, and refuses a send-again at any wait but an
unconfirmed follow-up's; the store's facts decide whether the follow-up may go out again;
the desk and the CLI offer it as they offer retry."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest

from inboxcrm.domain.followup import RepeatFacts, send_again_refusal
from inboxcrm.ingress.review import WHAT, decision_request
from inboxcrm.platform.decisions import DecisionRequest, lacks_authority, send_decision
from inboxcrm.platform.reviewer_identity import Principal
from inboxcrm.schemas.contract import Decision, decision_body
from inboxcrm.schemas.models import (
    DECISION_ACTIONS,
    ItemStatus,
    OpenReview,
    ReviewDecision,
    again_op_key,
    is_again_key,
)
from inboxcrm.workflows.decisions import (
    CHOICES,
    RECOVERY_ACTIONS,
    SEND_AGAIN,
    Waiting,
    check_action,
    customer_facing,
    decision_action,
    details,
    parse_decision,
)
from inboxcrm.workflows.inbound_email import InboundEmailWorkflow

WF = "inbound/acme/imap/sales/42"


def test_a_later_generation_has_keys_of_its_own() -> None:
    assert again_op_key(WF, 1, "send") == f"{WF}:send"  # the planned follow-up's, as before
    second = again_op_key(WF, 2, "send")
    assert second == f"{WF}:again-2:send" and second != again_op_key(WF, 3, "send")
    assert again_op_key(WF, 2, "crm-sent") == f"{WF}:again-2:crm-sent"
    # The action stays the last part: the send's budget, the authority, the status query.
    assert customer_facing(second) and second.endswith(":send")
    assert is_again_key(second) and is_again_key(again_op_key(WF, 2, "crm-sent"))
    assert not is_again_key(f"{WF}:send") and not is_again_key(f"{WF}:crm-sent")
    assert not is_again_key("inbound/acme/x/again-box/1:send")
    assert not is_again_key(f"{WF}:again-x:send")


def _wait(role: str | None = "lead", allowed: set[str] | None = None,
          reason: str = "outcome_unconfirmed") -> Waiting:
    waiting = Waiting("recovery", reason, allowed or set(RECOVERY_ACTIONS) | {SEND_AGAIN},
                      f"{WF}:send", seq=3)
    waiting.required_role = role
    return waiting


def _again(note: str | None = "the customer says nothing arrived",
           proof: str = "v2:x") -> ReviewDecision:
    return ReviewDecision(action="send_again", reviewer="lea", note=note, proof=proof)


def test_send_again_is_a_decision_of_its_own() -> None:
    assert "send_again" in DECISION_ACTIONS and Decision.SEND_AGAIN == "send_again"
    assert decision_action("send_again") == "send_again"
    decision, problem = parse_decision("send_again", {"reviewer": "lea", "note": "why",
                                                      "wait_id": "w3-recovery"})
    assert problem is None and decision is not None and decision.action == "send_again"
    body = decision_body(Decision.SEND_AGAIN, "w3-recovery")
    assert "required" in str(body["note"])
    assert "own idempotency key" in CHOICES[SEND_AGAIN]
    # A signal and an update of that name, like every other decision.
    assert hasattr(InboundEmailWorkflow, "send_again")
    assert hasattr(InboundEmailWorkflow, "send_again_update")


def test_the_workflow_asks_the_role_a_proof_and_a_reason() -> None:
    assert check_action(_wait(), _again()) is None  # proven: the decision record checks it
    unproven = check_action(_wait(), _again(proof=""))
    assert unproven is not None and unproven.code == "authority_required"
    assert "sending this follow-up again" in unproven.message and "'lead'" in unproven.message
    assert check_action(_wait(role=None), _again(proof="")) is None  # no role asked for
    for note in (None, "", "   "):
        missing = check_action(_wait(), _again(note=note))
        assert missing is not None and missing.code == "reason_required"


@pytest.mark.parametrize("waiting", [
    Waiting("review", "missing_sender", {"approve", "hold", "reject"}, seq=1),
    Waiting("followup", "followup_approval_required", {"approve", "hold", "reject"}, seq=2),
    # A blocked CRM step, and an unconfirmed send of a run before the patch `send-again`.
    Waiting("recovery", "http_400:VALIDATION_ERROR", set(RECOVERY_ACTIONS), f"{WF}:crm-upsert",
            seq=3),
    _wait(allowed=set(RECOVERY_ACTIONS)),
], ids=["review", "followup", "blocked-crm", "before-the-patch"])
def test_send_again_is_refused_where_no_followup_is_unconfirmed(waiting: Waiting) -> None:
    refused = check_action(waiting, _again())
    assert refused is not None and refused.code == "no_followup_to_repeat"
    assert "unconfirmed or was sent" in refused.message and waiting.wait_id in refused.message


def test_the_current_details_offer_it_with_its_body() -> None:
    text = details(_wait(), mock.MagicMock(value="ambiguous"))
    assert "`send_again`" in text and "retry (and send_again) only" in text


def _facts(**changes: Any) -> RepeatFacts:
    base: dict[str, Any] = {"status": "sending", "contact_status": "active",
                            "suppressed": False, "marketing_suppressed": False,
                            "recent": False}
    return RepeatFacts(**(base | changes))


@pytest.mark.parametrize(("facts", "code"), [
    (_facts(), None),
    (_facts(status="sent"), None),
    (None, "no_followup_to_repeat"),
    (_facts(status="queued"), "followup_not_sent"),
    (_facts(status="cancelled"), "followup_not_sent"),
    (_facts(suppressed=True), "suppressed"),
    (_facts(marketing_suppressed=True), None),  # a service reply: marketing scope only
    (_facts(marketing_suppressed=True, purpose="marketing"), "suppressed"),
    (_facts(contact_status="merged"), "contact_inactive"),
    (_facts(recent=True), "quiet_period"),
])
def test_the_store_facts_decide_whether_it_may_go_out_again(facts: RepeatFacts | None,
                                                             code: str | None) -> None:
    assert send_again_refusal(facts) == code


def _request(principal: Principal) -> DecisionRequest:
    return DecisionRequest(WF, Decision.SEND_AGAIN, principal, "cli", reviewer="dana",
                           note="why", wait_id="w3-recovery")


def _open(role: str | None) -> OpenReview:
    return OpenReview(reason="outcome_unconfirmed", owner="integration", since="",
                      allowed=["hold", "reject", "resolve", "retry", "send_again"],
                      op_key=f"{WF}:send", wait_id="w3-recovery", repeat_role=role)


async def test_the_decision_client_refuses_a_send_again_without_the_role() -> None:
    sales = Principal("reviewer:sam", "sam", frozenset({"acme"}), 1, role="reviewer")
    lead = Principal("reviewer:lea", "lea", frozenset({"acme"}), 2, role="lead")
    refused = lacks_authority(_request(sales), _open("lead"), "w3-recovery")
    assert refused is not None and "sending this follow-up again" in refused.message
    assert lacks_authority(_request(lead), _open("lead"), "w3-recovery") is None
    # Even with the wait ID given, the client asks the wait first (as for retry).
    handle = mock.AsyncMock()
    handle.query.return_value = ItemStatus(workflow_id=WF, review=_open("lead"))
    client = mock.MagicMock()
    client.get_workflow_handle.return_value = handle

    async def connect() -> Any:
        return client

    result = await send_decision(connect, "secret-" * 6, _request(sales))
    assert result.outcome == "refused" and "authority_required" in result.message
    handle.execute_update.assert_not_called()


def test_the_desk_offers_it_with_a_required_reason() -> None:
    assert "own idempotency key" in WHAT["send_again"]
    lead = Principal("reviewer:lea", "lea", frozenset({"acme"}), 2, role="lead")
    request = decision_request({"action": ["send_again"], "wait_id": ["w3-recovery"],
                                "note": ["customer asked"]}, lead, WF)
    assert isinstance(request, DecisionRequest)
    assert request.action == Decision.SEND_AGAIN and request.note == "customer asked"


def test_the_check_counts_the_first_send_as_settled_by_its_repeat() -> None:
    """`inboxcrm check`: a completed item whose unconfirmed send a person sent again keeps
    that first send `ambiguous` (the evidence); anything else left unsettled is flagged."""
    from inboxcrm.verify.check import _completed_operations

    events = [{"workflow_id": WF, "state": "completed"}]
    operations = [
        {"op_key": f"{WF}:send", "workflow_id": WF, "action": "send", "status": "ambiguous",
         "external_ref": "first"},
        {"op_key": f"{WF}:again-2:send", "workflow_id": WF, "action": "send",
         "status": "completed", "external_ref": "second"},
    ]
    intents = [{"intent_id": "first", "repeats_intent_id": None},
               {"intent_id": "second", "repeats_intent_id": "first"}]
    assert _completed_operations(events, operations, intents).violations == []
    unrepeated = [{"intent_id": "first", "repeats_intent_id": None}]
    assert _completed_operations(events, operations, unrepeated).violations == [
        f"{WF}:send status:ambiguous"]


def test_the_desk_renders_a_send_again_form_that_asks_why() -> None:
    from inboxcrm.domain.review_card import DecisionOption, ReviewCard
    from inboxcrm.ingress.review import DeskForms, render_html

    card = ReviewCard(workflow_id=WF, tenant="acme", source="imap", mailbox="sales",
                      state="ambiguous", reason="outcome_unconfirmed", reasons=[],
                      waiting=True, wait_id="w3-recovery", wait_reason="outcome_unconfirmed")
    card.decisions = [DecisionOption(a, decision_body(a, "w3-recovery"))
                      for a in ("hold", "reject", "resolve", "retry", "send_again")]
    lead = Principal("reviewer:lea", "lea", frozenset({"acme"}), 2, role="lead")
    page = render_html(card, DeskForms("csrf-token", lead, True))
    form = page[page.index("id='decide-send_again'"):]
    form = form[:form.index("</form>")]
    assert "name='action' value='send_again'" in form
    assert "name='note'" in form and " required" in form and ">Send again</button>" in form
