"""Mailgun source: `POST /v1/inbound/mailgun[/mime]` (routes `forward()` form, HMAC signature).

Delivery IDs
    Mailgun: the message's `Message-Id` header (from `message-headers`, or from `body-mime`),
    angle brackets removed. Mailgun's forward() POST carries no delivery ID of its own: its
    `token`/`timestamp` change on every retry, so they authenticate, they never identify.
    A Message-Id that is not 1-255 printable ASCII characters is replaced by
    `mid-sha256-<sha256 of the header value>`; a message *without* a Message-Id gets
    `sha256-<sha256 of the rebuilt raw message>` (deterministic: the rebuild uses no random
    MIME boundary, so a retried POST of the same message gets the same ID). Two different
    messages that share a Message-Id and a mailbox are therefore answered as duplicates.

Rebuilding the raw message
    Postmark with "include raw email content" on: `RawEmail` as posted. Otherwise, and for
    Mailgun's parsed form: the provider's header list (trace, `Auto-Submitted`, `Precedence`,
    `List-*`, ... all kept in order), the address/subject/date headers, and a body built
    from the text and HTML versions (multipart/alternative) plus attachments
    (multipart/mixed). Mailgun's raw-MIME variant (`body-mime`, route URL ending in `mime`,
    served at `/v1/inbound/mailgun/mime` and `/v1/inbound/mailgun`) is stored as posted.

Mailgun replay protection
    The signature covers only `timestamp + token`, not the body, so a captured triple could
    be reused with a forged body inside the tolerance window. Every token is therefore
    accepted once (`webhook_replay_tokens`, unique per source and token); a reuse is a 401.
    Dedupe is unaffected: a genuine redelivery carries a new token and is answered
    `duplicate` by the ledger, keyed by the delivery ID above.

Reading before authenticating
    The signature travels inside the form, so the form is read first, by the streaming
    reader of `inboxcrm.ingress.form` (total size, field count, part size, header lines,
    no nested multipart; each chunk handled as it arrives, in linear time, on the event
    loop without blocking it). Without a configured signing key every request is a 401 and
    the body is never read. Only `timestamp`, `token` and `signature` are looked at before
    the signature is checked; nothing else of the form is decoded or parsed until then.

What counts as authenticated (the tenant)
    Mailgun signs `timestamp + token` only, never the body. The relay treats the rest of the
    form, `recipient` (the envelope recipient Mailgun matched the route on) included, as
    authenticated because the request as a whole is: a valid signature proves the key
    holder sent it within the tolerance window, each token is accepted once, and the POST
    travels over TLS. Someone able to alter a request in flight could change `recipient`;
    even then the key's binding holds: the tenant is one that lists "mailgun" in its
    policy's `inbound_credentials`, narrowed by `recipient`. The `To`/`Cc` headers, which
    the sender wrote, only pick the mailbox of a key bound to a single tenant.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from email import policy as email_policy
from email.parser import BytesHeaderParser
from typing import Final

from inboxcrm.ingress.form import (
    Form,
    FormLimits,
    FormTooLarge,
    RawForm,
    parse_form_bytes,
    read_form,
)
from inboxcrm.ingress.intake import (
    DELIVERY_ID,
    BadRequest,
    Delivery,
    ProviderEvent,
    TooLarge,
    Unauthenticated,
)
from inboxcrm.ingress.mime import (
    BODY_HEADERS,
    CONTENT_ID,
    LINE_BREAKS,
    MAX_ATTACHMENTS,
    MAX_FORM_PARTS,
    MAX_HEADERS,
    Attachment,
    build_message,
    check_header_name,
    clean_text,
    first_header,
    header_addresses,
)
from inboxcrm.ingress.sources.base import Headers, OnceToken, Proof, PushSource
from inboxcrm.ingress.tenancy import Binding, resolve_recipient, warn_unbound
from inboxcrm.platform.config import Settings

log = logging.getLogger("inboxcrm.ingress.mailgun")

MAILGUN: Final = "mailgun"
# The provider event kept for a Mailgun delivery: its form's fields as JSON (mailgun_event).
MAILGUN_EVENT_TYPE: Final = "application/vnd.inboxcrm.mailgun-form+json"


def mailgun_signature(signing_key: str, timestamp: str, token: str) -> str:
    """Mailgun's webhook signature: hex HMAC-SHA256(signing key, timestamp + token)."""
    return hmac.new(signing_key.encode(), (timestamp + token).encode(),
                    hashlib.sha256).hexdigest()


SIGNATURE_FIELDS = frozenset({"timestamp", "token", "signature"})


