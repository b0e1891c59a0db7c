"""Raw test messages shared by several scenarios."""

from __future__ import annotations

import uuid


def no_sender_message(body: str = "Hi, pricing for 20 seats please.\n\nJane") -> str:
    return (f"To: sales@acme.test\r\nSubject: pricing\r\nMessage-ID: <{uuid.uuid4().hex}@x>\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\n\r\n{body}\r\n")
