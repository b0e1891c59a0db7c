"""One-click unsubscribe (RFC 8058) for outgoing follow-ups.

Every follow-up carries
    List-Unsubscribe: <{public relay URL}/v1/unsubscribe/{token}>
    List-Unsubscribe-Post: List-Unsubscribe=One-Click
The token names the tenant and the contact (our opaque contact UUID, never the address)
and is signed: `u1.{tenant}.{base64url contact UUID}.{base64url HMAC-SHA256[:18]}` with
`INBOXCRM_UNSUBSCRIBE_SECRET`. It is deterministic, so a retried send carries the very same
header (the provider's idempotency check compares payloads).

`POST /v1/unsubscribe/{token}` has the effect of an opt-out email (activities/match.py
`record_opt_out`), in ONE transaction: suppression for the contact's identity (ON CONFLICT
DO NOTHING), queued/awaiting-approval intents for it cancelled, the contact marked
suppressed, one audit entry. Repeating it answers 200 again and writes nothing. A forged,
malformed or unknown token is a 404 without detail. `GET` only shows a confirmation form
(link scanners must not unsubscribe anyone).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import re
import time
import uuid
from typing import Any

import asyncpg
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse

from activities import store
from activities.suppression import SendInFlight, suppress_identity
from inboxcrm.config import Settings, get_settings
from inboxcrm.web import read_body

log = logging.getLogger("inboxcrm.unsubscribe")

TOKEN_VERSION = "u1"
MAC_BYTES = 18
MAX_BODY_BYTES = 4096
SUPPRESSION_REASON = "list_unsubscribe"
_TENANT = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_B64URL = re.compile(r"^[A-Za-z0-9_-]+$")
_warned = False

FIND_CONTACT = """
SELECT contact_id, canonical_email, status FROM contacts
WHERE tenant = $1 AND contact_id = $2
FOR UPDATE
"""


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
    if settings.unsubscribe_secret is None:
        return None
    token = make_token(settings.unsubscribe_secret.get_secret_value(), tenant, contact_id)
    return f"{settings.public_relay_base_url}/v1/unsubscribe/{token}"


def list_unsubscribe_headers(tenant: str, contact_id: str | uuid.UUID,
                             settings: Settings | None = None) -> dict[str, str]:
    """The RFC 8058 headers for a follow-up to this contact; {} when no secret is set."""
    global _warned
    url = unsubscribe_url(settings or get_settings(), tenant, contact_id)
    if url is None:
        if not _warned:
            log.warning("INBOXCRM_UNSUBSCRIBE_SECRET not set: follow-ups carry no "
                        "List-Unsubscribe header")
            _warned = True
        return {}
    return {"List-Unsubscribe": f"<{url}>",
            "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"}


async def record_unsubscribe(pool: asyncpg.Pool, tenant: str, contact_id: uuid.UUID,
                             wait_seconds: float = 30.0) -> dict[str, Any] | None:
    """Suppress the contact's identity and cancel its queued intents, atomically and
    idempotently. None when the contact does not exist. A follow-up already on the wire is
    waited for (bounded), so the suppression is never recorded before an email it missed."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            return await _record_unsubscribe(pool, tenant, contact_id)
        except SendInFlight as busy:
            if time.monotonic() + min(busy.retry_after, 2.0) > deadline:
                raise
            await asyncio.sleep(min(busy.retry_after, 2.0))


async def _record_unsubscribe(pool: asyncpg.Pool, tenant: str,
                              contact_id: uuid.UUID) -> dict[str, Any] | None:
    async with pool.acquire() as conn, conn.transaction():
        contact = await conn.fetchrow(FIND_CONTACT, tenant, contact_id)
        if contact is None:
            return None
        suppression = await suppress_identity(
            conn, tenant, contact["canonical_email"], reason=SUPPRESSION_REASON,
            source=f"unsubscribe:{contact_id}", cancel_reason="unsubscribed")
        changed, cancelled = suppression.changed, suppression.cancelled_intents
        if changed:
            await store.audit(
                conn, tenant=tenant, event_id=None, workflow_id=None,
                contact_id=str(contact_id), actor="unsubscribe",
                action="suppression_recorded",
                detail={"reason": SUPPRESSION_REASON, "suppression_added": suppression.added,
                        "cancelled_intents": cancelled},
            )
    return {"changed": changed, "cancelled_intents": cancelled}


_CONFIRM_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Unsubscribe</title>
<meta name="robots" content="noindex"></head>
<body><form method="post">
<input type="hidden" name="List-Unsubscribe" value="One-Click">
<p>Stop receiving follow-up emails from us?</p>
<button type="submit">Unsubscribe</button>
</form></body></html>
"""


def unsubscribe_router(settings: Settings) -> APIRouter:
    """POST /v1/unsubscribe/{token} (one-click) and GET (a confirmation form only)."""
    router = APIRouter()
    secret = settings.unsubscribe_secret.get_secret_value() if settings.unsubscribe_secret \
        else None

    def _not_found() -> JSONResponse:
        return JSONResponse({"status": "error", "message": "unknown unsubscribe link"},
                            status_code=404)

    @router.post("/v1/unsubscribe/{token}")
    async def unsubscribe(token: str, request: Request) -> JSONResponse:
        if await read_body(request, MAX_BODY_BYTES) is None:
            return JSONResponse({"status": "error", "message": "body too large"},
                                status_code=413)
        ref = read_token(secret, token) if secret else None
        if ref is None:
            return _not_found()
        pool: asyncpg.Pool = request.app.state.ingestor.pool
        try:
            outcome = await record_unsubscribe(pool, *ref)
        except (TimeoutError, asyncpg.PostgresError, OSError, SendInFlight):
            log.warning("unsubscribe deferred: database unavailable or a send in flight")
            return JSONResponse({"status": "error", "message": "unavailable; retry later"},
                                status_code=503)
        if outcome is None:
            return _not_found()
        return JSONResponse({"status": "unsubscribed"})

    @router.get("/v1/unsubscribe/{token}", response_model=None)
    async def confirm(token: str) -> HTMLResponse | JSONResponse:
        if not secret or read_token(secret, token) is None:
            return _not_found()
        return HTMLResponse(_CONFIRM_PAGE, headers={"Cache-Control": "no-store"})

    return router
