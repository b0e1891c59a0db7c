"""Gmail API subset (REST v1) and the Pub/Sub push it triggers, for the Gmail mailbox source.

The calls the watcher makes, shaped as the reference documents them
(https://developers.google.com/workspace/gmail/api/reference/rest/v1/users): `users.watch`
(`historyId` + `expiration`), `users.stop` (the watch ends: no more pushes; an empty JSON
object back), `users.history.list` (`startHistoryId`,
`historyTypes=messageAdded`, `labelId`, pagination; 404 for a `startHistoryId` older than
the history kept), `users.messages.list` (`labelIds`, pagination, newest first),
`users.messages.get` (`format=raw`: base64url RFC 5322) and `users.getProfile`, each with
the user's bearer token; errors in Google's JSON error shape. The conformance test drives
them with `google-api-python-client` (tests/conformance/test_gmail.py).

Pushes: a message delivered with `POST /_sandbox/gmail/deliver` to a user whose watch
covers its label is announced by a POST to the watch topic's push subscription, as Pub/Sub
does (https://cloud.google.com/pubsub/docs/push): `{"message": {"data": base64({"emailAddress",
"historyId"}), "messageId", "publishTime"}, "subscription"}` with an OIDC token the sandbox
signs (RS256; its keys at `GET /oauth2/v3/certs`, its issuer its own base URL) for the
subscription's audience and service account.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from jwt.algorithms import RSAAlgorithm
from pydantic import BaseModel, ConfigDict, Field

from inboxcrm.sandbox.core import SandboxDep

router = APIRouter(prefix="/gmail/v1/users/{user_id}")
certs = APIRouter()
control = APIRouter(prefix="/_sandbox/gmail")

WATCH_DAYS = 7  # "the watch expires after 7 days" (users.watch)
MAX_RESULTS = 500
DEFAULT_RESULTS = 100
TOKEN_SECONDS = 3600
PUSH_TIMEOUT = 10.0


def google_error(code: int, message: str, status: str, reason: str) -> JSONResponse:
    """Google's error body (https://cloud.google.com/apis/design/errors#http_mapping)."""
    return JSONResponse({"error": {"code": code, "message": message, "status": status,
                                   "errors": [{"message": message, "domain": "global",
                                               "reason": reason}]}}, status_code=code)


def not_found() -> JSONResponse:
    return google_error(404, "Requested entity was not found.", "NOT_FOUND", "notFound")


async def _user(request: Request, sandbox: Any, user_id: str) -> Any:
    """The user the bearer token belongs to, or the error response."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    row = await sandbox.pool.fetchrow("SELECT * FROM sandbox.gmail_users WHERE token = $1",
                                      token.strip()) if scheme.lower() == "bearer" else None
    if row is None:
        return google_error(401, "Request had invalid authentication credentials.",
                            "UNAUTHENTICATED", "authError")
    if user_id not in ("me", row["email"]):
        return google_error(403, "Delegation denied for " + row["email"],
                            "PERMISSION_DENIED", "forbidden")
    return row


def _limit(value: str | None) -> int | JSONResponse:
    if value is None:
        return DEFAULT_RESULTS
    if not value.isdigit():
        return google_error(400, "Invalid maxResults", "INVALID_ARGUMENT", "invalid")
    return max(1, min(MAX_RESULTS, int(value)))


def _page(token: str | None) -> int:
    """Offsets are opaque page tokens, as Gmail's are to a client."""
    if not token:
        return 0
    try:
        return int(base64.urlsafe_b64decode(token.encode()).decode())
    except ValueError:
        return -1


def _token_of(offset: int) -> str:
    return base64.urlsafe_b64encode(str(offset).encode()).decode()


@router.get("/profile")
async def get_profile(user_id: str, request: Request, sandbox: SandboxDep) -> Response:
    user = await _user(request, sandbox, user_id)
    if isinstance(user, Response):
        return user
    total = await sandbox.pool.fetchval(
        "SELECT count(*) FROM sandbox.gmail_messages WHERE email = $1", user["email"])
    return JSONResponse({"emailAddress": user["email"], "messagesTotal": total,
                         "threadsTotal": total, "historyId": str(user["history_id"])})


