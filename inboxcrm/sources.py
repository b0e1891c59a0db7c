"""Provider inbound sources: Postmark (inbound JSON webhook, HTTP basic auth) and Mailgun
(routes `forward()` form, HMAC signature), DESIGN.md sections 7 and 10.

Each source does three things and hands the rest to the relay's `Ingestor` (ledger insert +
workflow start, shared with `/v1/inbound/standard`):

1. authenticate before anything is stored (constant-time compares; 401 otherwise);
2. rebuild the raw RFC 5322 message the pipeline stores, minimises and extracts from;
3. name the delivery: tenant, mailbox and the provider's immutable delivery ID.

Delivery IDs
    Postmark: the payload's `MessageID` (Postmark's ID for the inbound message; a retried
    webhook POST carries the same one).
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
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email import policy as email_policy
from email.header import Header
from email.message import EmailMessage, MIMEPart
from email.parser import BytesHeaderParser, BytesParser
from email.utils import encode_rfc2231, formataddr, getaddresses
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import asyncpg
from email_validator import EmailNotValidError, validate_email
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from inboxcrm.config import Settings
from inboxcrm.policy import UnknownTenant, get_policy, tenant_for_mailbox
from inboxcrm.relay import _DELIVERY_ID, BadRequest, Delivery, Ingestor, _error, _ingest, read_body

log = logging.getLogger("inboxcrm.sources")

POSTMARK = "postmark"
MAILGUN = "mailgun"
MAX_FORM_PARTS = 1000
MAX_ATTACHMENTS = 100
MAX_HEADERS = 1000
_SMTP = email_policy.SMTP
_HEADER_NAME = re.compile(r"^[\x21-\x39\x3b-\x7e]{1,100}$")  # RFC 5322 ftext
_MEDIA_TYPE = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$")
_CONTENT_ID = re.compile(r"^[\x21-\x3b\x3d\x3f-\x7e]{1,250}$")  # printable, no < >
_LINE_BREAKS = re.compile(r"[\r\n]+[ \t]*")
_ADDRESS_HEADERS = frozenset({
    "from", "to", "cc", "bcc", "reply-to", "sender", "resent-from", "resent-to", "resent-cc",
    "resent-sender",
})
# Headers of the original body structure: the rebuilt body brings its own.
_BODY_HEADERS = frozenset({"content-type", "content-transfer-encoding", "mime-version",
                           "content-length"})


class Unauthenticated(Exception):
    """Answered 401; the message is logged, never returned."""


class TooLarge(Exception):
    """The rebuilt message exceeds the size limit: answered 413."""


# ---------------------------------------------------------------- authentication

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


def mailgun_signature(signing_key: str, timestamp: str, token: str) -> str:
    """Mailgun's webhook signature: hex HMAC-SHA256(signing key, timestamp + token)."""
    return hmac.new(signing_key.encode(), (timestamp + token).encode(),
                    hashlib.sha256).hexdigest()


def verify_mailgun(form: Form, signing_key: str | None, tolerance_seconds: int,
                   now: float | None = None) -> tuple[str, int]:
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


# ---------------------------------------------------------------- tenant and mailbox

def _normalise(address: str) -> str | None:
    """The address as tenant policies store mailboxes (see inboxcrm.policy), or None."""
    if not isinstance(address, str) or not address.strip() or len(address) > 320:
        return None
    try:
        result = validate_email(address.strip(), check_deliverability=False,
                                test_environment=True, allow_display_name=False,
                                allow_quoted_local=False, allow_domain_literal=False)
    except (EmailNotValidError, ValueError, UnicodeError):
        return None
    return str(result.normalized).lower()


def _variants(address: str) -> list[str]:
    """The address, then without a `+tag` (Postmark's MailboxHash, Mailgun plus addressing)."""
    normalised = _normalise(address)
    if normalised is None:
        return []
    local, _, domain = normalised.rpartition("@")
    if "+" in local:
        return [normalised, f"{local.split('+', 1)[0]}@{domain}"]
    return [normalised]