def verify_mailgun(form: Form | dict[str, str], signing_key: str | None,
                   tolerance_seconds: int, now: float | None = None) -> tuple[str, int]:
    """The (token, timestamp) of an authentic request; raises Unauthenticated otherwise."""
    if not signing_key:
        raise Unauthenticated("mailgun source not configured (INBOXCRM_MAILGUN_SIGNING_KEY)")
    timestamp, token, signature = form.get("timestamp"), form.get("token"), form.get("signature")
    if not timestamp or not token or not signature:
        raise Unauthenticated("missing timestamp, token or signature")
    if not timestamp.isascii() or not timestamp.isdigit() or len(timestamp) > 12:
        raise Unauthenticated("malformed timestamp")
    if len(token) > 256 or len(signature) > 256 or not token.isascii():
        raise Unauthenticated("malformed token or signature")
    expected = mailgun_signature(signing_key, timestamp, token).encode()
    if not hmac.compare_digest(expected, signature.encode("utf-8", "surrogateescape")):
        raise Unauthenticated("signature mismatch")
    now = time.time() if now is None else now
    if abs(now - int(timestamp)) > tolerance_seconds:
        raise Unauthenticated("timestamp outside the tolerance window")
    return token, int(timestamp)




def parse_form(content_type: str | None, body: bytes,
               limits: FormLimits | None = None) -> Form:
    """A whole form already in memory, read by the same bounded reader as a request."""
    limits = limits or FormLimits(total_bytes=max(len(body), 1), max_fields=MAX_FORM_PARTS)
    return parse_form_bytes(content_type, body, limits).to_form()


def _message_headers(value: str) -> list[tuple[str, str]]:
    problem = "field 'message-headers' must be a JSON list of [name, value] pairs"
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        raise BadRequest(problem) from None
    if not isinstance(parsed, list) or len(parsed) > MAX_HEADERS:
        raise BadRequest(problem)
    out = []
    for i, pair in enumerate(parsed):
        if (not isinstance(pair, list) or len(pair) != 2
                or not isinstance(pair[1], str)):
            raise BadRequest(problem)
        out.append((check_header_name(pair[0], f"field 'message-headers[{i}]' name"), pair[1]))
    return out


def _mailgun_attachments(form: Form) -> list[Attachment]:
    cids: dict[str, str] = {}
    if form.get("content-id-map"):
        try:
            mapping = json.loads(form.get("content-id-map") or "{}")
        except (ValueError, RecursionError):
            raise BadRequest("field 'content-id-map' must be a JSON object") from None
        if not isinstance(mapping, dict):
            raise BadRequest("field 'content-id-map' must be a JSON object")
        for cid, key in mapping.items():
            cid = str(cid).strip().strip("<>")
            if isinstance(key, str) and cid and CONTENT_ID.match(cid):
                cids[key] = cid
    count_text = form.get("attachment-count") or "0"
    if not count_text.isdigit() or int(count_text) > MAX_ATTACHMENTS:
        raise BadRequest(f"field 'attachment-count' must be a number up to {MAX_ATTACHMENTS}")
    out = []
    for i in range(1, int(count_text) + 1):
        upload = form.file(f"attachment-{i}")
        if upload is not None:
            out.append(Attachment(clean_text(upload.filename).rsplit("/", 1)[-1] or "attachment",
                                  upload.content_type, upload.data,
                                  cids.get(f"attachment-{i}")))
    return out


def mailgun_delivery_id(message_id: str | None, raw: bytes) -> str:
    """The Message-Id without angle brackets; see the module docstring for the fallbacks."""
    if message_id:
        value = LINE_BREAKS.sub(" ", message_id).strip()
        if value.startswith("<") and value.endswith(">"):
            value = value[1:-1].strip()
        if value and DELIVERY_ID.match(value):
            return value
        if value:
            digest = hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()
            return f"mid-sha256-{digest}"
    return f"sha256-{hashlib.sha256(raw).hexdigest()}"


