"""Resend-compatible mail subset: send with Idempotency-Key, get one, list.

Resend semantics: within 24 hours of a key's first request, the same key with the same
payload returns the first email's id and sends nothing; the same key with another payload
is a 409 invalid_idempotent_request; a key whose first request is still in flight is a 409
concurrent_idempotent_requests until it has sent (once the email exists, the same request
answers its ID even while the first response is held back). After 24 hours (on the
sandbox's clock, `/_sandbox/clock`) the key is forgotten: the same request sends again.
Keys are claimed with a single INSERT ... ON CONFLICT. The list takes only `limit`, `after`
and `before` (newest first, `has_more`); any other query parameter is ignored, as Resend
ignores it: there is no lookup by idempotency key.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from inboxcrm.sandbox.core import (
    LEASE_MARGIN_SECONDS,
    Outcome,
    Release,
    Sandbox,
    SandboxDep,
    mail_error,
    read_json,
)

router = APIRouter()

MAX_RECIPIENTS = 50
MAX_KEY_LENGTH = 256
LIST_DEFAULT_LIMIT = 20
LIST_MAX_LIMIT = 100


@dataclass(frozen=True)
class EmailIn:
    sender: str
    to: list[str]
    subject: str
    text: str | None
    html: str | None
    headers: dict[str, str]
    reply_to: list[str] | None = None


def parse_email(body: Any) -> EmailIn | str:
    """A validated email, or a message saying what is wrong."""
    if not isinstance(body, dict):
        return "Request body must be a JSON object."
    sender, to, subject = body.get("from"), body.get("to"), body.get("subject")
    if not isinstance(sender, str) or not sender.strip():
        return "Missing `from` field."
    if isinstance(to, str):
        to = [to]
    if not isinstance(to, list) or not to:
        return "Missing `to` field."
    if len(to) > MAX_RECIPIENTS or any(not isinstance(a, str) or "@" not in a for a in to):
        return f"`to` must hold 1 to {MAX_RECIPIENTS} email addresses."
    if not isinstance(subject, str) or not subject.strip():
        return "Missing `subject` field."
    text, html = body.get("text"), body.get("html")
    if (text is not None and not isinstance(text, str)) or (
        html is not None and not isinstance(html, str)
    ):
        return "`text` and `html` must be strings."
    headers = body.get("headers") or {}
    if not isinstance(headers, dict) or any(not isinstance(v, str) for v in headers.values()):
        return "`headers` must be an object of strings."
    reply_to = body.get("reply_to")
    if isinstance(reply_to, str):
        reply_to = [reply_to]
    if reply_to is not None and (not isinstance(reply_to, list) or any(
            not isinstance(a, str) or "@" not in a for a in reply_to)):
        return "`reply_to` must be an email address or a list of them."
    return EmailIn(sender, list(to), subject, text, html, {str(k): v for k, v in headers.items()},
                   reply_to)


def payload_hash(body: Any) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def email_json(row: asyncpg.Record) -> dict[str, Any]:
    """Resend's email object (every key of the SDK's `Email`), plus the sandbox's headers
    and idempotency key for inspection."""
    return {
        "object": "email",
        "id": str(row["id"]),
        "message_id": f"<{row['id']}@sandbox.resend.test>",
        "to": row["recipients"],
        "from": row["sender"],
        "subject": row["subject"],
        "text": row["text_body"],
        "html": row["html_body"],
        "bcc": None,
        "cc": None,
        "reply_to": row["reply_to"],
        "scheduled_at": None,
        "headers": row["headers"],
        "created_at": row["created_at"].isoformat(),
        "idempotency_key": row["idempotency_key"],
        "last_event": "delivered",
    }


# Claims a key: new, or known with this payload and no email yet, or expired ($4 seconds
# after its first request on the sandbox clock; 0: never), and not in flight. An expired key
# starts a new window.
_CLAIM = """
INSERT INTO sandbox.email_requests AS r
    (idempotency_key, payload_hash, in_flight_until, created_at)
