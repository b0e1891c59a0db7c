"""Owners per cause and the authority to repeat a customer-facing action (issue 37,
docs/architecture.md §6): the one classifier sorts a reason into its cause, a wait's owner
follows the policy's `owners` (default `review_owner`), and a retry of an ambiguous send is
refused, in the workflow's own check and in the one decision client, to anyone but the role
the policy names."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from pydantic import ValidationError

from inboxcrm.adapters.errors import failure_cause
from inboxcrm.domain.policy import Authority, TenantPolicy
from inboxcrm.platform.decisions import DecisionRequest, lacks_authority, send_decision
from inboxcrm.platform.reviewer_identity import Principal, operator
from inboxcrm.schemas.contract import Decision
from inboxcrm.schemas.models import ItemStatus, OpenReview, ReviewDecision
from inboxcrm.workflows.decisions import (
    RECOVERY_ACTIONS,
    Waiting,
    check_action,
    customer_facing,
    owner_of,
)

OWNERS = {"access": "integration", "rate": "integration", "data": "data-ops",
          "ambiguous": "mail-ops", "http_404": "crm-admins"}


@pytest.mark.parametrize(("reason", "cause"), [
    ("http_401:INVALID_AUTHENTICATION", "access"),
    ("http_403", "access"),
    ("smtp_535", "access"),
    ("http_403:REQUEST_LIMIT_EXCEEDED", "rate"),
    ("http_429:rate_limit_exceeded", "rate"),
    ("http_429:DAILY", "rate"),
    ("http_503:retry_after_over_cap", "rate"),
    ("http_400:VALIDATION_ERROR", "data"),
    ("http_300:MULTIPLE_MATCHES", "data"),
    ("smtp_550", "data"),
    ("http_409:invalid_idempotent_request", "ambiguous"),
    ("outcome_unconfirmed", "ambiguous"),
    ("http_500", "integration"),
    ("ReadTimeout", "integration"),
    ("destination_address_refused", "integration"),
    ("http_400:UNABLE_TO_LOCK_ROW", "integration"),
])
def test_the_one_classifier_names_the_cause(reason: str, cause: str) -> None:
    assert failure_cause(reason) == cause


def _recovery(reason: str, error: str | None = None, op_key: str = "w:crm-upsert") -> Waiting:
    return Waiting("recovery", reason, set(RECOVERY_ACTIONS), op_key, error=error)


def test_a_wait_goes_to_the_owner_of_its_cause_else_to_review_owner() -> None:
    assert owner_of(_recovery("http_401:INVALID_AUTHENTICATION"), OWNERS, "sales-ops") == (
        "integration")
    assert owner_of(_recovery("http_404"), OWNERS, "sales-ops") == "crm-admins"  # exact
    assert owner_of(_recovery("retries_exhausted", "http_429:x"), OWNERS, "s") == "integration"
    assert owner_of(_recovery("outcome_unconfirmed"), OWNERS, "sales-ops") == "mail-ops"
    assert owner_of(_recovery("http_500"), OWNERS, "sales-ops") == "sales-ops"  # unmapped
    review = Waiting("review", "low_confidence:sender_email", {"approve"})
    assert owner_of(review, OWNERS, "sales-ops") == "sales-ops"
    assert owner_of(review, OWNERS | {"review": "sdr"}, "sales-ops") == "sdr"
    # A policy without owners (every history recorded before issue 37): review_owner.
    assert owner_of(_recovery("http_401"), {}, "sales-ops") == "sales-ops"


def test_policy_owners_and_authority_are_validated_and_default_to_today() -> None:
    base: dict[str, Any] = {"tenant": "t", "mailboxes": ["a@t.test"], "domains": ["t.test"]}
    plain = TenantPolicy.model_validate(base)
    assert plain.owners == {} and plain.authority.repeat_customer_facing is None
    assert plain.owner_for("workflow_failed", "integration") == "sales-ops"
    mapped = TenantPolicy.model_validate(base | {"owners": {"integration": "int"},
                                                 "authority": {"repeat_customer_facing":
                                                               "lead"}})
    assert mapped.owner_for("workflow_failed", "integration") == "int"
    with pytest.raises(ValidationError):
        TenantPolicy.model_validate(base | {"owners": {"Not A Cause!": "x"}})
    with pytest.raises(ValidationError):
        Authority.model_validate({"repeat_customer_facing": "Lead Role"})


def _retry(proof: str = "") -> ReviewDecision:
    return ReviewDecision(action="retry", reviewer="dana", proof=proof)


def test_the_workflow_refuses_an_unproven_retry_of_an_ambiguous_send() -> None:
    """The Temporal UI sends an update with no proof: refused in the validator itself when
    the policy names a role (the decision record then checks a proven reviewer's role)."""
    assert customer_facing("inbound/acme/x/m/1:send")
    assert not customer_facing("inbound/acme/x/m/1:crm-upsert")
    waiting = _recovery("outcome_unconfirmed", op_key="inbound/acme/x/m/1:send")
    assert check_action(waiting, _retry()) is None  # no role asked for: as before
    waiting.required_role = "lead"
    refused = check_action(waiting, _retry())
    assert refused is not None and refused.code == "authority_required"
    assert "'lead'" in refused.message
    assert check_action(waiting, _retry(proof="v2:x")) is None  # the activity checks it
    resolve = ReviewDecision(action="resolve", reviewer="dana", evidence="msg-1")
    assert check_action(waiting, resolve) is None  # recording evidence repeats nothing


def _request(principal: Principal) -> DecisionRequest:
    return DecisionRequest("inbound/acme/x/m/1", Decision.RETRY, principal, "cli",
                           reviewer="dana", wait_id="w3-recovery")


def _open(role: str | None) -> OpenReview:
    return OpenReview(reason="outcome_unconfirmed", owner="integration", since="",
                      allowed=["retry"], op_key="inbound/acme/x/m/1:send",
                      wait_id="w3-recovery", repeat_role=role)


def test_the_decision_client_refuses_a_retry_without_the_role() -> None:
    sales = Principal("reviewer:sam", "sam", frozenset({"acme"}), 1, role="reviewer")
    lead = Principal("reviewer:lea", "lea", frozenset({"acme"}), 2, role="lead")
    refused = lacks_authority(_request(sales), _open("lead"), "w3-recovery")
    assert refused is not None and refused.outcome == "refused"
    assert "authority_required" in refused.message
    assert lacks_authority(_request(operator()), _open("lead"), "w3-recovery") is not None
    assert lacks_authority(_request(lead), _open("lead"), "w3-recovery") is None
    assert lacks_authority(_request(sales), _open(None), "w3-recovery") is None


async def test_a_refused_retry_sends_no_update() -> None:
    handle = mock.AsyncMock()
    handle.query.return_value = ItemStatus(workflow_id="w", review=_open("lead"))
    client = mock.MagicMock()
    client.get_workflow_handle.return_value = handle

    async def connect() -> Any:
        return client

    sales = Principal("reviewer:sam", "sam", frozenset({"acme"}), 1, role="reviewer")
    result = await send_decision(connect, "secret-" * 6, _request(sales))
    assert result.outcome == "refused" and "lead" in result.message
    handle.execute_update.assert_not_called()
