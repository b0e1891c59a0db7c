"""Plumbing shared by the CRM and mail routes: settings, faults, the call log, auth.

Every CRM/mail call goes through `Sandbox.run`, so auth, fault injection and the call log
behave the same way on every endpoint and the endpoint code only does the real work.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import asyncpg
from fastapi import Depends, Request
from fastapi.responses import JSONResponse, Response

Target = Literal["crm.upsert", "crm.update", "crm.search", "crm.note", "crm.association",
                 "crm.consent", "crm.email", "mail.send"]
# HubSpot's 429 `policyName`s: which limit was hit (the daily one resets at midnight).
Policy = Literal["SECONDLY", "TEN_SECONDLY_ROLLING", "DAILY"]
Mode = Literal[
    "rate_limit",
    "server_error",
    "invalid_field",
    "unauthorized",
    "timeout_before_commit",
    "timeout_after_commit",
    "hold_before_commit",
]
IMMEDIATE_MODES = frozenset({"rate_limit", "server_error", "invalid_field", "unauthorized"})

# Lease on an in-flight idempotency key beyond the configured hang: long enough for any
# real request, short enough that a crashed process frees the key soon.
LEASE_MARGIN_SECONDS = 30.0

# A `hold_before_commit` request waits until its fault is released (`POST
# /_sandbox/faults/release`, or `DELETE /_sandbox/faults`), then is answered like a
# timeout before commit; never longer than this, so a test that forgets to release it frees
# the request in the end.
MAX_HOLD_SECONDS = 300.0
HOLD_POLL_SECONDS = 0.02

Release = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Config:
    search_lag_seconds: float
    hang_seconds: float


@dataclass(frozen=True)
class Fault:
    id: int
    mode: str
    retry_after: int
    policy: str | None = None


@dataclass
class Outcome:
    """What an endpoint did: the response, a log label, and work to do after any hold."""

    response: Response
    label: str = "ok"
    finalize: Release | None = None


def iso(moment: datetime) -> str:
    """HubSpot-style UTC timestamp with milliseconds."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def now_iso() -> str:
    return iso(datetime.now(UTC))


async def read_json(request: Request) -> Any:
    """The parsed body, or None when it is empty or not JSON (callers reject None)."""
    raw = await request.body()
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def crm_error(status: int, category: str, message: str, **extra: Any) -> JSONResponse:
    body = {
        "status": "error",
        "message": message,
        "correlationId": str(uuid.uuid4()),
        "category": category,
        **extra,
    }
    return JSONResponse(body, status_code=status)


def mail_error(status: int, name: str, message: str) -> JSONResponse:
    return JSONResponse(
        {"statusCode": status, "name": name, "message": message}, status_code=status
    )


def _is_crm(target: str) -> bool:
    return target.startswith("crm.")


def unauthorized(target: str, name: str = "invalid_api_key") -> JSONResponse:
    """The service's refusal of a missing or wrong credential: HubSpot 401; Resend 401
    `missing_api_key` without one, 403 `invalid_api_key` for a wrong one."""
    if _is_crm(target):
        return crm_error(
            401,
            "INVALID_AUTHENTICATION",
            "Authentication credentials not found or invalid.",
        )
    if name == "missing_api_key":
        return mail_error(401, name, "Missing API key in the authorization header.")
    return mail_error(403, name, "API key is invalid.")


_POLICY_MESSAGES = {
    "SECONDLY": "You have reached your secondly limit.",
    "TEN_SECONDLY_ROLLING": "You have reached your ten_secondly_rolling limit.",
    "DAILY": "You have reached your daily limit.",
}


def crm_rate_limited(fault: Fault) -> JSONResponse:
    """HubSpot's 429: `policyName` says which limit. The daily limit resets at midnight in the
    account's time zone; no Retry-After is sent for it (waiting seconds would not help)."""
    policy = fault.policy or "SECONDLY"
    body = {
        "status": "error",
        "message": _POLICY_MESSAGES.get(policy, _POLICY_MESSAGES["SECONDLY"]),
        "errorType": "RATE_LIMIT",
        "correlationId": str(uuid.uuid4()),
        "policyName": policy,
        "category": "RATE_LIMITS",
    }
    headers = {} if policy == "DAILY" else {"Retry-After": str(fault.retry_after)}
    return JSONResponse(body, status_code=429, headers=headers)


