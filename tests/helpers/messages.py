"""Raw test messages shared by several scenarios."""

from __future__ import annotations

import re
import uuid

# The demo tenant with production defaults (docs/architecture.md §10).
GLOBEX = {"tenant": "globex", "mailbox": "hello@globex.test"}
_FROM_DOMAIN = re.compile(r"^From:.*@([A-Za-z0-9.-]+)>?\s*$", re.MULTILINE)


def to_globex(raw: str) -> str:
    """The message as globex's MX hands it over: addressed to globex, with the MX's own
    `Authentication-Results` (DMARC pass for the From domain) on top."""
    raw = raw.replace("sales@acme.test", GLOBEX["mailbox"])
    sender = _FROM_DOMAIN.search(raw)
    if sender is None:
        return raw
    return (f"Authentication-Results: mx.globex.test; dmarc=pass header.from={sender.group(1)}"
            f"\r\n{raw}")


def no_sender_message(body: str = "Hi, pricing for 20 seats please.\n\nJane") -> str:
    return (f"To: sales@acme.test\r\nSubject: pricing\r\nMessage-ID: <{uuid.uuid4().hex}@x>\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\n\r\n{body}\r\n")
