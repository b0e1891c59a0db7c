"""The inbound-source protocol: a push source says how a request authenticates and how its body
becomes a `Delivery`; `receive` is the one route they all share, and `Intake.ingest` the one
ingest path it ends in, which a pull source (a mailbox watcher) calls too.

`receive` does the work in the order of docs/architecture.md §7, cheapest refusal first, and
gives every answer of §10:

1. the credential the request presents, from its headers alone: none (or no credential
   configured for the source) is a 401 and the body is never read;
2. the body, read under the cap while it arrives: 413 (a malformed form: 422);
3. the credential checked against the body: 401, or 503 with `Retry-After` when there is no
   room to check it now (`Busy`: large bodies are hashed a bounded number at a time);
4. the body parsed into a `Delivery`: 422 malformed, 413 when the rebuilt message is too
   large, 403 when it names a tenant outside the credential's binding;
5. the tenant checked against the bindings that authenticated it: 403, nothing stored;
   then its intake rate (`Admission`): 429 with `Retry-After`, nothing stored;
6. a signature that does not cover the body is accepted once (`OnceToken`): a reuse is a 401;
7. `Intake.ingest`: 200 accepted / duplicate / copy, 503 ledger or Temporal unavailable.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import asyncpg
from fastapi import Request
from fastapi.responses import JSONResponse

from inboxcrm.ingress.deps import IntakeDep
from inboxcrm.ingress.intake import (
    BadRequest,
    Delivery,
    IngestResult,
    Intake,
    TooLarge,
    Unauthenticated,
    answer,
    error_response,
)
from inboxcrm.ingress.tenancy import Binding, Forbidden, check_tenant
from inboxcrm.ingress.web import read_stream
from inboxcrm.platform.config import Settings
from inboxcrm.store import replay_tokens

log = logging.getLogger("inboxcrm.ingress.sources")

# Seconds a caller is asked to wait before it retries a delivery the relay had no room to
# authenticate (every provider honours `Retry-After` on a 503).
BUSY_RETRY_AFTER_SECONDS = 5


class Busy(Exception):
    """No room to do the work of authenticating now: answered 503 with `Retry-After`."""


Headers = Mapping[str, str]  # case-insensitive in a request (Starlette's Headers)
Presented = TypeVar("Presented")
Body = TypeVar("Body")


@dataclass(frozen=True)
class OnceToken:
    """A signature over a token, not over the body, is accepted once: the token is kept for
    `keep_seconds` (past its tolerance window) in `webhook_replay_tokens`."""

    token: str
    signed_at: int
    keep_seconds: int


@dataclass(frozen=True)
class Proof:
    """What authenticated a request: the bindings of the credentials that matched (the
    tenants it may write into) and, for a signature that does not cover the body, its token."""

    bindings: tuple[Binding, ...]
    once: OnceToken | None = None


class PushSource(ABC, Generic[Presented, Body]):
    """A provider that POSTs each delivery: one module in `inboxcrm/ingress/sources/` named
    as in schemas.sources, exporting its subclass as `SOURCE`. Built once per relay from the
    settings (a source without its credential logs that it is disabled)."""

    name: ClassVar[str]
    refusal: ClassVar[str]                 # the message of its 401
    challenge: ClassVar[str | None] = None  # the 401's WWW-Authenticate, if any

    def __init__(self, settings: Settings) -> None:
        self.max_body_bytes = settings.max_body_bytes

    @property
    def paths(self) -> tuple[str, ...]:
        return (f"/v1/inbound/{self.name}",)

    @abstractmethod
    def presented(self, headers: Headers) -> Presented | None:
        """The credential the request presents, from its headers alone; None when there is
        none or the source has no credential configured (401, the body unread)."""

    @abstractmethod
    async def read(self, headers: Headers, chunks: AsyncIterator[bytes]) -> Body:
        """The body under the cap, read as it arrives; TooLarge (413) or BadRequest (422)."""

    @abstractmethod
    async def verify(self, presented: Presented, body: Body) -> Proof:
        """The proof of an authentic request; Unauthenticated (401, reason logged) else."""

    @abstractmethod
    def parse(self, body: Body, proof: Proof) -> Delivery:
        """The delivery of an authenticated body: BadRequest (422), TooLarge (413), Forbidden
        (403, its recipient is a tenant outside `proof.bindings`)."""

    async def endpoint(self, request: Request, intake: IntakeDep) -> JSONResponse:
        """The route FastAPI serves at each of `paths`."""
        return await receive(self, request.headers, request.stream(), intake)


class BodySource(PushSource[Presented, bytes]):
    """A push source whose body is read whole (under the cap) before it is verified."""

    async def read(self, headers: Headers, chunks: AsyncIterator[bytes]) -> bytes:
        body = await read_stream(headers.get("content-length"), chunks, self.max_body_bytes)
        if body is None:
            raise TooLarge(f"body exceeds {self.max_body_bytes} bytes")
        return body


def json_body(body: bytes) -> Any:
    """The JSON of a body; BadRequest (422) when it is not JSON, or nested past the
    parser's depth."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise BadRequest("body is not valid JSON") from None


