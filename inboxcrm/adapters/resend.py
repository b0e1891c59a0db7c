"""Resend-compatible mail adapter (also the sandbox's contract).

The intent's UUID is the `Idempotency-Key`: the provider answers a repeated key with the
same email, so a retry can never send a second follow-up.
"""

from __future__ import annotations

from urllib.parse import quote

import httpx

from inboxcrm.adapters.base import AdapterError, OutgoingEmail, SentEmail, SentRecord
from inboxcrm.adapters.errors import Category, Classified
from inboxcrm.adapters.http import json_field, send_request
from inboxcrm.adapters.transport import new_client


def _reason(response: httpx.Response) -> str | None:
    name = json_field(response, "name")
    return f"http_{response.status_code}:{name}" if name else None


class ResendMail:
    name = "resend"
    reconcilable = True

    def __init__(self, base_url: str, token: str | None, sender: str, timeout: float) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = new_client(base_url, headers, timeout)
        self._sender = sender

    async def send(self, idempotency_key: str, message: OutgoingEmail) -> SentEmail:
        body = {"from": self._sender, "to": [message.to], "subject": message.subject,
                "text": message.text, "headers": message.headers}
        response = await send_request(
            self._client, "POST", "/emails", json=body,
            headers={"Idempotency-Key": idempotency_key}, reason=_reason,
        )
        return SentEmail(message_id=str(response.json()["id"]))

    async def find_sent(self, idempotency_key: str) -> SentEmail | None:
        response = await send_request(
            self._client, "GET", "/emails", params={"idempotency_key": idempotency_key},
            reason=_reason,
        )
        found = response.json().get("data") or []
        return SentEmail(message_id=str(found[0]["id"])) if found else None

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
