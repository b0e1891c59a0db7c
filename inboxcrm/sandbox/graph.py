"""Microsoft Graph v1.0 mail subset: subscriptions with their validation handshake, change
and lifecycle notifications, the Inbox delta query and a message's MIME, with
`Prefer: IdType="ImmutableId"` honoured. Shapes as documented on learn.microsoft.com:

- subscription-post-subscriptions (201 + the subscription; before answering, Graph POSTs
  `{notificationUrl}?validationToken=…` and needs the token back as text/plain with 200
  within 10 seconds, for the lifecycle URL too; `clientState` at most 128 characters;
  Outlook messages expire after at most 10,080 minutes), subscription-update (PATCH
  `expirationDateTime`, 200), subscription-delete (204);
- change-notifications-delivery-webhooks and changenotification / changenotificationcollection
  (`{"value": [{"subscriptionId", "subscriptionExpirationDateTime", "changeType",
  "resource", "resourceData": {"@odata.type", "@odata.id", "@odata.etag", "id"},
  "clientState", "tenantId"}]}`); change-notifications-lifecycle-events (`lifecycleEvent`
  `reauthorizationRequired` | `subscriptionRemoved` | `missed` instead of `changeType`);
- message-delta (`@odata.nextLink` pages, `@odata.deltaLink` at the end, `Prefer:
  odata.maxpagesize`), outlook-get-mime-message (`/messages/{id}/$value`), and
  outlook-immutable-id (`Preference-Applied: IdType="ImmutableId"`).

Control (`/_sandbox/graph/…`): deliver a message into a mailbox (and notify, once or
more, or not at all: a gap), send a lifecycle notification, inspect what is held.
"""

from __future__ import annotations

import base64
import secrets
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, unquote

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from inboxcrm.sandbox.core import SandboxDep, read_json

router = APIRouter(prefix="/v1.0")
control = APIRouter(prefix="/_sandbox/graph")

TENANT_ID = "84bd8158-6d4d-4958-8b9f-9d6445542f95"  # the sandbox's directory tenant
APPLICATION_ID = "24d3b144-21ae-4080-943f-7067b395b913"
MAX_EXPIRY = timedelta(minutes=10_080)
VALIDATION_TIMEOUT = 10.0
DEFAULT_PAGE = 10
IMMUTABLE = 'IdType="ImmutableId"'


def _error(status: int, code: str, message: str) -> JSONResponse:
    """Graph's error body."""
    return JSONResponse({"error": {"code": code, "message": message,
                                   "innerError": {"date": _time(datetime.now(UTC)),
                                                  "request-id": str(secrets.token_hex(16))}}},
                        status_code=status)


def _time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "0Z"  # 7 digits


def _parse_time(value: str) -> datetime | None:
    try:
        text = value.strip().replace("Z", "+00:00")
        head, dot, rest = text.partition(".")
        if dot:
            frac = "".join(ch for ch in rest if ch.isdigit())
            rest = rest[len(frac):]
            text = f"{head}.{frac[:6].ljust(6, '0')}{rest}"
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _prefers(request: Request) -> dict[str, str]:
    """`Prefer` preferences (several headers or comma-separated), name → value."""
    found: dict[str, str] = {}
    for header in request.headers.getlist("prefer"):
        for part in header.split(","):
            name, _, value = part.strip().partition("=")
            if name:
                found[name.strip().lower()] = value.strip()
    return found


def _immutable(request: Request) -> bool:
    return _prefers(request).get("idtype", "").strip('"').lower() == "immutableid"