async def receive(source: PushSource[Presented, Body], headers: Headers,
                  chunks: AsyncIterator[bytes], intake: Intake) -> JSONResponse:
    """One push delivery, start to answer (the steps of the module docstring)."""
    presented = source.presented(headers)
    if presented is None:
        return _unauthenticated(source, intake, "no valid credential presented (or none "
                                "configured)")
    try:
        body = await source.read(headers, chunks)
    except TooLarge as exc:
        return error_response(413, str(exc))
    except BadRequest as exc:
        return error_response(422, str(exc))
    try:
        proof = await source.verify(presented, body)
    except Unauthenticated as exc:
        return _unauthenticated(source, intake, str(exc))
    except Busy as exc:
        log.info("%s delivery deferred: %s", source.name, exc)
        response = error_response(503, str(exc))
        response.headers["Retry-After"] = str(BUSY_RETRY_AFTER_SECONDS)
        return response
    try:
        delivery = source.parse(body, proof)
        check_tenant(proof.bindings, delivery.tenant)
    except BadRequest as exc:
        return error_response(422, str(exc))
    except TooLarge as exc:
        return error_response(413, str(exc))
    except Forbidden as exc:
        intake.count_forbidden(source.name)
        log.info("%s delivery refused: %s", source.name, exc)
        return error_response(403, str(exc))
    wait = intake.admission.retry_after(delivery.tenant)
    if wait is not None:
        intake.count_rate_limited(source.name)
        response = error_response(429, "the tenant's intake rate is exceeded; retry later")
        response.headers["Retry-After"] = str(wait)
        return response
    if proof.once is None:
        return answer(await intake.ingest(delivery))
    return await _ingest_once(source, proof.once, delivery, intake)


async def _ingest_once(source: PushSource[Presented, Body], once: OnceToken,
                       delivery: Delivery, intake: Intake) -> JSONResponse:
    """Ingest under a token accepted once; released again when the delivery was not (or not
    fully) processed, so the very same POST may be retried."""
    pool = intake.ledger.pool
    try:
        fresh = await replay_tokens.consume_token(pool, source.name, once.token,
                                                  once.signed_at, once.keep_seconds)
    except (TimeoutError, asyncpg.PostgresError, OSError):
        return error_response(503, "ledger unavailable; retry later")
    if not fresh:
        return _unauthenticated(source, intake, "token replayed",
                                f"{source.refusal} (token replayed)")
    response = answer(await intake.ingest(delivery))
    if response.status_code == 503:
        try:
            await replay_tokens.release_token(pool, source.name, once.token)
        except (TimeoutError, asyncpg.PostgresError, OSError):
            log.warning("%s token not released: ledger unavailable", source.name)
    return response


def _unauthenticated(source: PushSource[Presented, Body], intake: Intake, reason: str,
                     message: str | None = None) -> JSONResponse:
    log.info("%s request rejected: %s", source.name, reason)
    intake.count_auth_failure(source.name)
    response = error_response(401, message or source.refusal)
    if source.challenge:
        response.headers["WWW-Authenticate"] = source.challenge
    return response


Ingest = Callable[[Delivery], Awaitable[IngestResult]]


class PullSource(Protocol):
    """A mailbox watcher (IMAP, Gmail, Microsoft Graph): it reads a tenant's mailbox with the
    credential configured for it and hands every message to `ingest` (`Intake.ingest`, the
    push routes' path) as a `Delivery`: the tenant and mailbox it watches, its source name
    (schemas.sources), an immutable delivery ID from the mailbox (IMAP `UIDVALIDITY/UID`,
    the Gmail message ID, Graph's immutable ID), the raw bytes and the mailbox's arrival
    time. It moves its cursor past a message only once `IngestResult.stored`; the ledger
    answers a message offered twice `duplicate`."""

    name: str

    async def watch(self, ingest: Ingest) -> None:
        """Run until cancelled."""
