"""`POST /v1/inbound/gmail`: Gmail's Pub/Sub push (docs/mailboxes.md, "Google Workspace").

The push's OIDC token (`Authorization: Bearer`, signed by Google for the push
subscription's service account) is verified before anything of the body is read: its
RS256 signature against the issuer's JWKS, its issuer, its audience and its `email` (the
configured service account, verified); otherwise 401 and nothing is read or stored. The
body (`{"message": {"data": base64({"emailAddress", "historyId"}), …}, "subscription"}`)
then names the mailbox, and the relay only wakes its watchers (signal `gmail_push`): the
mail itself is read by the watcher with the tenant's own token, from its stored
historyId, so a push can neither bring mail in nor skip any.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
from datetime import timedelta
from typing import Any

import asyncpg
import httpx
import jwt
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from temporalio.service import RPCError, RPCStatusCode

from inboxcrm.ingress.intake import TemporalHandle, error_response
from inboxcrm.ingress.web import read_stream
from inboxcrm.platform.config import Settings
from inboxcrm.platform.gmail_config import GmailSettings
from inboxcrm.schemas.mailboxes import GMAIL_PUSH_SIGNAL, mailbox_workflow_id
from inboxcrm.store import gmail as store

log = logging.getLogger("inboxcrm.ingress.gmail")

PATH = "/v1/inbound/gmail"
MAX_PUSH_BYTES = 64 * 1024  # a push names a mailbox and a historyId: a few hundred bytes
MAX_TOKEN_CHARS = 8192
# An unknown key ID fetches the keys again at most this often (Google rotates them).
JWKS_REFRESH_MIN_SECONDS = 60.0
SIGNAL_TIMEOUT = timedelta(seconds=5)


class Refused(Exception):
    """The push's token does not prove it (the reason is logged, never answered)."""


class PushVerifier:
    """The OIDC token of a Pub/Sub push, checked against the issuer's published keys."""

    def __init__(self, gmail: GmailSettings) -> None:
        self.gmail = gmail
        self._keys: dict[str, Any] = {}
        self._fetched_at = 0.0
        self._lock = asyncio.Lock()

    @property
    def configured(self) -> bool:
        return bool(self.gmail.push_audience and self.gmail.push_service_account)

    async def _key(self, kid: str) -> Any:
        if kid not in self._keys or time.monotonic() - self._fetched_at > \
                self.gmail.jwks_cache_seconds:
            async with self._lock:
                if (kid not in self._keys and time.monotonic() - self._fetched_at >
                        JWKS_REFRESH_MIN_SECONDS) or (
                        time.monotonic() - self._fetched_at > self.gmail.jwks_cache_seconds):
                    await self._fetch()
        if kid not in self._keys:
            raise Refused("unknown key id")
        return self._keys[kid]

    async def _fetch(self) -> None:
        try:
            async with httpx.AsyncClient(timeout=10.0) as client:
                response = await client.get(self.gmail.push_jwks_url or "")
                response.raise_for_status()
                keys = jwt.PyJWKSet.from_dict(response.json())
        except (httpx.HTTPError, ValueError, jwt.PyJWTError) as exc:
            raise Refused(f"issuer keys unavailable ({type(exc).__name__})") from None
        self._keys = {k.key_id: k.key for k in keys.keys if k.key_id}
        self._fetched_at = time.monotonic()

    async def verify(self, authorization: str | None) -> dict[str, Any]:
        if not self.configured:
            raise Refused("no push audience / service account configured")
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_CHARS:
            raise Refused("no bearer token")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Refused("malformed token") from None
        if header.get("alg") != "RS256" or not isinstance(header.get("kid"), str):
            raise Refused("not an RS256 token with a key id")
        key = await self._key(header["kid"])
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=["RS256"], audience=self.gmail.push_audience,
                issuer=list(self.gmail.issuers()), leeway=30,
                options={"require": ["exp", "iat", "iss", "aud", "email"]})
        except jwt.PyJWTError as exc:
            raise Refused(f"token refused ({type(exc).__name__})") from None
        if claims.get("email") != self.gmail.push_service_account or \
                claims.get("email_verified") is not True:
            raise Refused("not the push service account")
        return claims


def parse_push(body: bytes) -> tuple[str, str]:
    """(emailAddress, historyId) of a push body; ValueError when it is not one."""
    try:
        envelope = json.loads(body)
        data = base64.b64decode(envelope["message"]["data"], validate=False)
        note = json.loads(data)
        address, history_id = note["emailAddress"], note["historyId"]
    except (ValueError, KeyError, TypeError, binascii.Error, RecursionError):
        raise ValueError("not a Gmail Pub/Sub push") from None
    if not isinstance(address, str) or not isinstance(history_id, (int, str)) or \
            not str(history_id).isdigit():
        raise ValueError("not a Gmail Pub/Sub push")
    return address.strip().lower(), str(history_id)


def gmail_push_router(settings: Settings, handle: TemporalHandle) -> APIRouter:
    router = APIRouter()
    verifier = PushVerifier(GmailSettings().resolved(settings))

    @router.post(PATH, name="inbound_gmail")
    async def inbound_gmail(request: Request) -> JSONResponse:
        try:
            await verifier.verify(request.headers.get("authorization"))
        except Refused as exc:
            log.info("gmail push refused: %s", exc)
            response = error_response(401, "push token not valid")
            response.headers["WWW-Authenticate"] = 'Bearer error="invalid_token"'
            return response
        body = await read_stream(request.headers.get("content-length"), request.stream(),
                                 MAX_PUSH_BYTES)
        if body is None:
            return error_response(413, f"body exceeds {MAX_PUSH_BYTES} bytes")
        try:
            address, history_id = parse_push(body)
        except ValueError as exc:
            return error_response(422, str(exc))
        pool: asyncpg.Pool = request.app.state.ingestor.pool
        try:
            async with pool.acquire() as conn:
                watchers = await store.watchers_of(conn, address=address)
        except (TimeoutError, asyncpg.PostgresError, OSError):
            return error_response(503, "ledger unavailable; retry later")
        if not watchers:
            return error_response(422, "no Gmail mailbox registered for this address")
        woken = 0
        try:
            for row in watchers:
                client = await handle.get(row["tenant"])  # the watcher's namespace
                workflow_id = mailbox_workflow_id(row["tenant"], store.KIND, address,
                                                  row["folder"])
                try:
                    await client.get_workflow_handle(workflow_id).signal(
                        GMAIL_PUSH_SIGNAL, history_id, rpc_timeout=SIGNAL_TIMEOUT)
                    woken += 1
                except RPCError as exc:
                    if exc.status != RPCStatusCode.NOT_FOUND:
                        raise
                    # Not running: its next start catches up from the stored historyId.
        except (TimeoutError, RPCError, OSError, RuntimeError):
            return error_response(503, "Temporal unavailable; retry later")
        return JSONResponse({"status": "accepted", "watchers": woken})

    return router
