"""A form read as it streams in, with hard limits (docs/architecture.md §7).

Mailgun's signature travels inside the form, so the form must be read before the request can
be authenticated. It is therefore read by this incremental parser, chunk by chunk as the body
arrives, never as a whole: each chunk costs time linear in its size (`bytes.find` for the
boundary, no recursion, no backtracking), so a hostile body cannot hold the event loop, and
every limit is applied while reading, before the work it bounds:

- total size (Content-Length checked first, then a running count): `FormTooLarge` (413);
- part size: `FormTooLarge` (413);
- number of fields (parts or `&`-separated pairs): `BadRequest` (422);
- header lines per part and their length: `BadRequest`;
- a nested multipart part (`Content-Type: multipart/...` inside the form): `BadRequest`.

Nothing is interpreted beyond the part headers (name, filename, content type) until the
caller has checked the signature: values stay bytes in `RawForm` and are decoded by
`RawForm.to_form()`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import quopri
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from email.message import Message
from email.utils import collapse_rfc2231_value
from urllib.parse import parse_qsl

from inboxcrm.ingress.intake import BadRequest

URLENCODED = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
# Field values are decoded with the charset their part names, from this list only; anything
# else is read as UTF-8 (undecodable bytes kept as surrogate escapes).
CHARSETS = frozenset({"utf-8", "utf8", "us-ascii", "ascii", "iso-8859-1", "latin-1",
                      "latin1", "windows-1252", "cp1252"})
# parse_qsl of a large urlencoded body runs in a thread, a small one inline.
THREAD_PARSE_BYTES = 256 * 1024


class FormTooLarge(Exception):
    """The form (or one part) exceeds its size limit: answered 413."""


@dataclass(frozen=True)
class FormLimits:
    total_bytes: int
    max_fields: int = 1000
    part_bytes: int | None = None        # None: the total limit
    header_line_bytes: int = 1024
    headers_per_part: int = 16

    @property
    def part_limit(self) -> int:
        return self.part_bytes if self.part_bytes is not None else self.total_bytes


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


@dataclass
class RawPart:
    name: str
    filename: str | None
    content_type: str
    charset: str | None
    transfer_encoding: str | None
    data: bytearray = field(default_factory=bytearray)


def _decode_text(data: bytes, charset: str | None) -> str:
    wanted = (charset or "utf-8").lower()
    return data.decode(wanted if wanted in CHARSETS else "utf-8", "surrogateescape")


@dataclass
class RawForm:
    """What was read, still bytes: the caller authenticates, then decodes."""

    parts: list[RawPart] = field(default_factory=list)
    pairs: list[tuple[str, str]] = field(default_factory=list)

    def to_form(self) -> Form:
        form = Form()
        for name, value in self.pairs:
            form.fields.setdefault(name, []).append(value)
        for part in self.parts:
            data = bytes(part.data)
            try:
                if part.transfer_encoding == "base64":
                    data = base64.b64decode(data)
                elif part.transfer_encoding == "quoted-printable":
                    data = quopri.decodestring(data)
            except (binascii.Error, ValueError):
                raise BadRequest(f"form field '{part.name}' has a malformed transfer "
                                 "encoding") from None
            if part.filename is not None:
                form.files.setdefault(part.name, []).append(
                    Upload(part.filename, part.content_type, data))
            else:
                form.fields.setdefault(part.name, []).append(_decode_text(data, part.charset))
        return form


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _header_params(name: str, value: str) -> Message:
    """A one-header message, for the standard library's parameter parsing (RFC 2231 too);
    `value` is at most one bounded header line."""
    message = Message()
    message[name] = value
    return message


class MultipartReader:
    """multipart/form-data, fed chunk by chunk (see the module docstring)."""

    PREAMBLE, AFTER_DELIMITER, HEADERS, BODY, EPILOGUE = range(5)

    def __init__(self, boundary: str, limits: FormLimits) -> None:
        if not boundary or len(boundary) > 70 or not boundary.isascii():
            raise BadRequest("multipart/form-data body without a valid boundary")
        self.limits = limits
        self.delimiter = b"\r\n--" + boundary.encode("ascii")
        # The first delimiter may open the body: read as if a line break preceded it.
        self.buffer = bytearray(b"\r\n")
        self.state = self.PREAMBLE
        self.total = 0
        self.form = RawForm()
        self.headers: list[str] = []
        self.part: RawPart | None = None

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.total > self.limits.total_bytes:
            raise FormTooLarge(f"body exceeds {self.limits.total_bytes} bytes")
        self.buffer += chunk
        while self._step():
            pass

    def close(self) -> RawForm:
        if self.state != self.EPILOGUE:
            raise BadRequest("malformed multipart/form-data body (no closing boundary)")
        return self.form

    # -- the state machine: each step consumes from the buffer or asks for more input
    def _step(self) -> bool:
        if self.state == self.PREAMBLE:
            return self._preamble()
        if self.state == self.AFTER_DELIMITER:
            return self._after_delimiter()
        if self.state == self.HEADERS:
            return self._header_line()
        if self.state == self.BODY:
            return self._body()
        self.buffer.clear()  # epilogue: counted, ignored
        return False

    def _preamble(self) -> bool:
        at = self.buffer.find(self.delimiter)
        if at < 0:
            keep = len(self.delimiter) - 1
            if len(self.buffer) > keep:
                del self.buffer[:len(self.buffer) - keep]
            return False
        del self.buffer[:at + len(self.delimiter)]
        self.state = self.AFTER_DELIMITER
        return True

    def _after_delimiter(self) -> bool:
        if len(self.buffer) < 2:
            return False
        if self.buffer.startswith(b"--"):
            self.state = self.EPILOGUE
            return True
        end = self.buffer.find(b"\r\n", 0, 80)
        if end < 0:
            if len(self.buffer) >= 80:
                raise BadRequest("malformed multipart/form-data body (boundary line)")
            return False
        if self.buffer[:end].strip(b" \t"):
            raise BadRequest("malformed multipart/form-data body (boundary line)")
        del self.buffer[:end + 2]
        if len(self.form.parts) >= self.limits.max_fields:
            raise BadRequest(f"form has more than {self.limits.max_fields} fields")
        self.headers = []
        self.state = self.HEADERS
        return True

    def _header_line(self) -> bool:
        end = self.buffer.find(b"\r\n", 0, self.limits.header_line_bytes + 2)
        if end < 0:
            if len(self.buffer) > self.limits.header_line_bytes:
                raise BadRequest(f"a form part header line exceeds "
                                 f"{self.limits.header_line_bytes} bytes")
            return False
        line = bytes(self.buffer[:end]).decode("utf-8", "surrogateescape")
        del self.buffer[:end + 2]
        if line:
            if line[0] in " \t" and self.headers:  # folded continuation
                self.headers[-1] += " " + line.strip()
                if len(self.headers[-1]) > self.limits.header_line_bytes:
                    raise BadRequest(f"a form part header line exceeds "
                                     f"{self.limits.header_line_bytes} bytes")
            else:
                self.headers.append(line)
            if len(self.headers) > self.limits.headers_per_part:
                raise BadRequest(f"a form part has more than {self.limits.headers_per_part} "
                                 "header lines")
            return True
        self.part = self._start_part(self.headers)
        self.state = self.BODY
        return True

    def _start_part(self, lines: list[str]) -> RawPart:
        headers: dict[str, str] = {}
        for line in lines:
            name, sep, value = line.partition(":")
            if not sep or not name.strip():
                raise BadRequest("malformed form part header")
            headers.setdefault(name.strip().lower(), value.strip())
        content_type = headers.get("content-type", "text/plain")
        media = _media_type(content_type)
        if media.startswith("multipart/"):
            raise BadRequest("nested multipart parts are not accepted in a form")
        disposition = _header_params("Content-Disposition",
                                     headers.get("content-disposition", ""))
        if disposition.get_content_disposition() != "form-data":
            raise BadRequest("a form part without 'Content-Disposition: form-data'")
        param = disposition.get_param("name", header="content-disposition")
        name = collapse_rfc2231_value(param) if param is not None else ""
        if not name or len(name) > 200:
            raise BadRequest("a form part without a valid name")
        filename = disposition.get_filename()
        charset = _header_params("Content-Type", content_type).get_content_charset()
        encoding = headers.get("content-transfer-encoding", "").strip().lower() or None
        part = RawPart(name, filename, media or "application/octet-stream", charset, encoding)
        self.form.parts.append(part)
        return part

    def _body(self) -> bool:
        assert self.part is not None
        at = self.buffer.find(self.delimiter)
        if at < 0:
            keep = len(self.delimiter) - 1
            take = len(self.buffer) - keep
            if take > 0:
                self._append(self.buffer[:take])
                del self.buffer[:take]
            return False
        self._append(self.buffer[:at])
        del self.buffer[:at + len(self.delimiter)]
        self.part = None
        self.state = self.AFTER_DELIMITER
        return True

    def _append(self, data: bytearray) -> None:
        assert self.part is not None
        if len(self.part.data) + len(data) > self.limits.part_limit:
            raise FormTooLarge(f"form field '{self.part.name}' exceeds "
                               f"{self.limits.part_limit} bytes")
        self.part.data += data


class UrlencodedReader:
    """application/x-www-form-urlencoded: the running size and field count are checked as
    the bytes arrive; the pairs are split once the body is complete (linear)."""

    def __init__(self, limits: FormLimits) -> None:
        self.limits = limits
        self.body = bytearray()
        self.separators = 0

    def feed(self, chunk: bytes) -> None:
        if len(self.body) + len(chunk) > self.limits.total_bytes:
            raise FormTooLarge(f"body exceeds {self.limits.total_bytes} bytes")
        self.separators += chunk.count(b"&")
        if self.separators >= self.limits.max_fields:
            raise BadRequest(f"form has more than {self.limits.max_fields} fields")
        self.body += chunk

    def close(self) -> RawForm:
        try:
            pairs = parse_qsl(bytes(self.body).decode("utf-8", "surrogateescape"),
                              keep_blank_values=True, errors="surrogateescape",
                              max_num_fields=self.limits.max_fields)
        except ValueError:
            raise BadRequest(f"form has more than {self.limits.max_fields} fields") from None
        return RawForm(pairs=pairs)


FormReader = MultipartReader | UrlencodedReader


def form_reader(content_type: str | None, limits: FormLimits) -> FormReader:
    """The reader for this request's media type; BadRequest for anything but a form."""
    media = _media_type(content_type)
    if media == URLENCODED:
        return UrlencodedReader(limits)
    if media == MULTIPART:
        if len(content_type or "") > limits.header_line_bytes:
            raise BadRequest("Content-Type header too long")
        boundary = _header_params("Content-Type", content_type or "").get_boundary()
        return MultipartReader(boundary or "", limits)
    raise BadRequest("body must be a Mailgun route forward() form "
                     "(application/x-www-form-urlencoded or multipart/form-data)")


async def read_form(content_type: str | None, content_length: str | None,
                    chunks: AsyncIterator[bytes], limits: FormLimits) -> RawForm:
    """Read a form as it arrives (see the module docstring). Raises FormTooLarge or
    BadRequest as soon as a limit is passed, without reading the rest."""
    if content_length and content_length.isdigit() and int(content_length) > limits.total_bytes:
        raise FormTooLarge(f"body exceeds {limits.total_bytes} bytes")
    reader = form_reader(content_type, limits)
    async for chunk in chunks:
        reader.feed(chunk)
    if isinstance(reader, UrlencodedReader) and len(reader.body) > THREAD_PARSE_BYTES:
        return await asyncio.to_thread(reader.close)
    return reader.close()


def parse_form_bytes(content_type: str | None, body: bytes, limits: FormLimits) -> RawForm:
    """The same reader over a body already in memory (tests, offline tools)."""
    reader = form_reader(content_type, limits)
    reader.feed(body)
    return reader.close()