@router.post("/watch")
async def watch(user_id: str, request: Request, sandbox: SandboxDep) -> Response:
    user = await _user(request, sandbox, user_id)
    if isinstance(user, Response):
        return user
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        body = None
    topic = body.get("topicName") if isinstance(body, dict) else None
    if not isinstance(topic, str) or not topic.startswith("projects/"):
        return google_error(400, "Invalid topicName", "INVALID_ARGUMENT", "invalidArgument")
    labels = body.get("labelIds") or []
    expiration = datetime.now(UTC) + timedelta(days=WATCH_DAYS)
    await sandbox.pool.execute(
        """
        INSERT INTO sandbox.gmail_watches (email, topic, label_ids, history_id, expiration)
        VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (email) DO UPDATE SET topic = EXCLUDED.topic,
            label_ids = EXCLUDED.label_ids, history_id = EXCLUDED.history_id,
            expiration = EXCLUDED.expiration, calls = sandbox.gmail_watches.calls + 1
        """, user["email"], topic, [str(label) for label in labels], user["history_id"],
        expiration)
    return JSONResponse({"historyId": str(user["history_id"]),
                         "expiration": str(int(expiration.timestamp() * 1000))})


@router.post("/stop")
async def stop(user_id: str, request: Request, sandbox: SandboxDep) -> Response:
    """`users.stop`: the user's watch ends, its pushes with it; the call is recorded."""
    user = await _user(request, sandbox, user_id)
    if isinstance(user, Response):
        return user
    async with sandbox.pool.acquire() as conn, conn.transaction():
        gone = await conn.fetchval(
            "DELETE FROM sandbox.gmail_watches WHERE email = $1 RETURNING email", user["email"])
        await conn.execute("INSERT INTO sandbox.gmail_stops (email, had_watch) VALUES ($1, $2)",
                           user["email"], gone is not None)
    return JSONResponse({})


@router.get("/history")
async def list_history(user_id: str, request: Request, sandbox: SandboxDep) -> Response:
    user = await _user(request, sandbox, user_id)
    if isinstance(user, Response):
        return user
    query = request.query_params
    start = query.get("startHistoryId")
    if not start or not start.isdigit():
        return google_error(400, "Invalid startHistoryId", "INVALID_ARGUMENT", "invalid")
    if int(start) < int(user["history_floor"]):
        return not_found()
    limit = _limit(query.get("maxResults"))
    if isinstance(limit, Response):
        return limit
    types = query.getlist("historyTypes")
    if types and "messageAdded" not in types:
        return JSONResponse({"historyId": str(user["history_id"])})
    label = query.get("labelId")
    offset = _page(query.get("pageToken"))
    if offset < 0:
        return google_error(400, "Invalid pageToken", "INVALID_ARGUMENT", "invalid")
    rows = await sandbox.pool.fetch(
        """
        SELECT id, thread_id, history_id, label_ids FROM sandbox.gmail_messages
        WHERE email = $1 AND history_id > $2 AND ($3::text IS NULL OR $3 = ANY(label_ids))
        ORDER BY history_id OFFSET $4 LIMIT $5
        """, user["email"], int(start), label, offset, limit + 1)
    answer: dict[str, Any] = {"history": [{
        "id": str(r["history_id"]),
        "messages": [{"id": r["id"], "threadId": r["thread_id"]}],
        "messagesAdded": [{"message": {"id": r["id"], "threadId": r["thread_id"],
                                       "labelIds": list(r["label_ids"])}}],
    } for r in rows[:limit]], "historyId": str(user["history_id"])}
    if not answer["history"]:
        del answer["history"]
    if len(rows) > limit:
        answer["nextPageToken"] = _token_of(offset + limit)
    return JSONResponse(answer)


