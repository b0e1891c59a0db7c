"""The date a HubSpot note carries (hs_timestamp): the message's Date header, else receipt.
Extraction reads the Date once, in its work pool, and stores it (`written_at`, migration
041); an item extracted before that has it read from the head of its message."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from inboxcrm.activities.crm import note_time
from inboxcrm.domain.extraction import extract_with_rules
from inboxcrm.domain.policy import TenantPolicy

RECEIVED = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
POLICY = TenantPolicy(tenant="dates", mailboxes=["sales@example.com"], domains=["example.com"])
MESSAGE = b"From: Jane Doe <jane@example.org>\r\nTo: sales@example.com\r\n"


@pytest.mark.parametrize(("head", "expected"), [
    (b"Date: Sun, 29 Nov 2026 10:00:00 +0000\r\nSubject: x\r\n\r\nbody",
     datetime(2026, 11, 29, 10, 0, tzinfo=UTC)),
    (b"Date: Mon, 30 Nov 2026 14:30:00 +0200\r\n\r\n", datetime(2026, 11, 30, 12, 30, tzinfo=UTC)),
    (b"Subject: no date\r\n\r\n", RECEIVED),
    (b"Date: not a date\r\n\r\n", RECEIVED),
    (b"Date: Sun, 29 Nov 2026 10:00:00 -0000\r\n\r\n", RECEIVED),  # RFC 5322: zone unknown
    (b"Date: Fri, 1 Jan 2027 00:00:00 +0000\r\n\r\n", RECEIVED),   # from the future
    (b"Date: Sun, 29 Nov 99999 10:00:00 +0000\r\n\r\n", RECEIVED),  # out of range
])
def test_the_stored_date_and_the_head_of_an_older_item_agree(head: bytes,
                                                            expected: datetime) -> None:
    raw = MESSAGE + head
    outcome = extract_with_rules(raw, len(raw), POLICY, "standard")
    assert note_time(outcome.written_at, None, RECEIVED) == expected   # stored by extraction
    assert note_time(None, raw, RECEIVED) == expected                  # extracted before 041


def test_a_purged_message_extracted_before_041_is_dated_by_receipt() -> None:
    assert note_time(None, None, RECEIVED) == RECEIVED