VALUES ($1, $2, clock_timestamp() + make_interval(secs => $3::float8), sandbox.now())
ON CONFLICT (idempotency_key) DO UPDATE
SET in_flight_until = EXCLUDED.in_flight_until, payload_hash = EXCLUDED.payload_hash,
    email_id = NULL,
    created_at = CASE WHEN $4::float8 > 0
                       AND r.created_at <= sandbox.now() - make_interval(secs => $4::float8)
                      THEN EXCLUDED.created_at ELSE r.created_at END
WHERE (r.in_flight_until IS NULL OR r.in_flight_until < clock_timestamp())
  AND ((r.payload_hash = EXCLUDED.payload_hash AND r.email_id IS NULL)
       OR ($4::float8 > 0
           AND r.created_at <= sandbox.now() - make_interval(secs => $4::float8)))
RETURNING r.idempotency_key
"""

_KEY_STATE = """
SELECT payload_hash, email_id,
       coalesce(in_flight_until > clock_timestamp(), false) AS busy
FROM sandbox.email_requests WHERE idempotency_key = $1
"""

_INSERT_EMAIL = """
INSERT INTO sandbox.emails
    (id, idempotency_key, sender, recipients, subject, text_body, html_body, headers, reply_to)
VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8::jsonb, $9::jsonb)
"""

_RELEASE = "DELETE FROM sandbox.email_requests WHERE idempotency_key = $1 AND email_id IS NULL"
_SETTLE = "UPDATE sandbox.email_requests SET in_flight_until = NULL WHERE idempotency_key = $1"


class Mailer:
    """One POST /emails request: its parsed body, key and payload hash."""

    def __init__(self, sandbox: Sandbox, body: Any, key: str | None) -> None:
        self.sandbox = sandbox
        self.pool = sandbox.pool
        self.key = key
        self.email = parse_email(body)
        self.hash = payload_hash(body)

    @property
    def _key_ok(self) -> bool:
        return self.key is None or 1 <= len(self.key) <= MAX_KEY_LENGTH

    async def _lease(self) -> float:
        return (await self.sandbox.config()).hang_seconds + LEASE_MARGIN_SECONDS

    async def _claim(self) -> bool:
        return (
            await self.pool.fetchval(_CLAIM, self.key, self.hash, await self._lease(),
                                     self.sandbox.key_ttl_seconds) is not None
        )

    async def _release(self) -> None:
        await self.pool.execute(_RELEASE, self.key)

    async def _settle(self) -> None:
        await self.pool.execute(_SETTLE, self.key)

    async def reserve(self) -> Release | None:
        """Hold the key as in flight during a timeout_before_commit hang, then free it."""
        if self.key is None or not self._key_ok or isinstance(self.email, str):
            return None
        return self._release if await self._claim() else None

    async def _insert(self, email: EmailIn) -> str:
        """Store the email and bind it to its key in one transaction."""
        email_id = uuid.uuid4()
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                _INSERT_EMAIL,
                email_id,
                self.key,
                email.sender,
                email.to,
                email.subject,
                email.text,
                email.html,
                email.headers,
                email.reply_to,
            )
            if self.key is not None:
                await conn.execute(
                    "UPDATE sandbox.email_requests SET email_id = $2 WHERE idempotency_key = $1",
                    self.key,
                    email_id,
                )
        return str(email_id)

    async def send(self) -> Outcome:
        if isinstance(self.email, str):
            return Outcome(mail_error(422, "validation_error", self.email), "invalid")
        if not self._key_ok:
            message = f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters."
            return Outcome(mail_error(400, "invalid_idempotency_key", message), "invalid")
        if self.key is None:
            return Outcome(JSONResponse({"id": await self._insert(self.email)}))
        for _ in range(5):
            if await self._claim():
                try:
                    email_id = await self._insert(self.email)
                except BaseException:
                    await self._release()
                    raise
                return Outcome(JSONResponse({"id": email_id}), finalize=self._settle)
            state = await self.pool.fetchrow(_KEY_STATE, self.key)
            if state is None:
                continue  # released between our claim and this read: claim again
            if state["payload_hash"] != self.hash:
                message = "This idempotency key has already been used with a different payload."
                response = mail_error(409, "invalid_idempotent_request", message)
                return Outcome(response, "idempotency_mismatch")
            if state["email_id"] is not None:
                # Committed: the answer is the email, even while the first request's own
                # response is still held back (timeout_after_commit).
                return Outcome(JSONResponse({"id": str(state["email_id"])}))
            if state["busy"]:
                message = "The original request with this idempotency key is still in progress."
                response = mail_error(409, "concurrent_idempotent_requests", message)
                return Outcome(response, "in_flight")
        raise RuntimeError("idempotency key claim kept racing")


@router.post("/emails")
async def send_email(request: Request, sandbox: SandboxDep) -> Response:
    """Send (record) one email, deduplicated by the Idempotency-Key header."""
    mailer = Mailer(sandbox, await read_json(request), request.headers.get("idempotency-key"))
    return await sandbox.run(request, "mail.send", mailer.send, mailer.reserve)


_SELECT_EMAILS = """
SELECT id, idempotency_key, sender, recipients, subject, text_body, html_body, headers,
       reply_to, created_at
