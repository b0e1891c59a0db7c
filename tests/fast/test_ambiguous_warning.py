"""The ambiguous card's warning (inboxcrm/domain/review_card.py): what a retry would do."""

from __future__ import annotations

import pytest

from inboxcrm.domain.review_card import _warning


@pytest.mark.parametrize("refusal", ["suppressed", "crm_opt_out", "contact_forgotten"])
def test_a_hold_after_an_opt_out_says_a_retry_holds_again(refusal: str) -> None:
    text = _warning(True, 86400.0, f"unconfirmed_then_{refusal}")
    assert f"({refusal})" in text
    assert "held again and sends nothing" in text
    assert "`resolve`" in text and "`reject`" in text


def test_a_plain_unconfirmed_send_warns_of_a_second_email_past_the_window() -> None:
    text = _warning(True, 86400.0, "timeout")
    assert "24 h" in text and "second email" in text
    assert "held again" not in text


def test_smtp_and_crm_writes_keep_their_warnings() -> None:
    assert "SMTP" in _warning(True, None, "")
    assert _warning(False, None, "unconfirmed_then_suppressed").startswith(
        "a retry repeats the write")