def parse_mailgun(form: Form, binding: Binding, max_raw_bytes: int) -> Delivery:
    """The delivery of an authenticated form. The tenant comes from the key's binding
    narrowed by `recipient` (the envelope recipient; see the module docstring on what
    counts as authenticated); `To`/`Cc` only pick a mailbox of a key bound to one tenant."""
    recipients = [r.strip() for r in (form.get("recipient") or "").split(",") if r.strip()]
    mime_file = form.file("body-mime")
    mime_text = form.get("body-mime")
    if mime_file is not None or mime_text is not None:
        raw = mime_file.data if mime_file is not None else (mime_text or "").encode(
            "utf-8", "surrogateescape")
        if not raw.strip():
            raise BadRequest("field 'body-mime' is empty")
        parsed = BytesHeaderParser(policy=email_policy.compat32).parsebytes(raw)
        headers = [(str(k), str(v)) for k, v in parsed.items()]
        if not headers:
            raise BadRequest("field 'body-mime' has no message headers")
    else:
        header_text = form.get("message-headers")
        if header_text is None:
            raise BadRequest("field 'message-headers' (or 'body-mime') is required")
        headers = _message_headers(header_text)
        if first_header(headers, "From") is None:
            sender = form.get("from")
            if not sender:
                raise BadRequest("no From header in 'message-headers' and no 'from' field")
            headers.append(("From", sender))
        if first_header(headers, "Subject") is None and form.get("subject") is not None:
            headers.append(("Subject", form.get("subject") or ""))
        kept = [(n, v) for n, v in headers if n.lower() not in BODY_HEADERS]
        raw = build_message(kept, form.get("body-plain"), form.get("body-html"),
                            _mailgun_attachments(form))
    tenant, mailbox = resolve_recipient(binding, recipients,
                                        header_addresses(headers, "To", "Cc"))
    if len(raw) > max_raw_bytes:
        raise TooLarge(f"message exceeds {max_raw_bytes} bytes")
    delivery_id = mailgun_delivery_id(first_header(headers, "Message-ID"), raw)
    return Delivery(tenant, MAILGUN, mailbox, delivery_id, raw,
                    provider_event=mailgun_event(form))


def mailgun_event(form: Form) -> ProviderEvent:
    """The form as Mailgun posted it, as JSON: every field as sent (the signature fields too:
    they are what proves it came from Mailgun), each file by name, type, size and SHA-256
    (its bytes are in the stored MIME), and `body-mime` by its SHA-256 (it *is* the stored
    MIME)."""
    fields = {name: ([f"sha256:{_sha256(v.encode('utf-8', 'surrogateescape'))}"
                      for v in values] if name == "body-mime" else values)
              for name, values in form.fields.items()}
    files = {name: [{"filename": u.filename, "content_type": u.content_type,
                     "size": len(u.data), "sha256": _sha256(u.data)} for u in uploads]
             for name, uploads in form.files.items()}
    body = json.dumps({"fields": fields, "files": files}, sort_keys=True).encode("ascii")
    return ProviderEvent(MAILGUN_EVENT_TYPE, body)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()





def mailgun_form_limits(settings: Settings) -> FormLimits:
    """What one Mailgun POST may hold: the body cap, MAX_FORM_PARTS fields, no nesting."""
    return FormLimits(total_bytes=settings.max_body_bytes, max_fields=MAX_FORM_PARTS)


class MailgunSource(PushSource[str, RawForm]):
    """POST /v1/inbound/mailgun and /v1/inbound/mailgun/mime."""

    name = MAILGUN
    refusal = "invalid, stale or missing Mailgun signature"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.signing_key = (settings.mailgun_signing_key.get_secret_value()
                            if settings.mailgun_signing_key else None)
        self.tolerance_seconds = settings.mailgun_tolerance_seconds
        self.limits = mailgun_form_limits(settings)
        if not self.signing_key:
            log.warning("mailgun source disabled: INBOXCRM_MAILGUN_SIGNING_KEY not set "
                        "(every request is a 401)")
        else:
            warn_unbound(log, lambda: Binding.shared(MAILGUN))

    @property
    def paths(self) -> tuple[str, ...]:
        return ("/v1/inbound/mailgun", "/v1/inbound/mailgun/mime")

    def presented(self, headers: Headers) -> str | None:
        """The signature travels in the form: only whether a key is configured is known
        before the body is read."""
        return self.signing_key

    async def read(self, headers: Headers, chunks: AsyncIterator[bytes]) -> RawForm:
        try:
            return await read_form(headers.get("content-type"), headers.get("content-length"),
                                   chunks, self.limits)
        except FormTooLarge as exc:
            raise TooLarge(str(exc)) from None

    async def verify(self, presented: str, body: RawForm) -> Proof:
        # Authentication first: only the three signature fields are looked at.
        fields = {name: value for name, value in body.pairs if name in SIGNATURE_FIELDS}
        for part in body.parts:
            if part.name in SIGNATURE_FIELDS and part.filename is None \
                    and len(part.data) <= 256:
                fields.setdefault(part.name, part.data.decode("ascii", "replace"))
        token, signed_at = verify_mailgun(fields, presented, self.tolerance_seconds)
        keep = 2 * self.tolerance_seconds + 60
        return Proof((Binding.shared(MAILGUN),), OnceToken(token, signed_at, keep))

    def parse(self, body: RawForm, proof: Proof) -> Delivery:
        [binding] = proof.bindings
        try:
            return parse_mailgun(body.to_form(), binding, self.max_body_bytes)
        except RecursionError:
            raise BadRequest("form is nested too deeply") from None


SOURCE = MailgunSource
