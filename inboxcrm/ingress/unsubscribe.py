"""`POST /v1/unsubscribe/{token}`: one-click unsubscribe (RFC 8058) for the links of
`inboxcrm.domain.unsubscribe_links`.

`POST /v1/unsubscribe/{token}` has the effect of an opt-out email (inboxcrm/activities/match.py
`record_opt_out`), in ONE transaction: suppression for the contact's identity (ON CONFLICT
DO NOTHING), queued/awaiting-approval intents for it cancelled, the contact marked
suppressed, one audit entry. Repeating it answers 200 again and writes nothing. A forged,
malformed or unknown token is a 404 without detail. `GET` only shows a confirmation form
(link scanners must not unsubscribe anyone).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import asyncpg
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse

from inboxcrm.domain.policy import PolicyError, UnknownTenant, get_policy
from inboxcrm.domain.unsubscribe_links import read_token
from inboxcrm.ingress.deps import DeskPoolDep
from inboxcrm.ingress.web import read_body
from inboxcrm.platform.config import Settings
from inboxcrm.store import audit, contacts
from inboxcrm.store.suppression import SendInFlight, suppress_identity

log = logging.getLogger("inboxcrm.ingress.unsubscribe")

MAX_BODY_BYTES = 4096
SUPPRESSION_REASON = "list_unsubscribe"


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
        contact = await contacts.lock_contact(conn, tenant=tenant, contact_id=contact_id)
        if contact is None:
            return None
        scope, marketing_rules = _scope_of(tenant)
        suppression = await suppress_identity(
            conn, tenant, contact["canonical_email"], reason=SUPPRESSION_REASON,
            source=f"unsubscribe:{contact_id}", cancel_reason="unsubscribed",
            scope=scope, marketing_rules=marketing_rules)
        changed, cancelled = suppression.changed, suppression.cancelled_intents
        if changed:
            await audit.append(
                conn, tenant=tenant, event_id=None, workflow_id=None,
                contact_id=str(contact_id), actor="unsubscribe",
                action="suppression_recorded",
                detail={"reason": SUPPRESSION_REASON, "suppression_added": suppression.added,
                        "cancelled_intents": cancelled, "scope": suppression.scope,
                        "crm_write": suppression.crm_write},
            )
    return {"changed": changed, "cancelled_intents": cancelled}


def _scope_of(tenant: str) -> tuple[str, list[str]]:
    """The tenant's scope for a one-click unsubscribe and its marketing rules; a policy that
    cannot be read narrows nothing (`all`: the safe side)."""
    try:
        policy = get_policy(tenant)
    except (UnknownTenant, PolicyError):
        return "all", []
    return policy.suppression_scope(SUPPRESSION_REASON), policy.marketing_rule_ids()


_CONFIRM_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Unsubscribe</title>
<meta name="robots" content="noindex"></head>
<body><form method="post">
<input type="hidden" name="List-Unsubscribe" value="One-Click">
<p>Stop receiving follow-up emails from us?</p>
<button type="submit">Unsubscribe</button>
</form></body></html>
"""


def _not_found() -> JSONResponse:
    return JSONResponse({"status": "error", "message": "unknown unsubscribe link"},
                        status_code=404)


class UnsubscribeLinks:
    """The one-click links of follow-ups (RFC 8058): the link is the credential, signed with
    INBOXCRM_UNSUBSCRIBE_SECRET. Handlers are methods, so a test can call them."""

    def __init__(self, settings: Settings) -> None:
        self.secret = (settings.unsubscribe_secret.get_secret_value()
                       if settings.unsubscribe_secret else None)

    async def unsubscribe(self, token: str, request: Request, pool: DeskPoolDep) -> JSONResponse:
        """POST /v1/unsubscribe/{token}: record the opt-out (no body needed)."""
        ref = read_token(self.secret, token) if self.secret else None
        if ref is None:
            return _not_found()
        if await read_body(request, MAX_BODY_BYTES) is None:
            return JSONResponse({"status": "error", "message": "body too large"},
                                status_code=413)
        try:
            outcome = await record_unsubscribe(pool, *ref)
        except (TimeoutError, asyncpg.PostgresError, OSError, SendInFlight):
            log.warning("unsubscribe deferred: database unavailable or a send in flight")
            return JSONResponse({"status": "error", "message": "unavailable; retry later"},
                                status_code=503)
        if outcome is None:
            return _not_found()
        return JSONResponse({"status": "unsubscribed"})

    async def confirm(self, token: str) -> HTMLResponse | JSONResponse:
        """GET /v1/unsubscribe/{token}: a confirmation form only (a link scanner that
        follows the link changes nothing)."""
        if not self.secret or read_token(self.secret, token) is None:
            return _not_found()
        return HTMLResponse(_CONFIRM_PAGE, headers={"Cache-Control": "no-store"})

    def router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/v1/unsubscribe/{token}", self.unsubscribe, methods=["POST"])
        router.add_api_route("/v1/unsubscribe/{token}", self.confirm, methods=["GET"],
                             response_model=None)
        return router


def unsubscribe_router(settings: Settings) -> APIRouter:
    """POST /v1/unsubscribe/{token} (one-click) and GET (a confirmation form only)."""
    return UnsubscribeLinks(settings).router()