def _denied(request: Request, sandbox: Any) -> JSONResponse | None:
    """Graph wants a bearer token; with `--api-key` it must be the sandbox's key."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return _error(401, "InvalidAuthenticationToken", "Access token is empty.")
    if sandbox.api_key is not None and not secrets.compare_digest(
            token.strip().encode(), sandbox.api_key.encode()):
        return _error(401, "InvalidAuthenticationToken", "Access token validation failure.")
    return None


def _new_id(prefix: bytes) -> str:
    return base64.urlsafe_b64encode(prefix + secrets.token_bytes(40)).decode()


def _user(value: str) -> str:
    return unquote(value).strip().lower()


def _resource_mailbox(resource: str) -> str | None:
    """The user of `users/{id}/mailFolders('inbox')/messages` (or `…/mailFolders/inbox/…`)."""
    parts = resource.strip("/").split("/")
    if len(parts) != 4 or parts[0].lower() != "users" or parts[3].lower() != "messages":
        return None
    folder = parts[2].lower()
    if folder not in ("mailfolders('inbox')", "mailfolders/inbox"):
        return None
    return _user(parts[1])


def _subscription_body(row: Any) -> dict[str, Any]:
    return {"@odata.context": "https://graph.microsoft.com/v1.0/$metadata#subscriptions/$entity",
            "id": row["id"], "resource": row["resource"], "applicationId": APPLICATION_ID,
            "changeType": row["change_type"], "clientState": row["client_state"],
            "notificationUrl": row["notification_url"],
            "lifecycleNotificationUrl": row["lifecycle_url"],
            "expirationDateTime": _time(row["expires_at"]),
            "creatorId": APPLICATION_ID, "includeResourceData": False,
            "latestSupportedTlsVersion": "v1_2", "encryptionCertificate": None,
            "encryptionCertificateId": None, "notificationQueryOptions": None,
            "notificationUrlAppId": None}


async def _validate(url: str) -> bool:
    """Graph's handshake: the endpoint echoes the token, as text/plain, within 10 s."""
    token = f"Validation: Testing client application reachability for subscription " \
            f"Request-Id: {secrets.token_hex(16)}"
    try:
        async with httpx.AsyncClient(timeout=VALIDATION_TIMEOUT) as http:
            answer = await http.post(f"{url}{'&' if '?' in url else '?'}validationToken="
                                     f"{quote(token, safe='')}",
                                     headers={"Content-Type": "text/plain; charset=utf-8"})
    except httpx.HTTPError:
        return False
    return (answer.status_code == 200 and answer.text == token
            and answer.headers.get("content-type", "").startswith("text/plain"))


# --- subscriptions -------------------------------------------------------------------------
@router.post("/subscriptions")
async def create_subscription(request: Request, sandbox: SandboxDep) -> Response:
    if (denial := _denied(request, sandbox)) is not None:
        return denial
    body = await read_json(request)
    if not isinstance(body, dict):
        return _error(400, "BadRequest", "Empty Payload. JSON content expected.")
    resource, change = body.get("resource"), body.get("changeType")
    url, lifecycle = body.get("notificationUrl"), body.get("lifecycleNotificationUrl")
    state, expiry = body.get("clientState"), body.get("expirationDateTime")
    mailbox = _resource_mailbox(resource) if isinstance(resource, str) else None
    if mailbox is None or not isinstance(change, str) or not isinstance(url, str):
        return _error(400, "InvalidRequest", "resource, changeType and notificationUrl "
                      "are required; resource: users/{id}/mailFolders('inbox')/messages")
    if not set(change.split(",")) <= {"created", "updated", "deleted"}:
        return _error(400, "InvalidRequest", "Invalid changeType.")
    if state is not None and (not isinstance(state, str) or len(state) > 128):
        return _error(400, "InvalidRequest", "clientState: at most 128 characters.")
    expires = _parse_time(expiry) if isinstance(expiry, str) else None
    now = datetime.now(UTC)
    if expires is None or expires <= now or expires > now + MAX_EXPIRY:
        return _error(400, "InvalidRequest", "Subscription expiration can only be 10070 "
                      "minutes in the future.")
    for target in (url, lifecycle):
        if target is not None and (not isinstance(target, str) or not await _validate(target)):
            return _error(400, "InvalidRequest", "Subscription validation request failed. "
                          "Notification endpoint must respond with 200 OK to validation "
                          "request.")
    row = await sandbox.pool.fetchrow(
        """
        INSERT INTO sandbox.graph_subscriptions (id, mailbox, resource, change_type,
            notification_url, lifecycle_url, client_state, immutable_ids, expires_at)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING *
        """, str(uuid.uuid4()), mailbox, resource, change, url, lifecycle, state,
        _immutable(request), expires)
    return JSONResponse(_subscription_body(row), status_code=201)


@router.patch("/subscriptions/{subscription_id}")
async def renew_subscription(subscription_id: str, request: Request,
                             sandbox: SandboxDep) -> Response:
    if (denial := _denied(request, sandbox)) is not None:
        return denial
    body = await read_json(request)
    expiry = body.get("expirationDateTime") if isinstance(body, dict) else None
    expires = _parse_time(expiry) if isinstance(expiry, str) else None
    now = datetime.now(UTC)
    if expires is None or expires <= now or expires > now + MAX_EXPIRY:
        return _error(400, "InvalidRequest", "Subscription expiration can only be 10070 "
                      "minutes in the future.")
    row = await sandbox.pool.fetchrow(
        "UPDATE sandbox.graph_subscriptions SET expires_at = $2, reauthorize = false "
        "WHERE id = $1 AND expires_at > now() RETURNING *", subscription_id, expires)
    if row is None:
        return _error(404, "ResourceNotFound", "The object was not found.")
    return JSONResponse(_subscription_body(row))


