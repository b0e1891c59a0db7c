"""Standard Webhooks source: `POST /v1/inbound/standard` (HMAC-signed JSON body naming the
tenant, mailbox, delivery ID and the raw message; section 10 of `docs/architecture.md`).

Order of work, cheapest refusal first (the route of `sources.base`): no secret configured →
401 without reading the body; missing or stale signature headers → 401 without reading the
body; the body read with a running cap (413); the HMAC over `id.timestamp.body` checked
against every configured secret (the shared `INBOXCRM_WEBHOOK_SECRET` and each tenant's
`INBOXCRM_WEBHOOK_SECRET_<TENANT>`); only then is the JSON parsed, and its tenant must be one
a matching secret is bound to (403 otherwise)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import time
from dataclasses import dataclass
from typing import Any, Final

from inboxcrm.domain.policy import UnknownTenant, get_policy
from inboxcrm.ingress.intake import DELIVERY_ID, BadRequest, Delivery, Unauthenticated
from inboxcrm.ingress.sources.base import BodySource, Busy, Headers, Proof, json_body
from inboxcrm.ingress.tenancy import Binding, warn_unbound
from inboxcrm.platform.config import Settings

log = logging.getLogger("inboxcrm.ingress.standard")

STANDARD: Final = "standard"
MAX_WEBHOOK_ID = 256
MAX_SIGNATURE_HEADER = 4096
# Hash a large body off the event loop (hashlib releases the GIL), a small one inline.
THREAD_HASH_BYTES = 256 * 1024
# Large bodies are hashed (once per configured secret) in threads, at most this many at once
# per relay process; a request that finds no slot within HASH_WAIT_SECONDS is answered 503
# with Retry-After, so a flood of large signed-looking bodies costs bounded CPU.
HASH_SLOTS = 2
HASH_WAIT_SECONDS = 10.0


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
    return Delivery(tenant, STANDARD, mailbox, payload["delivery_id"], raw)


@dataclass(frozen=True)
class StandardKey:
    """One configured secret: its key bytes and the tenant it is bound to (None: shared,
    bound through the policies' `inbound_credentials`)."""

    key: bytes
    tenant: str | None

    def binding(self) -> Binding:
        return Binding.own(self.tenant) if self.tenant else Binding.shared(STANDARD)


def decode_secret(name: str, secret: str) -> bytes:
    """The key of a `whsec_<base64>` secret; a secret that is not base64 stops the start."""
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{name} is not a whsec_<base64> secret") from None
    if not key:
        raise ValueError(f"{name} is empty")
    return key


def configured_keys(settings: Settings) -> list[StandardKey]:
    keys = []
    if settings.webhook_secret:
        keys.append(StandardKey(decode_secret("INBOXCRM_WEBHOOK_SECRET",
                                              settings.webhook_secret), None))
    for tenant, secret in sorted(settings.webhook_tenant_secrets.items()):
        keys.append(StandardKey(decode_secret(f"INBOXCRM_WEBHOOK_SECRET_{tenant.upper()}",
                                              secret), tenant))
    return keys


@dataclass(frozen=True)
class SignatureHeaders:
    msg_id: str
    timestamp: str
    signatures: list[bytes]


def signature_headers(headers: Any, tolerance_seconds: int,
                      now: float | None = None) -> SignatureHeaders | None:
    """The three Standard Webhooks headers when present, well-formed and fresh; else None.
    Checked before a byte of the body is read."""
    msg_id = headers.get("webhook-id") or ""
    timestamp = headers.get("webhook-timestamp") or ""
    signature = headers.get("webhook-signature") or ""
    if not msg_id or len(msg_id) > MAX_WEBHOOK_ID or not msg_id.isascii():
        return None
    if not timestamp.isascii() or not timestamp.isdigit() or len(timestamp) > 12:
        return None
    now = time.time() if now is None else now
    if abs(now - int(timestamp)) > tolerance_seconds:
        return None
    if not signature or len(signature) > MAX_SIGNATURE_HEADER:
        return None
    signatures = []
    for item in signature.split(" "):
        version, _, value = item.partition(",")
        if version != "v1" or not value:
            continue
        try:
            signatures.append(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            continue
    if not signatures:
        return None
    return SignatureHeaders(msg_id, timestamp, signatures)


def matching_keys(keys: list[StandardKey], signed: SignatureHeaders,
                  body: bytes) -> list[StandardKey]:
    """The configured secrets whose HMAC-SHA256 of `id.timestamp.body` is among the
    presented signatures (every comparison constant-time)."""
    prefix = f"{signed.msg_id}.{signed.timestamp}.".encode()
    out = []
    for key in keys:
        mac = hmac.new(key.key, prefix, hashlib.sha256)
        mac.update(body)
        expected = mac.digest()
        if any(hmac.compare_digest(expected, presented) for presented in signed.signatures):
            out.append(key)
    return out


class StandardSource(BodySource[SignatureHeaders]):
    """POST /v1/inbound/standard."""

    name = STANDARD
    refusal = "invalid or missing webhook signature"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.keys = configured_keys(settings)
        self.tolerance_seconds = settings.webhook_tolerance_seconds
        self.hashing = asyncio.Semaphore(HASH_SLOTS)
        if not self.keys:
            log.warning("standard source disabled: neither INBOXCRM_WEBHOOK_SECRET nor any "
                        "INBOXCRM_WEBHOOK_SECRET_<TENANT> is set (every request is a 401)")
        for key in self.keys:
            warn_unbound(log, key.binding)

    def presented(self, headers: Headers) -> SignatureHeaders | None:
        return signature_headers(headers, self.tolerance_seconds) if self.keys else None

    async def verify(self, presented: SignatureHeaders, body: bytes) -> Proof:
        if len(body) * len(self.keys) > THREAD_HASH_BYTES:
            try:
                await asyncio.wait_for(self.hashing.acquire(), HASH_WAIT_SECONDS)
            except TimeoutError:
                raise Busy("too many large deliveries being verified; retry later") from None
            try:
                matched = await asyncio.to_thread(matching_keys, self.keys, presented, body)
            finally:
                self.hashing.release()
        else:
            matched = matching_keys(self.keys, presented, body)
        if not matched:
            raise Unauthenticated("signature mismatch")
        return Proof(tuple(key.binding() for key in matched))

    def parse(self, body: bytes, proof: Proof) -> Delivery:
        return parse_standard_body(json_body(body), self.max_body_bytes)


SOURCE = StandardSource
