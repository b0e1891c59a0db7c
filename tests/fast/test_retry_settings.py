"""A tenant's retry settings (policy `retries`, docs/architecture.md §4 "Retries"): held to
the code's bounds when the policy loads, and chosen per rule by its urgency."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from inboxcrm.domain.policy import FollowupRule, TenantPolicy
from inboxcrm.schemas.models import (
    DEFAULT_CRM_RETRY,
    DEFAULT_SEND_RETRY,
    DEFAULT_URGENT_SEND_RETRY,
    RETRY_MAX_ATTEMPTS,
    StepRetry,
)
from inboxcrm.workflows.step_options import CRM_RETRY, destination_retry

BASE: dict[str, Any] = {"tenant": "acme", "mailboxes": ["sales@acme.test"],
                        "domains": ["acme.test"]}


def test_without_settings_a_tenant_gets_the_defaults_the_code_always_had() -> None:
    policy = TenantPolicy.model_validate(BASE)
    assert policy.retries.crm.step_retry() == DEFAULT_CRM_RETRY
    assert policy.retries.send.step_retry() == DEFAULT_SEND_RETRY
    assert destination_retry(DEFAULT_CRM_RETRY) == CRM_RETRY


def test_a_rules_urgency_chooses_its_sends_settings() -> None:
    policy = TenantPolicy.model_validate(BASE | {"retries": {
        "send": {"max_attempts": 8, "initial_seconds": 5, "maximum_seconds": 300}}})
    normal = FollowupRule(rule_id="ack", version=1, intents=["demo_request"])
    urgent = FollowupRule(rule_id="hot", version=1, intents=["demo_request"], urgency="urgent")
    assert policy.send_retry(normal) == StepRetry(max_attempts=8, initial_seconds=5,
                                                  maximum_seconds=300)
    assert policy.send_retry(urgent) == DEFAULT_URGENT_SEND_RETRY


@pytest.mark.parametrize(("settings", "names"), [
    ({"max_attempts": RETRY_MAX_ATTEMPTS + 1, "initial_seconds": 1, "maximum_seconds": 60},
     "max_attempts"),
    ({"max_attempts": 0, "initial_seconds": 1, "maximum_seconds": 60}, "max_attempts"),
    ({"max_attempts": 3, "initial_seconds": 0.1, "maximum_seconds": 60}, "initial_seconds"),
    ({"max_attempts": 3, "initial_seconds": 1, "maximum_seconds": 3600}, "maximum_seconds"),
    ({"max_attempts": 3, "initial_seconds": 30, "maximum_seconds": 10}, "below initial_seconds"),
    ({"max_attempts": 3, "initial_seconds": 1, "maximum_seconds": 60, "backoff": 10},
     "backoff"),
    ({"max_attempts": 3, "initial_seconds": 1, "maximum_seconds": 60, "jitter": 1}, "jitter"),
])
def test_settings_outside_the_bounds_are_refused_naming_the_setting(
        settings: dict[str, Any], names: str) -> None:
    with pytest.raises(ValidationError) as refused:
        TenantPolicy.model_validate(BASE | {"retries": {"crm": settings}})
    assert names in str(refused.value)
