"""Postmark source: `POST /v1/inbound/postmark` (inbound JSON webhook, HTTP basic auth).

Authenticates from the headers before a byte of the body is read (the route of
`sources.base`) and before anything is stored (constant-time compare; 401 otherwise), rebuilds the
raw message (`RawEmail` as posted when "include raw email content" is on, else from the
parsed payload, see `mime`), and names the delivery by the payload's `MessageID`
(Postmark's ID for the inbound message; a retried POST carries the same one)."""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
from dataclasses import replace
from typing import Any, Final

from inboxcrm.ingress.intake import DELIVERY_ID, BadRequest, Delivery, ProviderEvent, TooLarge
from inboxcrm.ingress.mime import (
    BODY_HEADERS,
    CONTENT_ID,
    MAX_ATTACHMENTS,
    MAX_HEADERS,
    Attachment,
    build_message,
    check_header_name,
    first_header,
    format_address,
)
from inboxcrm.ingress.sources.base import BodySource, Headers, Proof, json_body
from inboxcrm.ingress.tenancy import Binding, resolve_recipient, warn_unbound
from inboxcrm.platform.config import Settings

log = logging.getLogger("inboxcrm.ingress.postmark")

POSTMARK: Final = "postmark"


def basic_auth_ok(authorization: str | None, user: str | None, password: str | None) -> bool:
    """HTTP basic auth against the configured pair, in constant time. Unconfigured: False."""
    if not user or not password or not authorization:
        return False
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        decoded = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    got_user, sep, got_password = decoded.partition(b":")
    if not sep:
        return False
    user_ok = hmac.compare_digest(got_user, user.encode())
    password_ok = hmac.compare_digest(got_password, password.encode())
    return user_ok & password_ok  # both compared, always



def _opt_str(payload: dict[str, Any], name: str) -> str | None:
    value = payload.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"field '{name}' must be a string")
    return value


def _recipients(payload: dict[str, Any], name: str) -> list[tuple[str, str]]:
    value = payload.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadRequest(f"field '{name}' must be a list of {{Email, Name}} objects")
    out = []
    for i, entry in enumerate(value):
        if not isinstance(entry, dict) or not isinstance(entry.get("Email"), str):
            raise BadRequest(f"field '{name}[{i}].Email' is required and must be a string")
        display = entry.get("Name")
        if display is not None and not isinstance(display, str):
            raise BadRequest(f"field '{name}[{i}].Name' must be a string")
        out.append((display or "", entry["Email"]))
    return out


def _postmark_headers(payload: dict[str, Any]) -> list[tuple[str, str]]:
    value = payload.get("Headers")
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_HEADERS:
        raise BadRequest(f"field 'Headers' must be a list of at most {MAX_HEADERS} "
                         "{Name, Value} objects")
    out = []
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise BadRequest(f"field 'Headers[{i}]' must be a {{Name, Value}} object")
        name = check_header_name(entry.get("Name"), f"field 'Headers[{i}].Name'")
        text = entry.get("Value")
        if text is not None and not isinstance(text, str):
            raise BadRequest(f"field 'Headers[{i}].Value' must be a string")
        out.append((name, text or ""))
    return out


def _postmark_attachments(payload: dict[str, Any]) -> list[Attachment]:
    value = payload.get("Attachments")
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_ATTACHMENTS:
        raise BadRequest(f"field 'Attachments' must be a list of at most {MAX_ATTACHMENTS} "
                         "objects")
    out = []
    for i, entry in enumerate(value):
        where = f"field 'Attachments[{i}]"
        if not isinstance(entry, dict):
            raise BadRequest(f"{where}' must be an object")
        content = entry.get("Content")
        if not isinstance(content, str):
            raise BadRequest(f"{where}.Content' is required and must be a base64 string")
        try:
            data = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f"{where}.Content' is not valid base64") from None
        for key in ("Name", "ContentType", "ContentID"):
            if entry.get(key) is not None and not isinstance(entry[key], str):
                raise BadRequest(f"{where}.{key}' must be a string")
        cid = (entry.get("ContentID") or "").strip().strip("<>") or None
        if cid is not None and not CONTENT_ID.match(cid):
            raise BadRequest(f"{where}.ContentID' is not a valid content ID")
        out.append(Attachment(entry.get("Name") or "attachment",
                              entry.get("ContentType") or "application/octet-stream", data, cid))
    return out


