"""Rebuilding the raw RFC 5322 message from a provider's parsed payload (Postmark JSON,
Mailgun form): the header list kept in order, text and HTML as multipart/alternative,
attachments as multipart/mixed, no random MIME boundary (a retried POST rebuilds the same
bytes, so its derived delivery ID is the same)."""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from email import policy as email_policy
from email.header import Header
from email.message import MIMEPart
from email.utils import encode_rfc2231, formataddr, getaddresses
from typing import Any

from inboxcrm.ingress.intake import BadRequest

MAX_FORM_PARTS = 1000
MAX_ATTACHMENTS = 100
MAX_HEADERS = 1000
_SMTP = email_policy.SMTP
_HEADER_NAME = re.compile(r"^[\x21-\x39\x3b-\x7e]{1,100}$")  # RFC 5322 ftext
_MEDIA_TYPE = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$")
CONTENT_ID = re.compile(r"^[\x21-\x3b\x3d\x3f-\x7e]{1,250}$")  # printable, no < >
LINE_BREAKS = re.compile(r"[\r\n]+[ \t]*")
_ADDRESS_HEADERS = frozenset({
    "from", "to", "cc", "bcc", "reply-to", "sender", "resent-from", "resent-to", "resent-cc",
    "resent-sender",
})
# Headers of the original body structure: the rebuilt body brings its own.
BODY_HEADERS = frozenset({"content-type", "content-transfer-encoding", "mime-version",
                           "content-length"})



@dataclass(frozen=True)
class Attachment:
    filename: str
    content_type: str
    data: bytes
    content_id: str | None = None


def clean_text(text: str) -> str:
    """Text safe to encode: undecodable bytes (surrogate escapes) replaced."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeError:
        return text.encode("utf-8", "replace").decode("utf-8", "replace")


def _one_line(value: str) -> str:
    """A header value on one line: no CR/LF can smuggle in another header."""
    return LINE_BREAKS.sub(" ", clean_text(value)).replace("\x00", "").strip()


def format_address(name: str, address: str) -> str:
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
    return ", ".join(format_address(name, addr) for name, addr in pairs)


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
    part.set_content(clean_text(text), subtype=subtype, charset="utf-8", cte="quoted-printable")
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


def check_header_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _HEADER_NAME.match(name):
        raise BadRequest(f"{where} is not a valid header name")
    return name


def first_header(headers: list[tuple[str, str]], name: str) -> str | None:
    wanted = name.lower()
    return next((value for key, value in headers if key.lower() == wanted), None)


def header_addresses(headers: list[tuple[str, str]], *names: str) -> list[str]:
    wanted = {n.lower() for n in names}
    values = [_one_line(value) for key, value in headers if key.lower() in wanted]
    return [addr for _, addr in getaddresses(values) if addr]


# ---------------------------------------------------------------- Postmark

