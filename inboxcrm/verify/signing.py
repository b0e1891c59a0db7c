"""Client side of the Standard Webhooks signature, for the CLI, tests and benchmarks."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from standardwebhooks.webhooks import Webhook


def signed_headers(secret: str, body: bytes, *, msg_id: str | None = None,
                   timestamp: float | None = None) -> dict[str, str]:
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    ts = int(time.time() if timestamp is None else timestamp)
    signature = Webhook(secret).sign(msg_id, datetime.fromtimestamp(ts, tz=UTC), body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(ts), "webhook-signature": signature,
            "content-type": "application/json"}


def standard_body(tenant: str, mailbox: str, delivery_id: str, raw: str) -> bytes:
    payload: dict[str, Any] = {"tenant": tenant, "mailbox": mailbox, "delivery_id": delivery_id,
                               "raw": raw}
    return json.dumps(payload).encode()


def sample_message(sender: str = "Jane Doe <jane.doe@example.com>",
                   subject: str = "Pricing for 20 seats",
                   body: str = "Hi, could you send me pricing for 20 seats?\n\nThanks,\nJane Doe\n"
                               "Example Corp\n",
                   message_id: str | None = None) -> str:
    message_id = message_id or f"<{uuid.uuid4().hex}@example.com>"
    return (f"From: {sender}\r\nTo: sales@acme.test\r\nSubject: {subject}\r\n"
            f"Message-ID: {message_id}\r\nDate: Sun, 29 Nov 2026 10:00:00 +0000\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\n\r\n{body}")
