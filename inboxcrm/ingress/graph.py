"""`POST /v1/inbound/graph`: Microsoft Graph's change and lifecycle notifications for the
mailboxes watched over Graph (docs/mailboxes.md, docs/architecture.md §10).

- A request with `validationToken` in its query is Graph's validation handshake (on
  creating a subscription, for its notification and lifecycle URLs): the token is echoed,
  decoded, as `text/plain` with 200 within Graph's 10 seconds; the body is not read.
- Otherwise the body is `{"value": [notification, ...]}` (read under a cap). Every
  notification's `subscriptionId` must be one of ours and its `clientState` must hash
  (SHA-256, compared in constant time) to the one stored for that subscription, **before
  anything else**: one that does not is refused (401) with nothing stored and no watcher
  woken. Graph has no signature on these notifications; the clientState secret is the
  check it documents (learn.microsoft.com/graph/change-notifications-delivery-webhooks).
- Verified notifications only wake the mailbox's watcher (the signal `graph_notice` with
  the immutable IDs and lifecycle events): the worker fetches each message's MIME and
  stores it, so nothing Graph sends is trusted as mail. Answered 202, as Graph expects
  within 3 seconds; 503 (Graph retries) when Temporal cannot be reached.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections import defaultdict
from typing import Any

import asyncpg
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from temporalio.service import RPCError, RPCStatusCode

from inboxcrm.ingress.deps import IngestorDep
from inboxcrm.ingress.intake import error_response
from inboxcrm.ingress.web import read_stream
from inboxcrm.platform.config import Settings
from inboxcrm.schemas.graph_mailbox import (
    GRAPH_KIND,
    GRAPH_NOTICE_SIGNAL,
    LIFECYCLE_EVENTS,
    GraphNotice,
)
from inboxcrm.schemas.mailboxes import mailbox_workflow_id
from inboxcrm.store import subscriptions

log = logging.getLogger("inboxcrm.ingress.graph")

PATH = "/v1/inbound/graph"
# Graph batches notifications; a batch for mail is small (IDs, no content).
MAX_BODY_BYTES = 1024 * 1024
MAX_NOTIFICATIONS = 1000
MAX_TOKEN_CHARS = 2048
_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_=+-")


def graph_router(settings: Settings) -> APIRouter:
    """The route of Graph's notifications."""
    router = APIRouter()
    router.add_api_route(PATH, graph_notifications, methods=["POST"], name="inbound_graph")
    return router


async def graph_notifications(request: Request, ingestor: IngestorDep) -> Response:
    token = request.query_params.get("validationToken")
    if token is not None:
        if not token or len(token) > MAX_TOKEN_CHARS:
            return error_response(400, "validationToken: 1 to 2048 characters")
        # Starlette has URL-decoded it already, as Graph asks.
        return PlainTextResponse(token, headers={"X-Content-Type-Options": "nosniff"})
    body = await read_stream(request.headers.get("content-length"), request.stream(),
                             MAX_BODY_BYTES)
    if body is None:
        return error_response(413, "notification batch too large")
    notifications = _notifications(body)
    if notifications is None:
        return error_response(422, "expected {\"value\": [notification, ...]}")
    try:
        async with ingestor.pool.acquire() as conn:
            verified = [await _verify(conn, item) for item in notifications]
    except (OSError, RuntimeError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        log.warning("graph notification: store unavailable (%s)", type(exc).__name__)
        return error_response(503, "store unavailable; retry later")
    if any(folder is None for folder in verified):
        # Unknown subscription or wrong clientState: nothing stored, nobody woken.
        log.warning("graph notification refused: unknown subscription or wrong clientState")
        return error_response(401, "unknown subscription or wrong clientState")
    notices: dict[tuple[str, str, str], GraphNotice] = defaultdict(GraphNotice)
    for item, where in zip(notifications, verified, strict=True):
        assert where is not None
        notice = notices[where]
        event = item.get("lifecycleEvent")
        if isinstance(event, str):
            if event in LIFECYCLE_EVENTS and event not in notice.lifecycle:
                notice.lifecycle.append(event)
            continue
        if item.get("changeType") != "created":
            continue
        data = item.get("resourceData")
        message_id = data.get("id") if isinstance(data, dict) else None
        if (isinstance(message_id, str) and 0 < len(message_id) <= 512
                and set(message_id) <= _ID_CHARS and message_id not in notice.ids):
            notice.ids.append(message_id)
        else:
            notice.lifecycle.append("missed")  # a change we cannot name: catch up by delta
    try:
        for (tenant, address, box_folder), notice in notices.items():
            client = await ingestor.temporal.get(tenant)  # the watcher's namespace
            handle = client.get_workflow_handle(
                mailbox_workflow_id(tenant, GRAPH_KIND, address, box_folder))
            try:
                await handle.signal(GRAPH_NOTICE_SIGNAL, notice)
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
                # No watcher runs: the one started next catches up by delta on start.
    except (TimeoutError, RPCError, OSError, RuntimeError) as exc:
        log.warning("graph notification: Temporal unavailable (%s)", type(exc).__name__)
        return error_response(503, "Temporal unavailable; retry later")
    return JSONResponse({"status": "accepted", "notifications": len(notifications)},
                        status_code=202)


def _notifications(body: bytes) -> list[dict[str, Any]] | None:
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    value = parsed.get("value") if isinstance(parsed, dict) else None
    if (not isinstance(value, list) or not value or len(value) > MAX_NOTIFICATIONS
            or not all(isinstance(item, dict) for item in value)):
        return None
    return value


async def _verify(conn: Any, item: dict[str, Any]) -> tuple[str, str, str] | None:
    """The mailbox folder of a notification whose subscription is ours and whose clientState
    matches; None otherwise."""
    subscription_id = item.get("subscriptionId")
    client_state = item.get("clientState")
    if not isinstance(subscription_id, str) or not isinstance(client_state, str) \
            or not subscription_id or len(subscription_id) > 200 or len(client_state) > 255:
        return None
    row = await subscriptions.by_subscription_id(conn, kind=GRAPH_KIND,
                                                 subscription_id=subscription_id)
    presented = hashlib.sha256(client_state.encode()).hexdigest()
    stored = row["client_state_sha256"] if row is not None else None
    # Compared whether or not the subscription was found, so timing tells nothing.
    matches = hmac.compare_digest(presented, stored or "0" * 64)
    if row is None or stored is None or not matches:
        return None
    return str(row["tenant"]), str(row["address"]), str(row["folder"])
