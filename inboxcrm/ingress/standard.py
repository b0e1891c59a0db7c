"""Standard Webhooks source: `POST /v1/inbound/standard` (HMAC-signed JSON body naming the
tenant, mailbox, delivery ID and the raw message; section 10 of `docs/architecture.md`)."""

from __future__ import annotations

import binascii
import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from inboxcrm.domain.policy import UnknownTenant, get_policy
from inboxcrm.ingress.intake import (
    DELIVERY_ID,
    BadRequest,
    Delivery,
    count_auth_failure,
    error_response,
    ingest_response,
)
from inboxcrm.ingress.web import read_body
from inboxcrm.platform.config import Settings


def parse_standard_body(payload: Any, max_raw_bytes: int) -> Delivery:
    """Validate the Standard Webhooks body of docs/architecture.md §10; messages name the field."""
    if not isinstance(payload, dict):
        raise BadRequest("body must be a JSON object")
    for name in ("tenant", "mailbox", "delivery_id", "raw"):
        if not isinstance(payload.get(name), str) or not payload[name]:
            raise BadRequest(f"field '{name}' is required and must be a non-empty string")
    tenant, mailbox = payload["tenant"], payload["mailbox"].strip().lower()
    if not DELIVERY_ID.match(payload["delivery_id"]):
        raise BadRequest("field 'delivery_id' must be 1-255 printable ASCII characters")
    try:
        policy = get_policy(tenant)
    except UnknownTenant:
        raise BadRequest("unknown tenant") from None
    if mailbox not in {m.lower() for m in policy.mailboxes}:
        raise BadRequest("mailbox is not one of the tenant's mailboxes")
    raw = payload["raw"].encode("utf-8", errors="surrogateescape")
    if len(raw) > max_raw_bytes:
        raise BadRequest("field 'raw' is too large")
    return Delivery(tenant, "standard", mailbox, payload["delivery_id"], raw)



def standard_router(settings: Settings) -> APIRouter:
    """POST /v1/inbound/standard."""
    router = APIRouter()
    webhook = Webhook(settings.webhook_secret)

    @router.post("/v1/inbound/standard")
    async def inbound_standard(request: Request) -> JSONResponse:
        body = await read_body(request, settings.max_body_bytes)
        if body is None:
            return error_response(413, f"body exceeds {settings.max_body_bytes} bytes")
        try:
            webhook.verify(body, dict(request.headers), json_parse=False)
        except (WebhookVerificationError, UnicodeDecodeError, ValueError, binascii.Error):
            count_auth_failure(request, "standard")
            return error_response(401, "invalid or missing webhook signature")
        try:
            parsed = json.loads(body)
        except ValueError:
            return error_response(422, "body is not valid JSON")
        try:
            delivery = parse_standard_body(parsed, settings.max_body_bytes)
        except BadRequest as exc:
            return error_response(422, str(exc))
        return await ingest_response(request, delivery)

    return router