FROM sandbox.emails
"""


@router.get("/emails/{email_id}")
async def get_email(request: Request, email_id: str, sandbox: SandboxDep) -> Response:
    if (denial := sandbox.denied(request, "mail.send")) is not None:
        return denial
    try:
        parsed = uuid.UUID(email_id)
    except ValueError:
        parsed = None
    row = None
    if parsed is not None:
        row = await sandbox.pool.fetchrow(f"{_SELECT_EMAILS} WHERE id = $1", parsed)
    if row is None:
        return mail_error(404, "not_found", "Email not found.")
    return JSONResponse(email_json(row))


_CURSOR = "SELECT created_at, id FROM sandbox.emails WHERE id = $1"


def _uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


@router.get("/emails")
async def list_emails(
    request: Request, sandbox: SandboxDep, limit: str | None = None,
    after: str | None = None, before: str | None = None,
) -> Response:
    """Sent emails, newest first, `limit` (1-100, default 20) per page, paged by the `after`
    or `before` email ID; `has_more` says whether the page could go on. No lag."""
    if (denial := sandbox.denied(request, "mail.send")) is not None:
        return denial
    try:
        size = LIST_DEFAULT_LIMIT if limit is None else int(limit)
    except ValueError:
        size = 0
    if not 1 <= size <= LIST_MAX_LIMIT:
        return mail_error(422, "validation_error",
                          f"`limit` must be between 1 and {LIST_MAX_LIMIT}.")
    if after is not None and before is not None:
        return mail_error(422, "validation_error", "Use `after` or `before`, not both.")
    cursor_id = after if after is not None else before
    where, order, args = "", "DESC", [size + 1]
    if cursor_id is not None:
        parsed = _uuid(cursor_id)
        cursor = await sandbox.pool.fetchrow(_CURSOR, parsed) if parsed else None
        if cursor is None:
            return mail_error(422, "validation_error", "The cursor is not a known email ID.")
        if after is not None:
            where = "WHERE (created_at, id) < ($2, $3)"
        else:
            where, order = "WHERE (created_at, id) > ($2, $3)", "ASC"
        args += [cursor["created_at"], cursor["id"]]
    rows = await sandbox.pool.fetch(
        f"{_SELECT_EMAILS} {where} ORDER BY created_at {order}, id {order} LIMIT $1", *args)
    has_more = len(rows) > size
    page = list(rows[:size])
    if order == "ASC":
        page.reverse()
    return JSONResponse({"object": "list", "has_more": has_more,
                         "data": [email_json(r) for r in page]})