@router.get("/messages")
async def list_messages(user_id: str, request: Request, sandbox: SandboxDep) -> Response:
    user = await _user(request, sandbox, user_id)
    if isinstance(user, Response):
        return user
    query = request.query_params
    limit = _limit(query.get("maxResults"))
    if isinstance(limit, Response):
        return limit
    offset = _page(query.get("pageToken"))
    if offset < 0:
        return google_error(400, "Invalid pageToken", "INVALID_ARGUMENT", "invalid")
    labels = query.getlist("labelIds")
    rows = await sandbox.pool.fetch(
        """
        SELECT id, thread_id FROM sandbox.gmail_messages
        WHERE email = $1 AND label_ids @> $2::text[]
        ORDER BY history_id DESC OFFSET $3 LIMIT $4
        """, user["email"], labels, offset, limit + 1)
    total = await sandbox.pool.fetchval(
        "SELECT count(*) FROM sandbox.gmail_messages WHERE email = $1 AND label_ids @> $2",
        user["email"], labels)
    answer: dict[str, Any] = {"resultSizeEstimate": total}
    if rows:
        answer["messages"] = [{"id": r["id"], "threadId": r["thread_id"]}
                              for r in rows[:limit]]
    if len(rows) > limit:
        answer["nextPageToken"] = _token_of(offset + limit)
    return JSONResponse(answer)


@router.get("/messages/{message_id}")
async def get_message(user_id: str, message_id: str, request: Request,
                      sandbox: SandboxDep) -> Response:
    user = await _user(request, sandbox, user_id)
    if isinstance(user, Response):
        return user
    row = await sandbox.pool.fetchrow(
        "SELECT * FROM sandbox.gmail_messages WHERE email = $1 AND id = $2",
        user["email"], message_id)
    if row is None:
        return not_found()
    fmt = request.query_params.get("format", "full")
    if fmt not in ("minimal", "full", "raw", "metadata"):
        return google_error(400, "Invalid format", "INVALID_ARGUMENT", "invalid")
    raw = bytes(row["raw"])
    answer: dict[str, Any] = {
        "id": row["id"], "threadId": row["thread_id"], "labelIds": list(row["label_ids"]),
        "snippet": "", "historyId": str(row["history_id"]),
        "internalDate": str(row["internal_date"]), "sizeEstimate": len(raw)}
    if fmt == "raw":
        answer["raw"] = base64.urlsafe_b64encode(raw).decode()
    return JSONResponse(answer)


# --- the push's OIDC token -----------------------------------------------------------------
async def signing_key(sandbox: Any) -> tuple[str, rsa.RSAPrivateKey]:
    """The sandbox's signing key, made once per database (every sandbox process shares it)."""
    row = await sandbox.pool.fetchrow("SELECT kid, private_pem FROM sandbox.gmail_signing_key")
    if row is None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        await sandbox.pool.execute(
            "INSERT INTO sandbox.gmail_signing_key (kid, private_pem) VALUES ($1, $2) "
            "ON CONFLICT DO NOTHING", secrets.token_hex(20), pem)
        row = await sandbox.pool.fetchrow(
            "SELECT kid, private_pem FROM sandbox.gmail_signing_key")
    assert row is not None
    private = serialization.load_pem_private_key(row["private_pem"].encode(), password=None)
    assert isinstance(private, rsa.RSAPrivateKey)
    return str(row["kid"]), private


def issuer_of(request: Request) -> str:
    return str(request.base_url).rstrip("/")


async def sign_token(sandbox: Any, issuer: str, audience: str, email: str,
                     expires_in: int = TOKEN_SECONDS) -> str:
    kid, key = await signing_key(sandbox)
    now = int(time.time())
    claims = {"iss": issuer, "aud": audience, "email": email, "email_verified": True,
              "azp": secrets.token_hex(10), "sub": secrets.token_hex(10), "iat": now,
              "exp": now + expires_in}
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})