def resolve_mailbox(candidates: Iterable[str | None], tenant: str | None) -> tuple[str, str]:
    """(tenant, mailbox): the first recipient that the tenant's policy lists (with `tenant`)
    or that some tenant's policy lists. Raises BadRequest (422) naming the problem."""
    addresses = [v for c in candidates if c for v in _variants(c)]
    if tenant is not None:
        try:
            policy = get_policy(tenant)
        except UnknownTenant:
            raise BadRequest("unknown tenant in query parameter 'tenant'") from None
        for address in addresses:
            if address in policy.mailboxes:
                return tenant, address
        raise BadRequest("no recipient of this message is one of the tenant's mailboxes")
    for address in addresses:
        owner = tenant_for_mailbox(address)
        if owner is not None:
            return owner, address
    raise BadRequest("unknown mailbox: no tenant policy lists a recipient of this message "
                     "(pass ?tenant= or add the mailbox to a tenant policy)")


# ---------------------------------------------------------------- message rebuilding

@dataclass(frozen=True)
class Attachment:
    filename: str
    content_type: str
    data: bytes
    content_id: str | None = None


def _clean(text: str) -> str:
    """Text safe to encode: undecodable bytes (surrogate escapes) replaced."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeError:
        return text.encode("utf-8", "replace").decode("utf-8", "replace")


def _one_line(value: str) -> str:
    """A header value on one line: no CR/LF can smuggle in another header."""
    return _LINE_BREAKS.sub(" ", _clean(value)).replace("\x00", "").strip()


def _format_address(name: str, address: str) -> str:
    name, address = _one_line(name or ""), _one_line(address)
    try:
        return formataddr((name, address), charset="utf-8")
    except UnicodeError:  # a non-ASCII address (RFC 6532): kept as UTF-8
        # formataddr quotes/encodes the name; " <a>" (4 characters) is cut off again
        return f"{formataddr((name, 'a'), charset='utf-8')[:-4]} <{address}>" if name else address


def _address_value(value: str) -> str:
    """An address header's value; non-ASCII display names RFC 2047-encoded."""
    if value.isascii():
        return value
    pairs = getaddresses([value])
    if not pairs or any(not addr for _, addr in pairs):
        return value  # not parseable as addresses: kept (as UTF-8)
    return ", ".join(_format_address(name, addr) for name, addr in pairs)


def header_line(name: str, value: str) -> bytes:
    value = _one_line(value)
    if not value.isascii():
        if name.lower() in _ADDRESS_HEADERS:
            value = _address_value(value)
        else:
            value = Header(value, "utf-8", header_name=name).encode(linesep="\r\n")
    return f"{name}: {value}\r\n".encode()


def _text_part(text: str, subtype: str) -> bytes:
    part = MIMEPart(policy=_SMTP)
    part.set_content(_clean(text), subtype=subtype, charset="utf-8", cte="quoted-printable")
    return part.as_bytes(policy=_SMTP)


def _param(name: str, value: str) -> str:
    value = _one_line(value)
    if value.isascii():
        return '{}="{}"'.format(name, value.replace("\\", "\\\\").replace('"', '\\"'))
    return f"{name}*={encode_rfc2231(value, 'utf-8')}"


def _attachment_part(attachment: Attachment) -> bytes:
    media = attachment.content_type.split(";", 1)[0].strip().lower()
    if not _MEDIA_TYPE.match(media):
        media = "application/octet-stream"
    filename = attachment.filename or "attachment"
    inline = attachment.content_id is not None
    lines = [
        header_line("Content-Type", f"{media}; {_param('name', filename)}"),
        b"Content-Transfer-Encoding: base64\r\n",
        header_line("Content-Disposition",
                    f"{'inline' if inline else 'attachment'}; {_param('filename', filename)}"),
    ]
    if inline:
        lines.append(header_line("Content-ID", f"<{attachment.content_id}>"))
    body = base64.encodebytes(attachment.data).replace(b"\n", b"\r\n")
    return b"".join(lines) + b"\r\n" + body


def _multipart(subtype: str, parts: list[bytes]) -> bytes:
    """A multipart entity with a boundary derived from its content (deterministic, and
    '=_' never starts a line of quoted-printable or base64 content)."""
    digest = hashlib.sha256(b"\x00".join(parts)).hexdigest()[:32]
    boundary = f"=_inboxcrm_{subtype}_{digest}".encode()
    out = [b'Content-Type: multipart/' + subtype.encode() + b'; boundary="' + boundary
           + b'"\r\n\r\n']
    for part in parts:
        out += [b"--" + boundary + b"\r\n", part if part.endswith(b"\r\n") else part + b"\r\n"]
    out.append(b"--" + boundary + b"--\r\n")
    return b"".join(out)