def fault_response(target: str, fault: Fault) -> JSONResponse:
    """The error a real service answers with for an immediate fault mode."""
    crm = _is_crm(target)
    if fault.mode == "rate_limit":
        if crm:
            return crm_rate_limited(fault)
        body = {
            "statusCode": 429,
            "name": "rate_limit_exceeded",
            "message": "Too many requests. Please limit the number of requests per second.",
        }
        headers = {"Retry-After": str(fault.retry_after)}
        return JSONResponse(body, status_code=429, headers=headers)
    if fault.mode == "server_error":
        if crm:
            return crm_error(500, "INTERNAL_ERROR", "Internal error.")
        return mail_error(500, "application_error", "An unexpected error occurred.")
    if fault.mode == "invalid_field":
        if crm:
            return crm_error(400, "VALIDATION_ERROR", "Property values were not valid.")
        return mail_error(422, "validation_error", "Invalid field value.")
    return unauthorized(target)


def gateway_timeout(target: str) -> JSONResponse:
    if _is_crm(target):
        return crm_error(504, "GATEWAY_TIMEOUT", "The request timed out.")
    return mail_error(504, "gateway_timeout", "The request timed out.")


# Takes one unit of the oldest pending fault; `pending` (read from the statement's snapshot,
# before the decrement) tells a caller that got no row whether it lost a race to a fault that
# is still pending. One round trip on the no-fault path every call takes.
_CONSUME_FAULT = """
WITH taken AS (
    UPDATE sandbox.faults AS f
    SET remaining = f.remaining - 1
    WHERE f.id = (
        SELECT id FROM sandbox.faults
        WHERE target = $1 AND remaining > 0
        ORDER BY id
        LIMIT 1
    )
      AND f.remaining > 0
    RETURNING f.id, f.mode, f.retry_after, f.policy
)
SELECT t.id, t.mode, t.retry_after, t.policy,
       EXISTS (SELECT 1 FROM sandbox.faults WHERE target = $1 AND remaining > 0) AS pending
FROM (SELECT 1) AS one LEFT JOIN taken AS t ON true
"""


# Resend keeps an idempotency key for 24 hours after its first request.
KEY_TTL_SECONDS = 24 * 3600.0


