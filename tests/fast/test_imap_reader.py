"""The IMAP reader's pure parts: the XOAUTH2 initial response, folder quoting, the bounded
Message-ID read, the classification of what imaplib raises, and the parsing of FETCH
answers in either item order."""

from __future__ import annotations

import base64
import imaplib

import pytest

from inboxcrm.adapters.imap import (
    HEADER_SCAN_BYTES,
    ImapFolderReader,
    classify_imap,
    message_id_of,
    quote_folder,
    xoauth2_string,
)
from inboxcrm.schemas.mailboxes import mailbox_workflow_id
from inboxcrm.schemas.outcomes import Category


def test_xoauth2_initial_response_is_the_documented_format() -> None:
    # Google's and Microsoft's documentation: base64("user=" + user + "^Aauth=Bearer " +
    # token + "^A^A"); imaplib does the base64.
    raw = xoauth2_string("sales@acme.test", "ya29.token")
    assert raw == b"user=sales@acme.test\x01auth=Bearer ya29.token\x01\x01"
    assert base64.b64encode(raw).startswith(b"dXNlcj1zYWxlc0BhY21lLnRlc3QBYXV0aD1CZWFyZXIg")


def test_folder_names_are_quoted() -> None:
    assert quote_folder("INBOX") == '"INBOX"'
    assert quote_folder('My "Leads"\\2026') == '"My \\"Leads\\"\\\\2026"'


def test_message_id_is_read_from_the_header_block_only() -> None:
    raw = b"From: a@b.test\r\nMessage-ID:  <abc.123@b.test> \r\n\r\nMessage-ID: <body@x>\r\n"
    assert message_id_of(raw) == "<abc.123@b.test>"
    assert message_id_of(b"From: a@b.test\r\n\r\nMessage-ID: <body@x>\r\n") is None
    huge = b"X-Pad: " + b"a" * HEADER_SCAN_BYTES + b"\r\nMessage-ID: <late@x>\r\n\r\nbody"
    assert message_id_of(huge) is None
    assert message_id_of(b"Message-ID: not-an-id\r\n\r\n") is None


@pytest.mark.parametrize(("exc", "category", "reason"), [
    (imaplib.IMAP4.error("[AUTHENTICATIONFAILED] Authentication failed."),
     Category.PERMANENT, "imap_authenticationfailed"),
    (imaplib.IMAP4.error("[NONEXISTENT] Mailbox doesn't exist: Leads"),
     Category.PERMANENT, "imap_no_such_folder"),
    (imaplib.IMAP4.abort("socket error: EOF"), Category.TRANSIENT, "imap_connection_dropped"),
    (imaplib.IMAP4.error("[UNAVAILABLE] Temporary failure"), Category.TRANSIENT,
     "imap_unavailable"),
    (ConnectionRefusedError(), Category.TRANSIENT, None),
    (TimeoutError(), Category.TRANSIENT, None),
])
def test_failures_are_classified(exc: BaseException, category: Category,
                                 reason: str | None) -> None:
    classified = classify_imap(exc)
    assert classified.category is category
    if reason is not None:
        assert classified.reason == reason
    assert "Mailbox" not in classified.reason  # codes, never the server's words


class _Fetching:
    """imaplib's `uid` answer, as servers send it (the UID before or after the literal)."""

    def __init__(self, data: list[object]) -> None:
        self.data = data

    def uid(self, *args: str) -> tuple[str, list[object]]:
        return "OK", self.data


def test_fetch_answers_are_read_in_either_item_order() -> None:
    reader = ImapFolderReader(host="h", port=1, tls="none", credential=None)  # type: ignore[arg-type]
    reader._imap = _Fetching([  # type: ignore[assignment]
        (b"1 (UID 7 BODY[] {5}", b"first"), b")",
        (b"2 (BODY[] {6}", b"second"), b" UID 9)",
    ])
    assert reader.fetch([7, 9]) == {7: b"first", 9: b"second"}


def test_the_watcher_id_is_the_folder_identity() -> None:
    assert (mailbox_workflow_id("acme", "imap", "sales@acme.test", "INBOX")
            == "mailbox/acme/imap/sales@acme.test/INBOX")