def build_message(headers: list[tuple[str, str]], text: str | None, html: str | None,
                  attachments: list[Attachment]) -> bytes:
    """An RFC 5322 message: `headers` in order, then a MIME body of the text and HTML
    versions (multipart/alternative when both) and the attachments (multipart/mixed).
    Deterministic: the same input gives the same bytes."""
    versions = []
    if text or not html:
        versions.append(_text_part(text or "", "plain"))
    if html:
        versions.append(_text_part(html, "html"))
    body = versions[0] if len(versions) == 1 else _multipart("alternative", versions)
    if attachments:
        body = _multipart("mixed", [body, *(_attachment_part(a) for a in attachments)])
    head = b"".join(header_line(name, value) for name, value in headers)
    return head + b"MIME-Version: 1.0\r\n" + body


def _check_header_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _HEADER_NAME.match(name):
        raise BadRequest(f"{where} is not a valid header name")
    return name


def _first(headers: list[tuple[str, str]], name: str) -> str | None:
    wanted = name.lower()
    return next((value for key, value in headers if key.lower() == wanted), None)


def _addresses(headers: list[tuple[str, str]], *names: str) -> list[str]:
    wanted = {n.lower() for n in names}
    values = [_one_line(value) for key, value in headers if key.lower() in wanted]
    return [addr for _, addr in getaddresses(values) if addr]


# ---------------------------------------------------------------- Postmark

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
        name = _check_header_name(entry.get("Name"), f"field 'Headers[{i}].Name'")
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
        if cid is not None and not _CONTENT_ID.match(cid):
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
        rebuilt.append(("From", _format_address(name if isinstance(name, str) else "",
                                                from_full["Email"])))
    else:
        rebuilt.append(("From", from_plain or ""))
    for field_name, full_name in (("To", "ToFull"), ("Cc", "CcFull")):
        full = _recipients(payload, full_name)
        plain = _opt_str(payload, field_name)
        if full:
            rebuilt.append((field_name, ", ".join(_format_address(n, a) for n, a in full)))
        elif plain:
            rebuilt.append((field_name, plain))
    for field_name, header in (("ReplyTo", "Reply-To"), ("Subject", "Subject"),
                               ("Date", "Date")):
        value = _opt_str(payload, field_name)
        if value is not None and (value or header == "Subject"):
            rebuilt.append((header, value))
    if _first(provider_headers, "Message-ID") is None:
        rebuilt.append(("Message-ID", f"<{payload['MessageID']}@postmark.inboxcrm.invalid>"))
    rebuilt_names = {name.lower() for name, _ in rebuilt} | {"bcc"}
    kept = [(n, v) for n, v in provider_headers
            if n.lower() not in rebuilt_names and n.lower() not in _BODY_HEADERS]
    return build_message(kept + rebuilt, _opt_str(payload, "TextBody"),
                         _opt_str(payload, "HtmlBody"), _postmark_attachments(payload))


def parse_postmark(payload: Any, tenant: str | None, max_raw_bytes: int) -> Delivery:
    if not isinstance(payload, dict):
        raise BadRequest("body must be a JSON object (a Postmark inbound message)")
    record_type = payload.get("RecordType")
    if record_type is not None and record_type != "Inbound":
        raise BadRequest("field 'RecordType' marks an outbound-event webhook (delivery, "
                         "bounce, ...), not an inbound message")
    message_id = payload.get("MessageID")
    if not isinstance(message_id, str) or not message_id:
        raise BadRequest("field 'MessageID' is required and must be a non-empty string")
    if not _DELIVERY_ID.match(message_id):
        raise BadRequest("field 'MessageID' must be 1-255 printable ASCII characters")
    candidates: list[str | None] = [_opt_str(payload, "OriginalRecipient")]
    for name in ("ToFull", "CcFull", "BccFull"):
        candidates += [address for _, address in _recipients(payload, name)]
    tenant, mailbox = resolve_mailbox(candidates, tenant)
    raw = postmark_raw(payload)
    if len(raw) > max_raw_bytes:
        raise TooLarge(f"message exceeds {max_raw_bytes} bytes")
    return Delivery(tenant, POSTMARK, mailbox, message_id, raw)


# ---------------------------------------------------------------- Mailgun