def postmark_raw(payload: dict[str, Any]) -> bytes:
    """The RFC 5322 message of a Postmark inbound payload (RawEmail when present)."""
    raw_email = _opt_str(payload, "RawEmail")
    if raw_email:
        try:
            return raw_email.encode("utf-8", "surrogateescape")
        except UnicodeError:
            raise BadRequest("field 'RawEmail' is not valid text") from None
    from_full = payload.get("FromFull")
    if from_full is not None and (not isinstance(from_full, dict)
                                  or not isinstance(from_full.get("Email"), str)):
        raise BadRequest("field 'FromFull.Email' is required and must be a string")
    from_plain = _opt_str(payload, "From")
    if not from_full and not from_plain:
        raise BadRequest("field 'FromFull' (or 'From') is required")
    provider_headers = _postmark_headers(payload)
    rebuilt: list[tuple[str, str]] = []
    if from_full:
        name = from_full.get("Name")
        rebuilt.append(("From", format_address(name if isinstance(name, str) else "",
                                                from_full["Email"])))
    else:
        rebuilt.append(("From", from_plain or ""))
    for field_name, full_name in (("To", "ToFull"), ("Cc", "CcFull")):
        full = _recipients(payload, full_name)
        plain = _opt_str(payload, field_name)
        if full:
            rebuilt.append((field_name, ", ".join(format_address(n, a) for n, a in full)))
        elif plain:
            rebuilt.append((field_name, plain))
    for field_name, header in (("ReplyTo", "Reply-To"), ("Subject", "Subject"),
                               ("Date", "Date")):
        value = _opt_str(payload, field_name)
        if value is not None and (value or header == "Subject"):
            rebuilt.append((header, value))
    if first_header(provider_headers, "Message-ID") is None:
        rebuilt.append(("Message-ID", f"<{payload['MessageID']}@postmark.inboxcrm.invalid>"))
    rebuilt_names = {name.lower() for name, _ in rebuilt} | {"bcc"}
    kept = [(n, v) for n, v in provider_headers
            if n.lower() not in rebuilt_names and n.lower() not in BODY_HEADERS]
    return build_message(kept + rebuilt, _opt_str(payload, "TextBody"),
                         _opt_str(payload, "HtmlBody"), _postmark_attachments(payload))


def parse_postmark(payload: Any, binding: Binding, max_raw_bytes: int) -> Delivery:
    """The delivery of an authenticated Postmark payload. The tenant comes from the
    credential's binding narrowed by `OriginalRecipient` (the envelope recipient Postmark
    received the message for); `ToFull`/`CcFull` (the sender's headers) only pick a mailbox
    of a credential bound to one tenant (see inboxcrm.ingress.tenancy)."""
    if not isinstance(payload, dict):
        raise BadRequest("body must be a JSON object (a Postmark inbound message)")
    record_type = payload.get("RecordType")
    if record_type is not None and record_type != "Inbound":
        raise BadRequest("field 'RecordType' marks an outbound-event webhook (delivery, "
                         "bounce, ...), not an inbound message")
    message_id = payload.get("MessageID")
    if not isinstance(message_id, str) or not message_id:
        raise BadRequest("field 'MessageID' is required and must be a non-empty string")
    if not DELIVERY_ID.match(message_id):
        raise BadRequest("field 'MessageID' must be 1-255 printable ASCII characters")
    headers: list[str | None] = []
    for name in ("ToFull", "CcFull"):
        headers += [address for _, address in _recipients(payload, name)]
    tenant, mailbox = resolve_recipient(binding, [_opt_str(payload, "OriginalRecipient")],
                                        headers)
    raw = postmark_raw(payload)
    if len(raw) > max_raw_bytes:
        raise TooLarge(f"message exceeds {max_raw_bytes} bytes")
    return Delivery(tenant, POSTMARK, mailbox, message_id, raw)


class PostmarkSource(BodySource[Binding]):
    """POST /v1/inbound/postmark."""

    name = POSTMARK
    refusal = "invalid or missing credentials"
    challenge = 'Basic realm="inboxcrm postmark"'

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.user = settings.postmark_user
        self.password = (settings.postmark_password.get_secret_value()
                         if settings.postmark_password else None)
        if not self.user or not self.password:
            log.warning("postmark source disabled: INBOXCRM_POSTMARK_USER/PASSWORD not set "
                        "(every request is a 401)")
        else:
            warn_unbound(log, lambda: Binding.shared(POSTMARK))

    def presented(self, headers: Headers) -> Binding | None:
        if not basic_auth_ok(headers.get("authorization"), self.user, self.password):
            return None
        return Binding.shared(POSTMARK)

    async def verify(self, presented: Binding, body: bytes) -> Proof:
        return Proof((presented,))  # basic auth: authenticated by the headers alone

    def parse(self, body: bytes, proof: Proof) -> Delivery:
        """The delivery, with Postmark's JSON kept as posted (its own event)."""
        [binding] = proof.bindings
        delivery = parse_postmark(json_body(body), binding, self.max_body_bytes)
        return replace(delivery, provider_event=ProviderEvent("application/json", body))


SOURCE = PostmarkSource