@certs.get("/oauth2/v3/certs")
async def jwks(sandbox: SandboxDep) -> Response:
    kid, key = await signing_key(sandbox)
    jwk = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update({"kid": kid, "alg": "RS256", "use": "sig"})
    return JSONResponse({"keys": [jwk]})


async def push(sandbox: Any, request: Request, email: str) -> int | None:
    """Announce the user's current historyId to its watch's push subscription, as Pub/Sub
    does; the HTTP status of the push endpoint (None: no watch, lapsed, or no subscription)."""
    row = await sandbox.pool.fetchrow(
        """
        SELECT u.history_id, s.name, s.endpoint, s.audience, s.service_account
        FROM sandbox.gmail_users u
        JOIN sandbox.gmail_watches w ON w.email = u.email AND w.expiration > now()
        JOIN sandbox.gmail_push_subscriptions s ON s.topic = w.topic
        WHERE u.email = $1
        """, email)
    if row is None:
        return None
    token = await sign_token(sandbox, issuer_of(request), row["audience"],
                             row["service_account"])
    data = json.dumps({"emailAddress": email, "historyId": int(row["history_id"])})
    message_id = str(uuid.uuid4().int)[:16]
    published = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    envelope = {"message": {"data": base64.b64encode(data.encode()).decode(),
                            "messageId": message_id, "message_id": message_id,
                            "publishTime": published, "publish_time": published},
                "subscription": row["name"]}
    status: int | None
    try:
        async with httpx.AsyncClient(timeout=PUSH_TIMEOUT) as client:
            status = (await client.post(row["endpoint"], json=envelope,
                                        headers={"Authorization": f"Bearer {token}"})
                      ).status_code
    except httpx.HTTPError:
        status = 0
    await sandbox.pool.execute(
        "INSERT INTO sandbox.gmail_pushes (email, history_id, status) VALUES ($1, $2, $3)",
        email, row["history_id"], status)
    return status


# --- control --------------------------------------------------------------------------------
class UserIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    email: str = Field(min_length=3, max_length=254)
    token: str = Field(min_length=8, max_length=512)


class DeliverIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    email: str
    raw: str = Field(max_length=20 * 1024 * 1024)
    label_ids: list[str] = Field(default_factory=lambda: ["INBOX", "UNREAD"])
    push: bool = True


class PushSubscriptionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    topic: str
    endpoint: str
    audience: str
    service_account: str
    name: str | None = None


class EmailIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    email: str


class SignIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    audience: str
    email: str
    expires_in: int = TOKEN_SECONDS


@control.post("/users")
async def add_user(body: UserIn, sandbox: SandboxDep) -> Response:
    """A mailbox with its access token; an existing one is emptied (a test's fresh start)."""
    async with sandbox.pool.acquire() as conn, conn.transaction():
        await conn.execute("DELETE FROM sandbox.gmail_users WHERE email = $1", body.email)
        await conn.execute("DELETE FROM sandbox.gmail_stops WHERE email = $1", body.email)
        history = await conn.fetchval("SELECT nextval('sandbox.gmail_history')")
        await conn.execute("INSERT INTO sandbox.gmail_users (email, token, history_id) "
                           "VALUES ($1, $2, $3)", body.email, body.token, history)
    return JSONResponse({"email": body.email, "historyId": str(history)})


@control.post("/deliver")
async def deliver(body: DeliverIn, request: Request, sandbox: SandboxDep) -> Response:
    """A message lands in the mailbox (a new history record), then the push, if asked."""
    async with sandbox.pool.acquire() as conn, conn.transaction():
        history = await conn.fetchval("SELECT nextval('sandbox.gmail_history')")
        updated = await conn.fetchval(
            "UPDATE sandbox.gmail_users SET history_id = $2 WHERE email = $1 RETURNING email",
            body.email, history)
        if updated is None:
            return not_found()
        message_id = secrets.token_hex(8)
        await conn.execute(
            "INSERT INTO sandbox.gmail_messages (email, id, thread_id, history_id, label_ids,"
            " raw, internal_date) VALUES ($1, $2, $2, $3, $4, $5, $6)",
            body.email, message_id, history, body.label_ids, body.raw.encode(),
            int(time.time() * 1000))
    status = await push(sandbox, request, body.email) if body.push else None
    return JSONResponse({"id": message_id, "historyId": str(history), "push_status": status})