class Sandbox:
    """Per-process handle: the pool, the API key and how long idempotency keys last (0: for
    ever, a debug setting the conformance suite must catch). All other state is in Postgres."""

    def __init__(self, pool: asyncpg.Pool, api_key: str | None,
                 key_ttl_seconds: float = KEY_TTL_SECONDS, latency_seconds: float = 0.0) -> None:
        self.pool = pool
        self.api_key = api_key
        self.key_ttl_seconds = key_ttl_seconds
        # Every CRM/mail call is answered this much later (`--latency-ms`): a real API is a
        # network away, and an item holds its worker slot while it waits (docs/capacity.md).
        self.latency_seconds = latency_seconds

    async def config(self) -> Config:
        row = await self.pool.fetchrow(
            "SELECT search_lag_seconds, hang_seconds FROM sandbox.config WHERE id"
        )
        if row is None:
            raise RuntimeError("sandbox.config row missing")
        return Config(row["search_lag_seconds"], row["hang_seconds"])

    async def consume_fault(self, target: str) -> Fault | None:
        """Take one unit of the oldest pending fault for `target`, atomically.

        The decrement re-checks `remaining > 0` on the locked row, so concurrent callers
        never take more than `count`; a caller that lost a race retries while any fault is
        still pending, so none take fewer either.
        """
        for _ in range(100):
            row = await self.pool.fetchrow(_CONSUME_FAULT, target)
            assert row is not None  # the LEFT JOIN always yields one row
            if row["id"] is not None:
                return Fault(row["id"], row["mode"], row["retry_after"], row["policy"])
            if not row["pending"]:
                return None
        return None

    async def _held(self, fault_id: int) -> None:
        """Until fault `fault_id` is released or deleted (every sandbox process of this
        database sees it), at most MAX_HOLD_SECONDS."""
        deadline = asyncio.get_running_loop().time() + MAX_HOLD_SECONDS
        while asyncio.get_running_loop().time() < deadline:
            held = await self.pool.fetchval(
                "SELECT NOT released FROM sandbox.faults WHERE id = $1", fault_id)
            if not held:
                return
            await asyncio.sleep(HOLD_POLL_SECONDS)

    async def log_call(self, target: str, outcome: str, status_code: int,
                       request_id: str | None = None) -> None:
        await self.pool.execute(
            "INSERT INTO sandbox.calls (target, outcome, status_code, request_id) "
            "VALUES ($1, $2, $3, $4)",
            target,
            outcome,
            status_code,
            request_id,
        )

    def denied(self, request: Request, target: str) -> Response | None:
        """A 401 when an API key is configured and the request does not carry it."""
        if self.api_key is None:
            return None
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return unauthorized(target, "missing_api_key")
        if not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            return unauthorized(target, "invalid_api_key")
        return None

    async def run(
        self,
        request: Request,
        target: str,
        operation: Callable[[], Awaitable[Outcome]],
        reserve: Callable[[], Awaitable[Release | None]] | None = None,
        *,
        authenticated: bool = False,
    ) -> Response:
        """Auth, then the next queued fault (if any), then the real operation; log the call.

        `reserve` lets an endpoint mark work as in flight while a timeout_before_commit
        hold is running (the mail idempotency key), and returns how to release it.
        `authenticated`: the caller already checked the credential (a Salesforce OAuth
        access token), so the API key is not asked for.
        """
        # Every answer carries a request ID of its own, as the providers' do (HubSpot's
        # correlation ID on its paths, `X-Request-Id` elsewhere), logged with the call so a
        # test can find the one the product recorded.
        request_id = f"sbx-{uuid.uuid4().hex}"
        if self.latency_seconds:
            await asyncio.sleep(self.latency_seconds)
        header = ("X-HubSpot-Correlation-Id" if request.url.path.startswith("/crm/")
                  else "X-Request-Id")
        if not authenticated and (denial := self.denied(request, target)) is not None:
            await self.log_call(target, "unauthenticated", denial.status_code, request_id)
            denial.headers[header] = request_id
            return denial
        fault = await self.consume_fault(target)
        mode = fault.mode if fault else None
        if fault is not None and fault.mode in IMMEDIATE_MODES:
            response = fault_response(target, fault)
            await self.log_call(target, fault.mode, response.status_code, request_id)
            response.headers[header] = request_id
            return response
        if fault is not None and mode == "hold_before_commit":
            # Logged when the hold begins: a test waits for this call, does what must happen
            # while the request is on the wire, then releases it.
            await self.log_call(target, mode, 504, request_id)
            release = await reserve() if reserve is not None else None
            try:
                await self._held(fault.id)
            finally:
                if release is not None:
                    await release()
            return gateway_timeout(target)
        if mode == "timeout_before_commit":
            hang = (await self.config()).hang_seconds
            await self.log_call(target, mode, 504)
            release = await reserve() if reserve is not None else None
            try:
                await asyncio.sleep(hang)
            finally:
                if release is not None:
                    await release()
            return gateway_timeout(target)
        outcome = await operation()
        await self.log_call(target, mode or outcome.label, outcome.response.status_code,
                            request_id)
        outcome.response.headers[header] = request_id
        try:
            if mode == "timeout_after_commit":
                await asyncio.sleep((await self.config()).hang_seconds)
        finally:
            if outcome.finalize is not None:
                await outcome.finalize()
        return outcome.response


FieldMode = Literal["unique", "not_unique", "not_external_id", "missing"]


async def field_modes(pool: asyncpg.Pool) -> dict[str, str]:
    """The account's field definitions set by `POST /_sandbox/config` `crm_fields` (a field not
    named there is, if the surface accepts it as an external ID, a unique one)."""
    modes = await pool.fetchval("SELECT crm_fields FROM sandbox.config WHERE id")
    return dict(modes or {})


def get_sandbox(request: Request) -> Sandbox:
    sandbox: Sandbox = request.app.state.sandbox
    return sandbox


SandboxDep = Annotated[Sandbox, Depends(get_sandbox)]
