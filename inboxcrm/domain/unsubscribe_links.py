"""One-click unsubscribe links (RFC 8058) for outgoing follow-ups.

Every follow-up carries
    List-Unsubscribe: <{public relay URL}/v1/unsubscribe/{token}>
    List-Unsubscribe-Post: List-Unsubscribe=One-Click
The same link is in the body of every follow-up (the template's `{{ opt_out_url }}`).
The token names the tenant and the contact (our opaque contact UUID, never the address)
and is signed: `u1.{tenant}.{base64url contact UUID}.{base64url HMAC-SHA256[:18]}` with
`INBOXCRM_UNSUBSCRIBE_SECRET`. It is deterministic, so a retried send carries the very same
header (the provider's idempotency check compares payloads). The endpoint that honours it
is `inboxcrm.ingress.unsubscribe`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import uuid

from inboxcrm.platform.config import Settings

TOKEN_VERSION = "u1"
MAC_BYTES = 18
_TENANT = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_B64URL = re.compile(r"^[A-Za-z0-9_-]+$")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, tenant: str, contact_id: uuid.UUID) -> bytes:
    message = f"inboxcrm-unsubscribe:{TOKEN_VERSION}:{tenant}:{contact_id}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).digest()[:MAC_BYTES]


def make_token(secret: str, tenant: str, contact_id: str | uuid.UUID) -> str:
    if not _TENANT.match(tenant):
        raise ValueError("invalid tenant")
    cid = contact_id if isinstance(contact_id, uuid.UUID) else uuid.UUID(str(contact_id))
    return f"{TOKEN_VERSION}.{tenant}.{_b64(cid.bytes)}.{_b64(_mac(secret, tenant, cid))}"


def read_token(secret: str, token: str) -> tuple[str, uuid.UUID] | None:
    """(tenant, contact_id) of an authentic token, else None (no reason given)."""
    if len(token) > 200:
        return None
    parts = token.split(".")
    if len(parts) != 4 or parts[0] != TOKEN_VERSION:
        return None
    _, tenant, cid_text, mac_text = parts
    if not _TENANT.match(tenant) or not _B64URL.match(cid_text) or not _B64URL.match(mac_text):
        return None
    try:
        cid = uuid.UUID(bytes=_unb64(cid_text))
        mac = _unb64(mac_text)
    except (ValueError, binascii.Error):
        return None
    if _b64(cid.bytes) != cid_text:  # one spelling per token
        return None
    if not hmac.compare_digest(mac, _mac(secret, tenant, cid)):
        return None
    return tenant, cid


def unsubscribe_url(settings: Settings, tenant: str, contact_id: str | uuid.UUID) -> str | None:
    """The opt-out link of this contact; None without a secret (then no follow-up may be
    sent: `inboxcrm.domain.followup.compose` refuses)."""
    if settings.unsubscribe_secret is None:
        return None
    token = make_token(settings.unsubscribe_secret.get_secret_value(), tenant, contact_id)
    return f"{settings.public_relay_base_url}/v1/unsubscribe/{token}"