@router.delete("/subscriptions/{subscription_id}")
async def delete_subscription(subscription_id: str, request: Request,
                              sandbox: SandboxDep) -> Response:
    if (denial := _denied(request, sandbox)) is not None:
        return denial
    deleted = await sandbox.pool.fetchval(
        "DELETE FROM sandbox.graph_subscriptions WHERE id = $1 RETURNING id", subscription_id)
    if deleted is None:
        return _error(404, "ResourceNotFound", "The object was not found.")
    return Response(status_code=204)


# --- messages ------------------------------------------------------------------------------
@router.get("/users/{user}/mailFolders/{folder}/messages/delta")
async def delta(user: str, folder: str, request: Request, sandbox: SandboxDep) -> Response:
    if (denial := _denied(request, sandbox)) is not None:
        return denial
    if folder.lower() not in ("inbox", "('inbox')"):
        return _error(404, "ErrorItemNotFound", "The specified object was not found in the "
                      "store.")
    mailbox = _user(user)
    params = request.query_params
    token = params.get("$deltatoken") or params.get("$skiptoken")
    after = 0
    if token is not None:
        try:
            token_box, _, seq = base64.urlsafe_b64decode(token.encode()).decode().rpartition(":")
            after = int(seq)
        except (ValueError, UnicodeDecodeError):
            token_box = ""
        if token_box != mailbox:
            return _error(400, "SyncStateInvalid", "The sync state is invalid.")
    try:
        size = max(1, min(1000, int(_prefers(request).get("odata.maxpagesize", DEFAULT_PAGE))))
    except ValueError:
        size = DEFAULT_PAGE
    rows = await sandbox.pool.fetch(
        "SELECT seq, immutable_id, rest_id, received_at FROM sandbox.graph_messages "
        "WHERE mailbox = $1 AND seq > $2 ORDER BY seq LIMIT $3", mailbox, after, size + 1)
    page, more = rows[:size], len(rows) > size
    last = page[-1]["seq"] if page else after
    if not page and after == 0:
        last = await sandbox.pool.fetchval(
            "SELECT coalesce(max(seq), 0) FROM sandbox.graph_messages WHERE mailbox = $1",
            mailbox)
    immutable = _immutable(request)
    base = str(request.base_url).rstrip("/")
    link_token = base64.urlsafe_b64encode(f"{mailbox}:{last}".encode()).decode()
    link = f"{base}/v1.0/users/{quote(mailbox, safe='@')}/mailFolders/inbox/messages/delta?"
    answer: dict[str, Any] = {
        "@odata.context": "https://graph.microsoft.com/v1.0/$metadata#Collection(message)",
        "value": [{"@odata.type": "#microsoft.graph.message",
                   "@odata.etag": f'W/"{r["seq"]}"',
                   "id": r["immutable_id"] if immutable else r["rest_id"],
                   "receivedDateTime": _time(r["received_at"])[:19] + "Z"} for r in page]}
    if more:
        answer["@odata.nextLink"] = f"{link}$skiptoken={link_token}"
    else:
        answer["@odata.deltaLink"] = f"{link}$deltatoken={link_token}"
    headers = {"Preference-Applied": IMMUTABLE} if immutable else {}
    return JSONResponse(answer, headers=headers)


@router.get("/users/{user}/messages/{message_id}/$value")
async def mime(user: str, message_id: str, request: Request, sandbox: SandboxDep) -> Response:
    if (denial := _denied(request, sandbox)) is not None:
        return denial
    raw = await sandbox.pool.fetchval(
        "SELECT mime FROM sandbox.graph_messages WHERE mailbox = $1 "
        "AND (immutable_id = $2 OR rest_id = $2)", _user(user), message_id)
    if raw is None:
        return _error(404, "ErrorItemNotFound", "The specified object was not found in the "
                      "store.")
    return Response(bytes(raw), media_type="text/plain")