@dataclass(frozen=True)
class Upload:
    filename: str
    content_type: str
    data: bytes


@dataclass
class Form:
    fields: dict[str, list[str]] = field(default_factory=dict)
    files: dict[str, list[Upload]] = field(default_factory=dict)

    def get(self, name: str) -> str | None:
        values = self.fields.get(name)
        return values[0] if values else None

    def file(self, name: str) -> Upload | None:
        values = self.files.get(name)
        return values[0] if values else None


def parse_form(content_type: str | None, body: bytes) -> Form:
    """application/x-www-form-urlencoded or multipart/form-data (what Mailgun posts), with
    the standard library only. Text values keep undecodable bytes as surrogate escapes."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    form = Form()
    if media == "application/x-www-form-urlencoded":
        try:
            pairs = parse_qsl(body.decode("utf-8", "surrogateescape"), keep_blank_values=True,
                              errors="surrogateescape", max_num_fields=MAX_FORM_PARTS)
        except ValueError:
            raise BadRequest(f"form has more than {MAX_FORM_PARTS} fields") from None
        for name, value in pairs:
            form.fields.setdefault(name, []).append(value)
        return form
    if media != "multipart/form-data":
        raise BadRequest("body must be a Mailgun route forward() form "
                         "(application/x-www-form-urlencoded or multipart/form-data)")
    try:
        head = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1")
        message = BytesParser(policy=email_policy.HTTP).parsebytes(head + body)
        if not message.is_multipart() or message.get_boundary() is None:
            raise BadRequest("multipart/form-data body without a boundary or parts")
        if not isinstance(message, EmailMessage):
            raise BadRequest("malformed multipart/form-data body")
        parts = list(message.iter_parts())
        if len(parts) > MAX_FORM_PARTS:
            raise BadRequest(f"form has more than {MAX_FORM_PARTS} parts")
        for part in parts:
            part_name = part.get_param("name", header="content-disposition")
            if not isinstance(part_name, str) or part.is_multipart():
                continue
            payload = part.get_payload(decode=True)
            data = payload if isinstance(payload, bytes) else b""
            filename = part.get_filename()
            if filename is not None:
                upload = Upload(filename, part.get_content_type(), data)
                form.files.setdefault(part_name, []).append(upload)
            else:
                charset = part.get_content_charset() or "utf-8"
                try:
                    text = data.decode(charset, "surrogateescape")
                except LookupError:
                    text = data.decode("utf-8", "surrogateescape")
                form.fields.setdefault(part_name, []).append(text)
    except BadRequest:
        raise
    except (ValueError, TypeError, LookupError, IndexError, AttributeError):
        raise BadRequest("malformed multipart/form-data body") from None
    return form


def _message_headers(value: str) -> list[tuple[str, str]]:
    problem = "field 'message-headers' must be a JSON list of [name, value] pairs"
    try:
        parsed = json.loads(value)
    except ValueError:
        raise BadRequest(problem) from None
    if not isinstance(parsed, list) or len(parsed) > MAX_HEADERS:
        raise BadRequest(problem)
    out = []
    for i, pair in enumerate(parsed):
        if (not isinstance(pair, list) or len(pair) != 2
                or not isinstance(pair[1], str)):
            raise BadRequest(problem)
        out.append((_check_header_name(pair[0], f"field 'message-headers[{i}]' name"), pair[1]))
    return out


def _mailgun_attachments(form: Form) -> list[Attachment]:
    cids: dict[str, str] = {}
    if form.get("content-id-map"):
        try:
            mapping = json.loads(form.get("content-id-map") or "{}")
        except ValueError:
            raise BadRequest("field 'content-id-map' must be a JSON object") from None
        if not isinstance(mapping, dict):
            raise BadRequest("field 'content-id-map' must be a JSON object")
        for cid, key in mapping.items():
            cid = str(cid).strip().strip("<>")
            if isinstance(key, str) and cid and _CONTENT_ID.match(cid):
                cids[key] = cid
    count_text = form.get("attachment-count") or "0"
    if not count_text.isdigit() or int(count_text) > MAX_ATTACHMENTS:
        raise BadRequest(f"field 'attachment-count' must be a number up to {MAX_ATTACHMENTS}")
    out = []
    for i in range(1, int(count_text) + 1):
        upload = form.file(f"attachment-{i}")
        if upload is not None:
            out.append(Attachment(_clean(upload.filename).rsplit("/", 1)[-1] or "attachment",
                                  upload.content_type, upload.data,
                                  cids.get(f"attachment-{i}")))
    return out


def mailgun_delivery_id(message_id: str | None, raw: bytes) -> str:
    """The Message-Id without angle brackets; see the module docstring for the fallbacks."""
    if message_id:
        value = _LINE_BREAKS.sub(" ", message_id).strip()
        if value.startswith("<") and value.endswith(">"):
            value = value[1:-1].strip()
        if value and _DELIVERY_ID.match(value):
            return value
        if value:
            digest = hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()
            return f"mid-sha256-{digest}"
    return f"sha256-{hashlib.sha256(raw).hexdigest()}"


def parse_mailgun(form: Form, tenant: str | None, max_raw_bytes: int) -> Delivery:
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
        if _first(headers, "From") is None:
            sender = form.get("from")
            if not sender:
                raise BadRequest("no From header in 'message-headers' and no 'from' field")
            headers.append(("From", sender))
        if _first(headers, "Subject") is None and form.get("subject") is not None:
            headers.append(("Subject", form.get("subject") or ""))
        kept = [(n, v) for n, v in headers if n.lower() not in _BODY_HEADERS]
        raw = build_message(kept, form.get("body-plain"), form.get("body-html"),
                            _mailgun_attachments(form))
    tenant, mailbox = resolve_mailbox([*recipients, *_addresses(headers, "To", "Cc")], tenant)
    if len(raw) > max_raw_bytes:
        raise TooLarge(f"message exceeds {max_raw_bytes} bytes")
    delivery_id = mailgun_delivery_id(_first(headers, "Message-ID"), raw)
    return Delivery(tenant, MAILGUN, mailbox, delivery_id, raw)


CONSUME_TOKEN = """
INSERT INTO webhook_replay_tokens (source, token, signed_at)
VALUES ($1, $2, to_timestamp($3))
ON CONFLICT (source, token) DO NOTHING
RETURNING true
"""

PRUNE_TOKENS = """
DELETE FROM webhook_replay_tokens
WHERE source = $1 AND signed_at < now() - make_interval(secs => $2)
"""

RELEASE_TOKEN = "DELETE FROM webhook_replay_tokens WHERE source = $1 AND token = $2"


async def consume_token(pool: asyncpg.Pool, source: str, token: str, signed_at: int,
                        keep_seconds: float) -> bool:
    """True the first time a token is seen. Tokens older than `keep_seconds` are pruned:
    their timestamps are outside the tolerance window, so they are rejected anyway."""
    async with pool.acquire() as conn:
        await conn.execute(PRUNE_TOKENS, source, keep_seconds)
        return bool(await conn.fetchval(CONSUME_TOKEN, source, token, float(signed_at)))


# ---------------------------------------------------------------- routes

def _tenant_param(request: Request) -> str | None:
    tenant = request.query_params.get("tenant")
    if tenant is not None and not tenant.strip():
        raise BadRequest("query parameter 'tenant' must not be empty")
    return tenant


def sources_router(settings: Settings) -> APIRouter:
    """POST /v1/inbound/postmark and POST /v1/inbound/mailgun[/mime]."""
    router = APIRouter()
    postmark_password = (settings.postmark_password.get_secret_value()
                         if settings.postmark_password else None)
    mailgun_key = (settings.mailgun_signing_key.get_secret_value()
                   if settings.mailgun_signing_key else None)
    if not settings.postmark_user or not postmark_password:
        log.warning("postmark source disabled: INBOXCRM_POSTMARK_USER/PASSWORD not set")
    if not mailgun_key:
        log.warning("mailgun source disabled: INBOXCRM_MAILGUN_SIGNING_KEY not set")

    @router.post("/v1/inbound/postmark")
    async def inbound_postmark(request: Request) -> JSONResponse:
        if not basic_auth_ok(request.headers.get("authorization"), settings.postmark_user,
                             postmark_password):
            _count_auth_failure(request, "postmark")
            response = _error(401, "invalid or missing credentials")
            response.headers["WWW-Authenticate"] = 'Basic realm="inboxcrm postmark"'
            return response
        body = await read_body(request, settings.max_body_bytes)
        if body is None:
            return _error(413, f"body exceeds {settings.max_body_bytes} bytes")
        try:
            payload = json.loads(body)
        except ValueError:
            return _error(422, "body is not valid JSON")
        try:
            delivery = parse_postmark(payload, _tenant_param(request), settings.max_body_bytes)
        except BadRequest as exc:
            return _error(422, str(exc))
        except TooLarge as exc:
            return _error(413, str(exc))
        return await _ingest(request, delivery)

    @router.post("/v1/inbound/mailgun")
    @router.post("/v1/inbound/mailgun/mime")
    async def inbound_mailgun(request: Request) -> JSONResponse:
        body = await read_body(request, settings.max_body_bytes)
        if body is None:
            return _error(413, f"body exceeds {settings.max_body_bytes} bytes")
        try:
            form = parse_form(request.headers.get("content-type"), body)
        except BadRequest as exc:
            return _error(422, str(exc))
        try:
            token, signed_at = verify_mailgun(form, mailgun_key,
                                              settings.mailgun_tolerance_seconds)
        except Unauthenticated as exc:
            log.info("mailgun request rejected: %s", exc)
            _count_auth_failure(request, "mailgun")
            return _error(401, "invalid, stale or missing Mailgun signature")
        try:
            delivery = parse_mailgun(form, _tenant_param(request), settings.max_body_bytes)
        except BadRequest as exc:
            return _error(422, str(exc))
        except TooLarge as exc:
            return _error(413, str(exc))
        ingestor: Ingestor = request.app.state.ingestor
        keep = 2 * settings.mailgun_tolerance_seconds + 60
        try:
            fresh = await consume_token(ingestor.pool, MAILGUN, token, signed_at, keep)
        except (TimeoutError, asyncpg.PostgresError, OSError):
            return _error(503, "ledger unavailable; retry later")
        if not fresh:
            log.info("mailgun request rejected: token replayed")
            _count_auth_failure(request, "mailgun")
            return _error(401, "invalid, stale or missing Mailgun signature (token replayed)")
        response = await _ingest(request, delivery)
        if response.status_code == 503:
            # Not (or not fully) processed: let the very same POST be retried.
            with contextlib.suppress(TimeoutError, asyncpg.PostgresError, OSError):
                await ingestor.pool.execute(RELEASE_TOKEN, MAILGUN, token)
        return response

    return router


# ---------------------------------------------------------------- local stack credentials

CREDENTIALS_FILE = "inbound-credentials.json"
_GENERATORS: dict[str, Callable[[], str]] = {
    "INBOXCRM_POSTMARK_USER": lambda: f"postmark-{secrets.token_hex(4)}",
    "INBOXCRM_POSTMARK_PASSWORD": lambda: secrets.token_urlsafe(32),
    "INBOXCRM_MAILGUN_SIGNING_KEY": lambda: secrets.token_hex(32),
    "INBOXCRM_UNSUBSCRIBE_SECRET": lambda: secrets.token_urlsafe(32),
}


def generated_credentials(data_dir: Path) -> dict[str, str]:
    """Postmark basic-auth pair, Mailgun signing key and unsubscribe secret for the local
    stack: from the environment, else generated once per data directory (mode 0600 file
    in .data/, never in the repository)."""
    path = data_dir / CREDENTIALS_FILE
    stored: dict[str, str] = {}
    try:
        loaded = json.loads(path.read_text())
        if isinstance(loaded, dict):
            stored = {k: v for k, v in loaded.items() if isinstance(v, str) and v}
    except (OSError, ValueError):
        stored = {}
    if any(name not in stored for name in _GENERATORS):
        stored = {name: stored.get(name) or make() for name, make in _GENERATORS.items()}
        data_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(stored, handle, indent=2)
        try:
            os.link(tmp, path)  # first writer wins; a concurrent starter reads its values
        except FileExistsError:
            try:
                loaded = json.loads(path.read_text())
                if isinstance(loaded, dict) and all(
                        isinstance(loaded.get(n), str) for n in _GENERATORS):
                    stored = loaded
                else:
                    os.replace(tmp, path)
            except (OSError, ValueError):
                os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
    return {name: os.environ.get(name) or stored[name] for name in _GENERATORS}


def _count_auth_failure(request: Request, source: str) -> None:
    """Every source feeds the same signature-failure metric (and its spike alert)."""
    request.app.state.metrics.signature_failures.labels(source).inc()
