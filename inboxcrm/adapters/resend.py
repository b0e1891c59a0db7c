"""Resend-compatible mail adapter (also the sandbox's contract).

The intent's UUID is the `Idempotency-Key`: for 24 hours after the key's first request,
Resend answers the identical request with the same email's ID and sends nothing, so a retry
inside that window can never send a second follow-up, and repeating the request is how an
unknown outcome is reconciled. Resend offers no lookup by key (its list takes only `limit`,
`after` and `before`), so past the window nothing can confirm the outcome: the operation is
held (`activities/outbox.py`). A key reused with another payload (409
`invalid_idempotent_request`) is held too; a key whose first request is still running (409
`concurrent_idempotent_requests`) is an outcome not known yet: repeated later, as Resend
documents, keeping the intent's lease (an opt-out waits for it).
"""

from __future__ import annotations

from urllib.parse import quote

import httpx

from inboxcrm.adapters.base import AdapterError, OutgoingEmail, SentEmail, SentRecord
from inboxcrm.adapters.errors import Category, Classified
from inboxcrm.adapters.http import json_field, send_request
from inboxcrm.adapters.transport import new_client

KEY_WINDOW_SECONDS = 24 * 3600.0  # Resend keeps an idempotency key 24 h after first use


def _reason(response: httpx.Response) -> str | None:
    name = json_field(response, "name")
    return f"http_{response.status_code}:{name}" if name else None


class ResendMail:
    name = "resend"
    reconcilable = True
    key_window_seconds: float | None = KEY_WINDOW_SECONDS

    def __init__(self, base_url: str, token: str | None, sender: str, timeout: float) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = new_client(base_url, headers, timeout)
        self._sender = sender

    async def send(self, idempotency_key: str, message: OutgoingEmail) -> SentEmail:
        body: dict[str, object] = {
            "from": message.sender or self._sender, "to": [message.to],
            "subject": message.subject, "text": message.text, "headers": message.headers}
        if message.html is not None:
            body["html"] = message.html
        if message.reply_to is not None:
            body["reply_to"] = message.reply_to
        response = await send_request(
            self._client, "POST", "/emails", json=body,
            headers={"Idempotency-Key": idempotency_key}, reason=_reason,
        )
        return SentEmail(message_id=str(response.json()["id"]))

    async def read_sent(self, message_id: str) -> SentRecord | None:
        """`GET /emails/{id}`: 404 when the provider does not know the ID. Resend's answer
        carries no idempotency key; the sandbox's does, and then it is compared too."""
        response = await send_request(
            self._client, "GET", f"/emails/{quote(message_id, safe='')}", passthrough=(404,),
            reason=_reason,
        )
        if response.status_code == 404:
            return None
        try:
            body = response.json()
            found = str(body["id"])
        except (ValueError, KeyError, TypeError):
            raise AdapterError(Classified(Category.UNKNOWN, "response_mismatch", None,
                                          response.status_code)) from None
        key = body.get("idempotency_key") if isinstance(body, dict) else None
        return SentRecord(message_id=found, idempotency_key=str(key) if key else None)

    async def aclose(self) -> None:
        await self._client.aclose()
