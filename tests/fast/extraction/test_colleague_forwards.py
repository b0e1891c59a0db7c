"""A colleague's forward (issue 34): mail from the tenant's own domain that carries an
outside sender's message, as Gmail, Outlook and Apple Mail write it inline and as an
attached message/rfc822, names that sender as the candidate and goes to review; it is never
mail from the colleague. The samples are shaped like what those clients send."""

from __future__ import annotations

import pytest

from inboxcrm.domain.extraction import extract_and_route, minimise
from inboxcrm.domain.policy import TenantPolicy, get_policy

ACME = "sales@acme.test"
COLLEAGUE = "Bob Miller <bob@acme.test>"
ORIGINAL = "jane.roe@initech.example"


@pytest.fixture
def acme(monkeypatch: pytest.MonkeyPatch) -> TenantPolicy:
    monkeypatch.delenv("INBOXCRM_POLICY_DIR", raising=False)
    return get_policy("acme")


def _message(subject: str, body: str, from_: str = COLLEAGUE, *,
             content_type: str = "text/plain; charset=UTF-8") -> bytes:
    return ("From: " + from_ + "\r\nTo: " + ACME + "\r\nSubject: " + subject + "\r\n"
            "Date: Wed, 2 Dec 2026 09:14:03 +0100\r\n"
            "Message-ID: <CAF=fwd-sample@mail.gmail.com>\r\nMIME-Version: 1.0\r\n"
            "Content-Type: " + content_type + "\r\n\r\n" + body.replace("\n", "\r\n")
            ).encode()


GMAIL = _message("Fwd: Pricing for 20 seats", (
    "Can someone from sales pick this up? She called me yesterday too.\n\n"
    "Bob\n\n"
    "---------- Forwarded message ---------\n"
    "From: Jane Roe <jane.roe@initech.example>\n"
    "Date: Tue, Dec 1, 2026 at 4:02 PM\n"
    "Subject: Pricing for 20 seats\n"
    "To: Bob Miller <bob@acme.test>\n\n\n"
    "Hi Bob,\n\n"
    "could you send me pricing for 20 seats of the team plan?\n\n"
    "Thanks,\nJane Roe\nInitech\n"))

OUTLOOK = _message("FW: Pricing for 20 seats", (
    "Please follow up with her.\n\n"
    "Bob\n\n"
    "________________________________\n"
    "From: Jane Roe <jane.roe@initech.example>\n"
    "Sent: Tuesday, December 1, 2026 4:02 PM\n"
    "To: Bob Miller <bob@acme.test>\n"
    "Subject: Pricing for 20 seats\n\n"
    "Hi Bob,\n\n"
    "could you send me pricing for 20 seats of the team plan?\n\n"
    "Thanks,\nJane Roe\nInitech\n"))

# Outlook's newer desktop client: bold labels in the plain-text part, a bare address.
OUTLOOK_BOLD = _message("FW: Pricing for 20 seats", (
    "FYI, for sales.\n\n"
    "From: jane.roe@initech.example <jane.roe@initech.example>\n"
    "Sent: Tuesday, 1 December 2026 16:02\n"
    "To: Bob Miller <bob@acme.test>\n"
    "Subject: Pricing for 20 seats\n\n"
    "Hi Bob, could you send me pricing for 20 seats?\n\nJane\n"))

APPLE = _message("Fwd: Pricing for 20 seats", (
    "For you.\n\n"
    "Begin forwarded message:\n\n"
    "From: Jane Roe <jane.roe@initech.example>\n"
    "Subject: Pricing for 20 seats\n"
    "Date: 1 December 2026 at 16:02:11 CET\n"
    "To: Bob Miller <bob@acme.test>\n\n"
    "Hi Bob, could you send me pricing for 20 seats?\n\nJane\n"))

_INNER = ("From: Jane Roe <jane.roe@initech.example>\r\nTo: Bob Miller <bob@acme.test>\r\n"
          "Subject: Pricing for 20 seats\r\nDate: Tue, 1 Dec 2026 16:02:11 +0100\r\n"
          "Message-ID: <inner-1@initech.example>\r\n"
          "Content-Type: text/plain; charset=UTF-8\r\n\r\n"
          "Hi Bob,\r\n\r\ncould you send me pricing for 20 seats?\r\n\r\nJane Roe\r\n")

ATTACHED = _message("Fw: Pricing for 20 seats", (
    "--b1\n"
    "Content-Type: text/plain; charset=UTF-8\n\n"
    "Forwarding as an attachment, can sales answer her?\n\nBob\n"
    "--b1\n"
    "Content-Type: message/rfc822\n"
    'Content-Disposition: attachment; filename="Pricing for 20 seats.eml"\n\n'
    + _INNER.replace("\r\n", "\n") +
    "\n--b1--\n"), content_type='multipart/mixed; boundary="b1"')


@pytest.mark.parametrize("raw", [GMAIL, OUTLOOK, OUTLOOK_BOLD, APPLE, ATTACHED],
                         ids=["gmail", "outlook", "outlook-bold", "apple-mail", "rfc822"])
async def test_a_colleagues_forward_names_the_original_sender_for_review(
        acme: TenantPolicy, raw: bytes) -> None:
    msg = minimise(raw)
    assert msg.forwarded
    assert [m.address for m in msg.forwarded_from] == [ORIGINAL]
    outcome = await extract_and_route(raw, acme)
    assert outcome.route == "review", outcome.reasons
    assert outcome.reasons[0] == "internal_forward"
    assert "own_domain" not in outcome.reasons
    # The candidate is the original sender, never the colleague.
    assert outcome.canonical_email == ORIGINAL
    assert outcome.extraction.sender_email.value == ORIGINAL
    assert outcome.extraction.needs_human_review


async def test_the_colleague_without_a_forward_is_still_own_mail(acme: TenantPolicy) -> None:
    raw = _message("Lunch?", "Lunch at 12?\n\nBob\n")
    outcome = await extract_and_route(raw, acme)
    assert (outcome.route, outcome.reasons) == ("ignore", ["own_domain"])
    assert outcome.canonical_email is None


async def test_a_colleague_forwarding_a_colleague_is_not_a_lead(acme: TenantPolicy) -> None:
    raw = _message("Fwd: Offsite", GMAIL.decode().split("\r\n\r\n", 1)[1]
                   .replace("jane.roe@initech.example", "carol@acme.test")
                   .replace("\r\n", "\n"))
    outcome = await extract_and_route(raw, acme)
    assert outcome.route == "ignore" and "own_domain" in outcome.reasons
    assert outcome.canonical_email is None


async def test_an_outside_sender_forwarding_is_not_a_colleagues_forward(
        acme: TenantPolicy) -> None:
    """Only the tenant's own domain makes a forward a colleague's: an outside forwarder is
    not replaced by the person they forwarded."""
    raw = GMAIL.replace(COLLEAGUE.encode(), b"Max Partner <max@partner.example>")
    outcome = await extract_and_route(raw, acme)
    assert "internal_forward" not in outcome.reasons
    assert outcome.canonical_email != ORIGINAL
