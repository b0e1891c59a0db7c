"""Resend-compatible mail adapter (also the sandbox's contract).

The intent's UUID is the `Idempotency-Key`: for 24 hours after the key's first request,
Resend answers the identical request with the same email's ID and sends nothing, so a retry
inside that window can never send a second follow-up, and repeating the request is how an
unknown outcome is reconciled. Resend offers no lookup by key (its list takes only `limit`,
`after` and `before`), so past the window nothing can confirm the outcome: the operation is
held (`inboxcrm/activities/outbox.py`). A key reused with another payload (409
`invalid_idempotent_request`) is held too; a key whose first request is still running (409
`concurrent_idempotent_requests`) is an outcome not known yet: repeated later, as Resend
documents, keeping the intent's lease (an opt-out waits for it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar
from urllib.parse import quote

import httpx
from pydantic import model_validator

from inboxcrm.adapters.base import AdapterError, OutgoingEmail, SentEmail, SentRecord
from inboxcrm.adapters.errors import Category, Classified
from inboxcrm.adapters.http import json_field, send_request
from inboxcrm.adapters.registry import (
    ConfigurationError,
    MailProvider,
    Secrets,
    register,
    secret_value,
)
from inboxcrm.adapters.transport import AddressGuard, new_client
from inboxcrm.schemas.destinations import MailDestination, SecretRef

if TYPE_CHECKING:
    from inboxcrm.platform.config import Settings

RESEND_API = "https://api.resend.com"

KEY_WINDOW_SECONDS = 24 * 3600.0  # Resend keeps an idempotency key 24 h after first use


def _reason(response: httpx.Response) -> str | None:
    name = json_field(response, "name")
    return f"http_{response.status_code}:{name}" if name else None


class ResendMail:
    name = "resend"
    reconcilable = True
    key_window_seconds: float | None = KEY_WINDOW_SECONDS

    def __init__(self, base_url: str, token: str | None, sender: str, timeout: float,
                 guard: AddressGuard | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = new_client(base_url, headers, timeout, guard)
        self._base_url = base_url.rstrip("/")
        self._sender = sender

    @property
    def endpoint(self) -> str:
        """The base URL this client calls (no credentials): what a worker reports of its
        destinations (`Destinations.endpoints`)."""
        return str(self._client.base_url)

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

    def where_to_look(self, idempotency_key: str) -> str:
        """Resend has no lookup by Idempotency-Key: its list (newest first, `limit`,
        `after`, `before` only) is where a person looks for the follow-up's recipient and
        subject after the first attempt; the ID found is the `resolve` evidence
        (resend.com/docs/api-reference/emails/list-emails)."""
        return (f"GET {self._base_url}/emails?limit=100 (no lookup by Idempotency-Key "
                f"{idempotency_key}: find the recipient and subject shown on this card, "
                "created after the first attempt; then GET "
                f"{self._base_url}/emails/<id> and resolve with that id)")

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


# --- the providers: Resend, and the sandbox that speaks Resend's API --------------------------
class ResendDestination(MailDestination):
    """A tenant's Resend account (`destinations.mail` with `"provider": "resend"`). Its From
    is the policy's `sender.from`, given per message; INBOXCRM_MAIL_FROM stays the
    fallback."""

    token_required: ClassVar[bool] = True
    # Resend's API host (resend.com/docs/api-reference/introduction).
    documented_hosts: ClassVar[tuple[str, ...]] = ("api.resend.com",)
    url: str | None = None           # API base URL (default: the public API)
    token: SecretRef | None = None   # the API key

    def endpoints(self) -> list[tuple[str, str]]:
        return [("url", self.url)] if self.url else []

    @model_validator(mode="after")
    def _complete(self) -> ResendDestination:
        if self.token_required and self.token is None:
            raise ValueError(f"a {self.provider} destination needs its token")
        return self


class SandboxMailDestination(ResendDestination):
    """An account on the Resend-compatible sandbox (default: the global sandbox URL)."""

    token_required: ClassVar[bool] = False
    # None: a sandbox URL in a policy must be one the operator allows (unset: theirs).
    documented_hosts: ClassVar[tuple[str, ...]] = ()


@register
class ResendProvider(MailProvider[ResendDestination]):
    name = ResendMail.name
    destination = ResendDestination
    sandbox = ("inboxcrm/sandbox/mail.py",)
    conformance = "tests/conformance/test_resend.py"
    default_url: ClassVar[str | None] = RESEND_API

    def _url(self, settings: Settings) -> str:
        return self.default_url or settings.sandbox_url

    def from_settings(self, settings: Settings) -> ResendMail:
        token = secret_value(settings.mail_token)
        if self.destination.token_required and not token:
            raise ConfigurationError(f"INBOXCRM_MAIL_TOKEN is required for the {self.name} "
                                     "provider")
        return ResendMail(settings.mail_url or self._url(settings), token, settings.mail_from,
                          settings.http_timeout_seconds)

    def from_destination(self, spec: ResendDestination, settings: Settings,
                         secrets: Secrets) -> ResendMail:
        return ResendMail(spec.url or self._url(settings), secrets.optional(spec.token, "token"),
                          settings.mail_from, settings.http_timeout_seconds, secrets.guard)


@register
class SandboxMailProvider(ResendProvider):
    """`sandbox`: the Resend adapter against the sandbox (INBOXCRM_SANDBOX_URL, or
    INBOXCRM_MAIL_URL when set)."""

    name = "sandbox"
    destination = SandboxMailDestination
    default_url = None
