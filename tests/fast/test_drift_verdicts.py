"""The drift check's verdicts on what a destination answered (inboxcrm/store/drift.py): pure,
so each case is one call; the stack tier (tests/test_drift_check.py) asks a real sandbox."""

from __future__ import annotations

from inboxcrm.schemas.drift import CHECKED_ACTIONS, LOGGED_ACTIONS, DriftFinding
from inboxcrm.store.drift import crm_record_drift, email_drift, logged_drift

OP = "inbound-acme-1:crm-note"


def test_a_logged_activity_found_again_under_its_key_is_no_finding() -> None:
    assert logged_drift(OP, "5001", found="5001") is None


def test_a_logged_activity_gone_is_missing() -> None:
    assert logged_drift(OP, "5001", found=None) == DriftFinding(
        "missing", f"logged:{OP}", "missing_activity:5001")


def test_our_key_on_another_activity_is_changed() -> None:
    assert logged_drift(OP, "5001", found="5002") == DriftFinding(
        "changed", f"logged:{OP}", "key_on_other_activity:5002")


def test_every_logged_action_is_sampled() -> None:
    assert set(LOGGED_ACTIONS) <= set(CHECKED_ACTIONS)
    assert {"crm-upsert", "send"} <= set(CHECKED_ACTIONS)


def test_the_record_and_email_verdicts_are_unchanged() -> None:
    assert crm_record_drift("c1", "101", exists=True, owner="c1") is None
    assert crm_record_drift("c1", "101", exists=False, owner=None) == DriftFinding(
        "missing", "contact:c1", "missing_record:101")
    assert email_drift("i1", "m1", exists=True, key="i2") == DriftFinding(
        "changed", "intent:i1", "message_of_other_intent:m1")
