"""The date a HubSpot note carries (hs_timestamp): the message's Date header, else receipt."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from activities.crm import message_date

RECEIVED = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("head", "expected"), [
    (b"Date: Sun, 29 Nov 2026 10:00:00 +0000\r\nSubject: x\r\n\r\nbody",
     datetime(2026, 11, 29, 10, 0, tzinfo=UTC)),
    (b"Date: Mon, 30 Nov 2026 14:30:00 +0200\r\n\r\n", datetime(2026, 11, 30, 12, 30, tzinfo=UTC)),
    (b"Subject: no date\r\n\r\n", RECEIVED),
    (b"Date: not a date\r\n\r\n", RECEIVED),
    (b"Date: Sun, 29 Nov 2026 10:00:00 -0000\r\n\r\n", RECEIVED),  # RFC 5322: zone unknown
    (b"Date: Fri, 1 Jan 2027 00:00:00 +0000\r\n\r\n", RECEIVED),   # from the future
    (None, RECEIVED),                                               # purged
])
def test_message_date(head: bytes | None, expected: datetime) -> None:
    assert message_date(head, RECEIVED) == expected