@control.post("/push")
async def push_again(body: EmailIn, request: Request, sandbox: SandboxDep) -> Response:
    """Push the user's current historyId again (Pub/Sub delivers at least once)."""
    return JSONResponse({"push_status": await push(sandbox, request, body.email)})


@control.post("/expire-history")
async def expire_history(body: EmailIn, sandbox: SandboxDep) -> Response:
    """Forget the user's history up to now: an older startHistoryId answers 404."""
    floor = await sandbox.pool.fetchval(
        "UPDATE sandbox.gmail_users SET history_floor = history_id WHERE email = $1 "
        "RETURNING history_floor", body.email)
    return JSONResponse({"history_floor": None if floor is None else str(floor)})


@control.post("/push-subscriptions")
async def push_subscription(body: PushSubscriptionIn, sandbox: SandboxDep) -> Response:
    """A Pub/Sub push subscription of a topic, with OIDC: where pushes go and for whom the
    token is signed."""
    name = body.name or body.topic.replace("/topics/", "/subscriptions/") + "-push"
    await sandbox.pool.execute(
        """
        INSERT INTO sandbox.gmail_push_subscriptions (topic, name, endpoint, audience,
                                                      service_account)
        VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (topic) DO UPDATE SET name = EXCLUDED.name, endpoint = EXCLUDED.endpoint,
            audience = EXCLUDED.audience, service_account = EXCLUDED.service_account
        """, body.topic, name, body.endpoint, body.audience, body.service_account)
    return JSONResponse({"topic": body.topic, "name": name})


@control.post("/sign")
async def sign(body: SignIn, request: Request, sandbox: SandboxDep) -> Response:
    """A token signed with the sandbox's key for any audience and email (forgery tests)."""
    return JSONResponse({"token": await sign_token(sandbox, issuer_of(request), body.audience,
                                                   body.email, body.expires_in)})


@control.get("/state")
async def state(email: str, sandbox: SandboxDep) -> Response:
    """What the mailbox holds, its watch, the pushes sent and the `users.stop` calls (tests
    count these)."""
    user = await sandbox.pool.fetchrow("SELECT * FROM sandbox.gmail_users WHERE email = $1",
                                       email)
    if user is None:
        return not_found()
    messages = await sandbox.pool.fetch(
        "SELECT id, history_id, label_ids FROM sandbox.gmail_messages WHERE email = $1 "
        "ORDER BY history_id", email)
    watch_row = await sandbox.pool.fetchrow(
        "SELECT topic, label_ids, expiration, calls FROM sandbox.gmail_watches "
        "WHERE email = $1", email)
    pushes = await sandbox.pool.fetch(
        "SELECT history_id, status FROM sandbox.gmail_pushes WHERE email = $1 ORDER BY id",
        email)
    stops = await sandbox.pool.fetch(
        "SELECT had_watch, stopped_at FROM sandbox.gmail_stops WHERE email = $1 ORDER BY id",
        email)
    return JSONResponse({
        "historyId": str(user["history_id"]), "history_floor": str(user["history_floor"]),
        "messages": [{"id": m["id"], "historyId": str(m["history_id"]),
                      "labelIds": list(m["label_ids"])} for m in messages],
        "watch": None if watch_row is None else {
            "topic": watch_row["topic"], "labelIds": list(watch_row["label_ids"]),
            "expiration": watch_row["expiration"].isoformat(), "calls": watch_row["calls"]},
        "pushes": [{"historyId": str(p["history_id"]), "status": p["status"]}
                   for p in pushes],
        "stops": [{"had_watch": s["had_watch"], "at": s["stopped_at"].isoformat()}
                  for s in stops]})
