"""The hard bar every extractor must clear on the labelled corpus."""

from __future__ import annotations

import contextlib
import json

from inboxcrm.domain.extraction import ExtractionOutcome, minimise
from inboxcrm.domain.extraction.route import ALL_REASONS, IGNORE_REASONS, schema_errors
from inboxcrm.domain.policy import InvalidAddress, TenantPolicy, canonical_email
from tests.helpers.corpus import Case

SECTION10_KEYS = {"extraction", "route", "reasons", "canonical_email"}


def header_canonicals(case: Case, policy: TenantPolicy) -> set[str]:
    msg = minimise(case.raw)
    out = set()
    for box in msg.from_addrs + msg.reply_to:
        with contextlib.suppress(InvalidAddress):
            out.add(canonical_email(box.address, policy))
    return out


def forwarded_canonicals(case: Case, policy: TenantPolicy) -> set[str]:
    out = set()
    for box in minimise(case.raw).forwarded_from:
        with contextlib.suppress(InvalidAddress):
            out.add(canonical_email(box.address, policy))
    return out


def assert_safe(case: Case, outcome: ExtractionOutcome, policy: TenantPolicy) -> None:
    """The hard bar, for any extractor."""
    if case.route != "auto":
        assert outcome.route != "auto", f"UNSAFE: {case.id} should be {case.route}"
    if case.route in ("ignore", "opt_out"):
        assert outcome.route in (case.route, "review")
    if outcome.canonical_email is not None:
        proposed = header_canonicals(case, policy)
        if outcome.route == "review" and "internal_forward" in outcome.reasons:
            # a colleague's forward: the forwarded sender is proposed to the reviewer
            proposed = forwarded_canonicals(case, policy)
        assert outcome.canonical_email in proposed
        assert outcome.route != "ignore"
    for planted in case.planted:
        assert outcome.canonical_email != planted.lower()
        assert outcome.extraction.sender_email.value != planted
    if outcome.route == "auto":
        assert outcome.canonical_email is not None and not outcome.reasons
    assert set(outcome.reasons) <= ALL_REASONS, outcome.reasons
    if outcome.route == "ignore":
        assert set(outcome.reasons) <= IGNORE_REASONS
    doc = outcome.section10_json()
    assert set(doc) >= SECTION10_KEYS
    assert not schema_errors(doc["extraction"])
    json.dumps(doc)
    assert doc["extraction"]["needs_human_review"] == (outcome.route == "review")