# --- control -------------------------------------------------------------------------------
@control.post("/deliver")
async def deliver(request: Request, sandbox: SandboxDep) -> Response:
    """`{"mailbox", "mime", "notify": n}`: the message lands in the mailbox's Inbox and each
    subscription on it is notified `notify` times (default 1; 0: a gap Graph never told)."""
    body = await read_json(request)
    if not isinstance(body, dict) or not isinstance(body.get("mailbox"), str) \
            or not isinstance(body.get("mime"), str):
        return JSONResponse({"error": "mailbox and mime are required"}, status_code=400)
    notify = body.get("notify", 1)
    if not isinstance(notify, int) or not 0 <= notify <= 10:
        return JSONResponse({"error": "notify: 0-10"}, status_code=400)
    mailbox = _user(body["mailbox"])
    row = await sandbox.pool.fetchrow(
        "INSERT INTO sandbox.graph_messages (mailbox, immutable_id, rest_id, mime) "
        "VALUES ($1, $2, $3, $4) RETURNING seq, immutable_id, rest_id",
        mailbox, _new_id(b"\x00\x00imm"), _new_id(b"\x00\x00rest"), body["mime"].encode())
    assert row is not None
    subs = await sandbox.pool.fetch(
        "SELECT * FROM sandbox.graph_subscriptions WHERE mailbox = $1 AND expires_at > now() "
        "AND 'created' = ANY(string_to_array(change_type, ','))", mailbox)
    statuses: list[int] = []
    for sub in subs:
        message_id = row["immutable_id"] if sub["immutable_ids"] else row["rest_id"]
        path = f"Users/{mailbox}/Messages/{message_id}"
        payload = {"value": [{
            "subscriptionId": sub["id"],
            "subscriptionExpirationDateTime": _time(sub["expires_at"]),
            "changeType": "created", "resource": path,
            "resourceData": {"@odata.type": "#Microsoft.Graph.Message", "@odata.id": path,
                             "@odata.etag": f'W/"{row["seq"]}"', "id": message_id},
            "clientState": sub["client_state"], "tenantId": TENANT_ID}]}
        for _ in range(notify):
            statuses.append(await _post(sub["notification_url"], payload))
    return JSONResponse({"id": row["immutable_id"], "rest_id": row["rest_id"],
                         "notifications": statuses})


@control.post("/lifecycle")
async def lifecycle(request: Request, sandbox: SandboxDep) -> Response:
    """`{"mailbox", "event": "missed"|"reauthorizationRequired"|"subscriptionRemoved"}`: the
    lifecycle notification to each subscription on the mailbox; `subscriptionRemoved` also
    removes them, `reauthorizationRequired` marks them until they are renewed."""
    body = await read_json(request)
    event = body.get("event") if isinstance(body, dict) else None
    if event not in ("missed", "reauthorizationRequired", "subscriptionRemoved") \
            or not isinstance(body.get("mailbox"), str):
        return JSONResponse({"error": "mailbox and event are required"}, status_code=400)
    mailbox = _user(body["mailbox"])
    subs = await sandbox.pool.fetch(
        "SELECT * FROM sandbox.graph_subscriptions WHERE mailbox = $1", mailbox)
    statuses: list[int] = []
    for sub in subs:
        if event == "subscriptionRemoved":
            await sandbox.pool.execute("DELETE FROM sandbox.graph_subscriptions WHERE id = $1",
                                       sub["id"])
        elif event == "reauthorizationRequired":
            await sandbox.pool.execute(
                "UPDATE sandbox.graph_subscriptions SET reauthorize = true WHERE id = $1",
                sub["id"])
        payload = {"value": [{
            "lifecycleEvent": event, "subscriptionId": sub["id"],
            "subscriptionExpirationDateTime": _time(sub["expires_at"]),
            "resource": sub["resource"], "clientState": sub["client_state"],
            "tenantId": TENANT_ID}]}
        statuses.append(await _post(sub["lifecycle_url"] or sub["notification_url"], payload))
    return JSONResponse({"subscriptions": len(subs), "notifications": statuses})


@control.get("/state")
async def state(sandbox: SandboxDep) -> Response:
    """Every message (IDs, mailbox; not the MIME) and subscription (no clientState)."""
    messages = await sandbox.pool.fetch(
        "SELECT mailbox, immutable_id, rest_id FROM sandbox.graph_messages ORDER BY seq")
    subs = await sandbox.pool.fetch(
        "SELECT id, mailbox, notification_url, expires_at, reauthorize "
        "FROM sandbox.graph_subscriptions ORDER BY created_at")
    return JSONResponse({
        "messages": [dict(r) for r in messages],
        "subscriptions": [{"id": r["id"], "mailbox": r["mailbox"],
                           "notificationUrl": r["notification_url"],
                           "expirationDateTime": _time(r["expires_at"]),
                           "reauthorize": r["reauthorize"]} for r in subs]})


async def _post(url: str, payload: dict[str, Any]) -> int:
    """POST one notification batch; the status the receiver answered (0: no answer)."""
    try:
        async with httpx.AsyncClient(timeout=10.0) as http:
            return (await http.post(url, json=payload)).status_code
    except httpx.HTTPError:
        return 0
