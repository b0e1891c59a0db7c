"""Minimisation: what any extractor (LLM or rules) is allowed to see of an inbound email.

The raw message is untrusted bytes. This module turns it into a small, bounded, decoded
record: the headers that matter, the body as plain text (HTML converted), quoted history
and reply chains stripped. It never raises on bad input: broken MIME, unknown charsets,
raw 8-bit headers, garbage bytes and oversized messages all produce a (possibly empty)
MinimisedMessage with flags saying what happened.

Nothing here logs; nothing here puts message content in an exception.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import re
import unicodedata
from collections import Counter
from datetime import datetime
from email import policy as email_policy
from email.message import Message
from email.utils import getaddresses, parsedate_to_datetime
from html.parser import HTMLParser

from pydantic import BaseModel, ConfigDict

from .limits import (
    MAX_HTML_CHARS,
    MAX_PARTS,
    MAX_RAW_BYTES,
    Budget,
    TooComplex,
    bounded_payload,
    cap_combining_runs,
    charset_allowed,
    declared_charset,
    parse_headers,
    parse_message,
    terminated_html,
    text_codec,
)
from .reports import Report, detect_report
from .signals import words
from .spam import MAX_SPAM_HEADERS, SPAM_HEADERS

# Headers the model sees (issue #4, item 2).
MODEL_HEADERS = (
    "From",
    "Reply-To",
    "Sender",
    "To",
    "Subject",
    "Auto-Submitted",
    "Precedence",
    "List-Id",
    "Content-Type",
)
# When the message was written (the CRM note's time) and the languages it names (the
# follow-up's): read here, in the work pool under the work budget, and stored with the
# extraction, so no later step parses the message again. In-Reply-To and References name
# the thread the message belongs to (migration 073).
REPLY_HEADERS = ("Date", "Content-Language", "Accept-Language", "In-Reply-To", "References")
# A thread's References grows with every message (the newest last): read further than the
# other routing headers, so a long thread keeps the IDs that name our follow-up.
THREAD_HEADER_CHARS = 4000
# Headers only deterministic code looks at (never shown to the model): the router's, and
# REPLY_HEADERS.
ROUTING_HEADERS = (
    "Return-Path",
    "X-Autoreply",
    "X-Autorespond",
    "X-Auto-Response-Suppress",
    "List-Unsubscribe",
    "List-Post",
    "List-Help",
    "List-Subscribe",
    "List-Owner",
    "List-Archive",
    "X-Failed-Recipients",
    # upstream spam verdicts and bulk-sender marks (docs/architecture.md §5)
    "X-Spam-Flag",
    "X-Spam-Status",
    "X-Spam-Score",
    "X-Spam_score",
    "X-Spam-Level",
    "X-Mailgun-Sflag",
    "X-Mailgun-Sscore",
    "X-PM-Spam-Score",
    "Feedback-ID",
    "X-CSA-Complaints",
    "X-Campaign",
    "X-Campaign-ID",
    "X-Mailer",
    "X-MC-User",
    "X-Mailchimp-Campaign",
    "X-SG-EID",
    "X-Report-Abuse",
    "X-Mailgun-Tag",
    "Cc",
) + REPLY_HEADERS
# Trace headers the sender authentication reads (every occurrence, in order: the topmost
# is the one the receiving boundary added last).
AUTH_HEADERS = (
    "Authentication-Results",
    "Received-SPF",
    "X-Mailgun-Spf",
    "X-Mailgun-Dkim-Check-Result",
    "X-Envelope-From",
    "Return-Path",
    "DKIM-Signature",
)
MAX_AUTH_HEADERS = 40

MAX_TEXT_CHARS = 200_000  # text considered for quote stripping
MAX_TEXT_LINES = 3000  # lines considered for quote stripping (blank runs squeezed first)
MAX_HEADER_CHARS = 1000
MAX_ADDRESS_HEADERS = 20  # occurrences of one address header that are read
MAX_RAW_HEADER_CHARS = 8000
MAX_ADDRESSES = 50
MAX_HIDDEN_CHARS = 4000


class Mailbox(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    address: str


class MinimisedMessage(BaseModel):
    """The bounded, decoded view of one message."""

    model_config = ConfigDict(frozen=True)

    headers: dict[str, str]  # MODEL_HEADERS present in the message, decoded, bounded
    routing_headers: dict[str, str]  # ROUTING_HEADERS present, decoded, bounded
    from_addrs: list[Mailbox] = []
    reply_to: list[Mailbox] = []
    sender: list[Mailbox] = []
    to: list[Mailbox] = []
    cc: list[Mailbox] = []
    auth_headers: list[tuple[str, str]] = []  # AUTH_HEADERS occurrences, topmost first
    spam_headers: list[tuple[str, str]] = []  # spam.SPAM_HEADERS occurrences, topmost first
    from_header_count: int = 0
    content_type: str = "text/plain"
    body: str = ""  # own text, then (if any) the forwarded block
    own_text_chars: int = 0  # body[:own_text_chars] is the writer's own text
    forwarded: bool = False
    forwarded_from: list[Mailbox] = []
    quoted_removed: bool = False
    truncated: bool = False
    is_html_only: bool = False
    has_report_part: bool = False
    report: Report | None = None  # a delivery-status, feedback or bounce report
    hidden_text: str = ""  # HTML text hidden from the reader (scanned, never shown)
    defects: int = 0
    raw_size: int = 0
    parse_failed: bool = False
    # the structural limit that stopped the parse (parts, depth, headers): only the top
    # header fields were read, and the message goes to review as `too_complex`
    too_complex: str | None = None
    # limits that cut or replaced something without stopping the parse (charset, html,
    # text): said on the review card, never a reason on their own
    limits_hit: list[str] = []

    @property
    def own_text(self) -> str:
        return self.body[: self.own_text_chars]

    @property
    def forwarded_text(self) -> str:
        return self.body[self.own_text_chars :]

    @property
    def subject(self) -> str:
        return self.headers.get("Subject", "")

    def header_text(self) -> str:
        return "\n".join(f"{name}: {self.headers[name]}" for name in MODEL_HEADERS
                         if name in self.headers)

    def as_text(self) -> str:
        """Exactly what a model is shown; evidence must occur in this text."""
        return f"{self.header_text()}\n\n{self.body}"


# --------------------------------------------------------------------------- decoding

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SURROGATES = re.compile(r"[\udc80-\udcff]")
# RFC 2047 (with RFC 2231's `*language`): the charset stops at `*`, `?` or a space, so a
# failed match is given up at once (`=?***…` made the lazy form backtrack quadratically).
_ENCODED_WORD = re.compile(r"=\?([^?\s*]{1,64})(?:\*[^?\s*]{0,64})?\?([QqBb])\?([^?\s]*)\?=")
_HEX = re.compile(rb"=([0-9A-Fa-f]{2})")


def decode_bytes(data: bytes, charset: str | None = None) -> str:
    """Bytes to text: the declared charset if it is on the allow-list and works
    (`limits.text_codec`), else UTF-8, else cp1252/latin-1. Never raises."""
    candidates: list[str] = []
    declared = text_codec(charset)
    if declared:
        candidates.append(declared)
    candidates.append("utf-8")
    for name in candidates:
        try:
            return data.decode(name)
        except (UnicodeError, LookupError, ValueError):
            continue
    if declared and declared != "utf-8":
        # a real multi-byte charset with a few broken bytes: keep what decodes
        try:
            return data.decode(declared, errors="replace")
        except (UnicodeError, LookupError, ValueError):
            pass
    try:
        return data.decode("cp1252")  # undeclared or mislabelled 8-bit Western text
    except UnicodeError:
        return data.decode("latin-1")


def _recover_8bit(value: str) -> str:
    """The email parser keeps raw 8-bit header bytes as surrogate escapes; decode them."""
    if not _SURROGATES.search(value):
        return value
    try:
        data = value.encode("utf-8", errors="surrogateescape")
    except UnicodeError:
        return _SURROGATES.sub("\ufffd", value)
    return decode_bytes(data)


def _decode_encoded_word(match: re.Match[str]) -> str:
    charset, encoding, text = match.group(1), match.group(2).upper(), match.group(3)
    try:
        if encoding == "B":
            padded = text + "=" * (-len(text) % 4)
            data = base64.b64decode(padded.encode("ascii", errors="ignore"), validate=False)
        else:
            raw = text.replace("_", " ").encode("utf-8", errors="replace")
            data = _HEX.sub(lambda m: bytes([int(m.group(1), 16)]), raw)
    except (binascii.Error, ValueError):
        return match.group(0)
    return decode_bytes(data, charset)


# A message-ID as RFC 5322 writes it (`<left@right>`), bounded as the IMAP reader reads one.
_THREAD_ID = re.compile(r"<[^<>\s]{1,993}>")
# At most this many IDs of a thread are kept: the newest (the end of References, then
# In-Reply-To), which name the messages this one answers.
MAX_THREAD_REFS = 20


def thread_refs(references: object, in_reply_to: object) -> list[str]:
    """The message-IDs a message names as its thread: References (oldest first) then any
    In-Reply-To ID not among them; the newest MAX_THREAD_REFS. Never raises."""
    found: list[str] = []
    for value in (references, in_reply_to):
        if isinstance(value, str):
            for ref in _THREAD_ID.findall(value):
                if ref not in found:
                    found.append(ref)
    return found[-MAX_THREAD_REFS:]


def date_written(value: object) -> datetime | None:
    """A `Date` header as an aware datetime; None when it is missing, unparsable or has no
    time zone (whether it is plausible is the reader's question)."""
    try:
        written = parsedate_to_datetime(str(value)) if value else None
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return written if written is not None and written.tzinfo is not None else None


def decode_header_value(raw: object, limit: int = MAX_HEADER_CHARS) -> str:
    """RFC 2047 encoded words, raw 8-bit bytes, folding and control characters handled.
    Never raises."""
    try:
        value = raw if isinstance(raw, str) else str(raw)
    except Exception:  # an exotic header object whose str() fails
        return ""
    value = _recover_8bit(value[:MAX_RAW_HEADER_CHARS])
    value = re.sub(r"\r?\n[ \t]*", " ", value)
    out: list[str] = []
    pos = 0
    previous_was_word = False
    for match in _ENCODED_WORD.finditer(value):
        between = value[pos : match.start()]
        if not (previous_was_word and not between.strip()):
            out.append(between)
        out.append(_decode_encoded_word(match))
        pos = match.end()
        previous_was_word = True
    out.append(value[pos:])
    text = _CONTROL.sub(" ", "".join(out)).replace("\r", " ").replace("\n", " ")
    text = unicodedata.normalize("NFC", cap_combining_runs(text)).strip()
    return text[:limit]


def _parse_mailboxes(raw_values: list[str]) -> list[Mailbox]:
    """The addresses of one header's occurrences: at most MAX_ADDRESS_HEADERS of them and
    MAX_RAW_HEADER_CHARS together (the stdlib address parser costs ~3 µs a character)."""
    out: list[Mailbox] = []
    budget = MAX_RAW_HEADER_CHARS
    for raw in raw_values[:MAX_ADDRESS_HEADERS]:
        if budget <= 0:
            break
        raw = raw[:budget]
        budget -= len(raw)
        value = re.sub(r"\r?\n[ \t]*", " ", _recover_8bit(raw))
        try:
            pairs = getaddresses([value])
        except Exception:  # the stdlib parser on adversarial input
            pairs = []
        for name, address in pairs:
            address = _CONTROL.sub("", address).strip().strip("<>").strip()
            if "@" not in address or len(address) > 320:
                continue
            out.append(
                Mailbox(name=decode_header_value(name, 200), address=unicodedata.normalize(
                    "NFC", address))
            )
            if len(out) >= MAX_ADDRESSES:
                return out
    return out


# MinimisedMessage's address fields and the headers they are read from.
_ADDRESS_FIELDS = (("from_addrs", "from"), ("reply_to", "reply-to"), ("sender", "sender"),
                   ("to", "to"), ("cc", "cc"))


def _address_fields(raw_headers: dict[str, list[str]]) -> dict[str, list[Mailbox]]:
    return {field: _parse_mailboxes(raw_headers.get(header, []))
            for field, header in _ADDRESS_FIELDS}


def clean_text(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    text = _SURROGATES.sub("\ufffd", text)
    return unicodedata.normalize("NFC", cap_combining_runs(text))


# --------------------------------------------------------------------------- HTML

_BLOCK_TAGS = words(
    "p div br tr li h1 h2 h3 h4 h5 h6 table section article header footer pre hr ul ol dl "
    "dt dd address center form fieldset td th tbody thead title caption"
)
_SKIP_TAGS = words("script style head template noscript svg object iframe math")
_VOID_TAGS = words(
    "br hr img input meta link area base col embed param source track wbr"
)
_HIDDEN_STYLE = re.compile(
    r"display\s*:\s*none|visibility\s*:\s*hidden|font-size\s*:\s*0(?![.\d]*[1-9])|"
    r"opacity\s*:\s*0(?![.\d]*[1-9])|max-height\s*:\s*0(?![.\d]*[1-9])|"
    r"(?<![-\w])color\s*:\s*(?:#fff\b|#ffffff\b|white\b|transparent\b)",
    re.IGNORECASE,
)


class _HTMLToText(HTMLParser):
    """Visible text of an HTML body. Script/style dropped; blockquotes (quoted replies)
    dropped; text hidden with CSS collected separately so it can be scanned for
    instructions but is never shown to a model."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden: list[str] = []
        self.hidden_chars = 0
        self.stack: list[tuple[str, bool, bool, bool]] = []  # tag, skip, hidden, quote
        self.open_tags: Counter[str] = Counter()  # the stack's tags: an O(1) end-tag check
        self.skip = 0
        self.hidden_depth = 0
        self.quote = 0
        self.pre = 0
        self.quoted_removed = False
        self.pending_mailto = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        tag = tag.lower()
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")
        if tag in _VOID_TAGS or len(self.stack) > 500:
            return
        attributes = {k.lower(): (v or "") for k, v in attrs}
        skip = tag in _SKIP_TAGS
        hidden = "hidden" in attributes or bool(_HIDDEN_STYLE.search(attributes.get("style", "")))
        quote = tag == "blockquote"
        if tag == "a":
            href = attributes.get("href", "").strip()
            if href.lower().startswith("mailto:"):
                address = href[7:].split("?", 1)[0].strip()
                if address:
                    self.pending_mailto = address
        self.stack.append((tag, skip, hidden, quote))
        self.open_tags[tag] += 1
        self.skip += skip
        self.hidden_depth += hidden
        self.quote += quote
        if tag == "pre":
            self.pre += 1

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag.lower() in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        tag = tag.lower()
        if tag == "a" and self.pending_mailto:
            # show a mailto target the link text hides, so readers and checks see it
            address, self.pending_mailto = self.pending_mailto, ""
            if not (self.skip or self.hidden_depth or self.quote) and address.lower() not in \
                    "".join(self.parts[-20:]).lower():
                self.parts.append(f" <{address}>")
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")
        if not self.open_tags[tag]:
            return
        while self.stack:
            name, skip, hidden, quote = self.stack.pop()
            self.open_tags[name] -= 1
            self.skip -= skip
            self.hidden_depth -= hidden
            self.quote -= quote
            if name == "pre":
                self.pre -= 1
            if name == tag:
                break

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        if not self.pre:
            data = re.sub(r"\s+", " ", data)
        if self.hidden_depth:
            if self.hidden_chars < MAX_HIDDEN_CHARS:
                self.hidden.append(data)
                self.hidden_chars += len(data)
            return
        if self.quote:
            if data.strip():
                self.quoted_removed = True
            return
        self.parts.append(data)


def html_to_text(html: str) -> tuple[str, str, bool]:
    """(visible text, hidden text, quoted_removed). Never raises. At most MAX_HTML_CHARS
    are parsed (the writer's text comes first; what is cut is the quoted history), and
    without an unterminated tail (`limits.terminated_html`): linear in the input."""
    parser = _HTMLToText()
    try:
        parser.feed(terminated_html(html[:MAX_HTML_CHARS]))
        parser.close()
    except Exception:  # html.parser is lenient, but be certain
        pass
    text = cap_combining_runs("".join(parser.parts))
    lines = [line.strip() for line in text.split("\n")]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    hidden = re.sub(r"\s+", " ", cap_combining_runs(" ".join(parser.hidden))).strip()[
        :MAX_HIDDEN_CHARS]
    return text, hidden, parser.quoted_removed


# --------------------------------------------------------------------------- quotes

_FORWARD_MARKERS = re.compile(
    r"^\s*(?:"
    r"-{2,}\s*(?:forwarded message|weitergeleitete nachricht|message transf[ée]r[ée]|"
    r"mensaje reenviado|mensagem encaminhada|messaggio inoltrato|doorgestuurd bericht)"
    r"\s*-{2,}"
    r"|begin forwarded message\s*:"
    r"|anfang der weitergeleiteten nachricht\s*:"
    r"|d[ée]but du message r[ée]exp[ée]di[ée]\s*:"
    r")",
    re.IGNORECASE,
)
_ORIGINAL_MARKERS = re.compile(
    r"^\s*-{2,}\s*(?:original message|urspr[üu]ngliche nachricht|message d'origine|"
    r"mensaje original|mensagem original|messaggio originale|oorspronkelijk bericht)\s*-{2,}",
    re.IGNORECASE,
)
_ATTRIBUTION = re.compile(
    r"^\s*(?:on|am|le|el|em|il|op|den|p[åa])\b.{0,300}?"
    r"(?:wrote|schrieb|a [ée]crit|escribi[óo]|escreveu|ha scritto|schreef|skrev)\b"
    r".{0,200}?:\s*$",
    re.IGNORECASE,
)
# "<date> <person> <verb>:" in languages whose attribution does not start with "On":
# Russian, Ukrainian, Polish, Czech, Scandinavian, Finnish, Turkish, Greek, Chinese, Japanese.
_ATTRIBUTION_END = re.compile(
    r"(?:wrote|schrieb|a [ée]crit|escribi[óo]|escreveu|ha scritto|schreef|skrev|kirjoitti|"
    r"napisa[łl]a?|napsala?|написала?|пишет|написав|написала|yazd[ıi]|έγραψε|写道|寫道|"
    r"が書きました|님이 작성)\s*[:：]\s*$",
    re.IGNORECASE,
)
_HEADER_FROM = re.compile(r"^\s*\*?(?:from|von|de|da|van)\s*:\*?\s*(.+)$", re.IGNORECASE)
_HEADER_SENT = re.compile(
    r"^\s*\*?(?:sent|date|gesendet|datum|envoy[ée]|date d'envoi|enviado|fecha|data|inviato|"
    r"verzonden|datum)\s*:",
    re.IGNORECASE,
)
_FORWARD_SUBJECT = re.compile(
    r"^\s*(?:(?:re|aw|sv|antw|r|rif)\s*:\s*)*(?:fwd?|wg|tr|rv|enc|doorst)\s*:",
    re.IGNORECASE,
)
_QUOTE_LINE = re.compile(r"^\s*>")
_ATTRIBUTION_START = re.compile(r"^\s*(?:on|am|le|el|em|il|op|den|p[åa])\b", re.IGNORECASE)


def _is_attribution(line: str) -> bool:
    """"On <date>, <person> wrote:" in the supported languages; a date or an address must be
    present so that ordinary sentences are not mistaken for one."""
    if len(line) > 400 or not re.search(r"\d|@", line):
        return False
    return bool(_ATTRIBUTION.match(line) or _ATTRIBUTION_END.search(line))


def _outlook_header_at(lines: list[str], i: int) -> bool:
    if not _HEADER_FROM.match(lines[i]):
        return False
    return any(_HEADER_SENT.match(line) for line in lines[i + 1 : i + 5])


def _forwarded_from(block: list[str]) -> list[Mailbox]:
    for line in block[:12]:
        match = _HEADER_FROM.match(line)
        if match:
            # Outlook writes a sender without a display name as "addr <addr>": one sender.
            found: dict[str, Mailbox] = {}
            for mailbox in _parse_mailboxes([match.group(1).strip()]):
                found.setdefault(mailbox.address.lower(), mailbox)
            return list(found.values())
    return []


def _split_attribution(line: str, following: str) -> bool:
    """An attribution folded over two lines with the verb on the second ("02.04.2012 14:20
    пользователь "a@b" <" / "a@b> написал:")."""
    return (len(line) < 200 and len(following) < 200 and bool(re.search(r"\d|@", line))
            and not _QUOTE_LINE.match(line) and not _QUOTE_LINE.match(following)
            and not _ATTRIBUTION_END.search(line)
            and bool(_ATTRIBUTION_END.search(following)))


def _below_quote(lines: list[str]) -> list[str]:
    """The unquoted lines after a `>` quote block (a bottom-posted reply); nothing when the
    history is not `>`-quoted (an Outlook-style header block: all of it is history)."""
    rest = [line for line in lines if line.strip()]
    if not rest or not _QUOTE_LINE.match(rest[0]):
        return []
    return [line for line in lines if not _QUOTE_LINE.match(line)
            and not _is_attribution(line)]


def _cut_replies(lines: list[str]) -> tuple[list[str], bool, bool]:
    """Drop `>` lines and everything from the first reply attribution / reply header.
    Returns (kept lines, quoted lines dropped, reply chain cut)."""
    removed = False
    kept: list[str] = []
    for i, line in enumerate(lines):
        joined = line + " " + lines[i + 1] if i + 1 < len(lines) else line
        if (
            _is_attribution(line)
            or (len(line) < 200 and _ATTRIBUTION_START.match(line) and _is_attribution(joined))
            or _split_attribution(line, lines[i + 1] if i + 1 < len(lines) else "")
            or _ORIGINAL_MARKERS.match(line)
            or _outlook_header_at(lines, i)
        ):
            if not any(k.strip() for k in kept):
                # bottom-posted: the writer's text follows the quote
                return _below_quote(lines[i + 1:]), True, True
            return kept, removed, True
        if _QUOTE_LINE.match(line):
            removed = True
            continue
        kept.append(line)
    return kept, removed, False


def strip_quoted(text: str, subject: str) -> tuple[str, str, list[Mailbox], bool, bool]:
    """(own text, forwarded block, forwarded_from, forwarded, quoted_removed)."""
    lines = text.split("\n")
    is_forward_subject = bool(_FORWARD_SUBJECT.match(subject))
    forward_at: int | None = None
    for i, line in enumerate(lines):
        if _FORWARD_MARKERS.match(line) or (
            is_forward_subject and (_ORIGINAL_MARKERS.match(line) or _outlook_header_at(lines, i))
        ):
            forward_at = i
            break
    own_lines = lines if forward_at is None else lines[:forward_at]
    own_kept, removed, chain_cut = _cut_replies(own_lines)
    own = "\n".join(own_kept).strip()
    if forward_at is None or chain_cut:
        # no forward, or the forward sits inside quoted reply history
        return own, "", [], False, removed or chain_cut
    block = lines[forward_at:]
    forwarded_from = _forwarded_from(block)
    # the forwarded header block: skip blank lines after the marker, then up to a blank line
    j = 1
    while j < len(block) and j < 4 and not block[j].strip():
        j += 1
    header_end = min(len(block), j + 12)
    for k in range(j, min(len(block), j + 12)):
        if not block[k].strip():
            header_end = k
            break
    body_kept, removed_inner, cut_inner = _cut_replies(block[header_end:])
    forwarded = "\n".join(block[:header_end] + body_kept).strip()
    return own, forwarded, forwarded_from, True, removed or removed_inner or cut_inner


# --------------------------------------------------------------------------- MIME walk


class _Collector:
    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.plain: list[str] = []
        self.html: list[str] = []
        self.attached: list[Message] = []
        self.parts = 0
        self.report = False
        self.defects = 0
        self.limits_hit: set[str] = set()


def _part_text(part: Message, out: _Collector) -> str:
    charset = declared_charset(part)
    if not charset_allowed(charset):
        out.limits_hit.add("charset")
    return clean_text(decode_bytes(bounded_payload(part), charset))


def _content_type(part: Message) -> str:
    try:
        return str(part.get_content_type()).lower()
    except Exception:
        return "text/plain"


def _walk(part: Message, out: _Collector, depth: int) -> None:
    out.parts += 1
    if out.parts > MAX_PARTS:
        return
    with contextlib.suppress(TypeError):
        out.defects += len(getattr(part, "defects", []) or [])
    ctype = _content_type(part)
    if ctype in ("multipart/report", "message/delivery-status", "message/disposition-notification",
                 "message/feedback-report"):
        out.report = True
    try:
        disposition = part.get_content_disposition()
    except Exception:
        disposition = None
    if ctype == "message/rfc822":
        payload = part.get_payload()
        if isinstance(payload, list) and payload and isinstance(payload[0], Message):
            out.attached.append(payload[0])
        return
    if ctype == "message/global":
        # RFC 6532: a forwarded message (UTF-8 headers allowed, and unlike message/rfc822 a
        # transfer encoding too): the same as an attached message/rfc822. An encoded one is
        # parsed here, against the same budget as the message around it.
        payload = part.get_payload()
        encoding = str(part.get("Content-Transfer-Encoding", "")).strip().lower()
        if encoding in ("base64", "quoted-printable") or not isinstance(payload, list):
            out.attached.append(parse_message(bounded_payload(part), out.budget))
        elif payload and isinstance(payload[0], Message):
            out.attached.append(payload[0])
        return
    if part.is_multipart():
        payload = part.get_payload()
        if isinstance(payload, list):
            for child in payload:
                if isinstance(child, Message):
                    _walk(child, out, depth + 1)
        return
    if disposition == "attachment":
        return
    if ctype == "text/html":
        out.html.append(_part_text(part, out))
    elif ctype == "text/plain" or ctype.startswith("multipart/") or ctype == "text/enriched":
        # a multipart without a usable boundary is text for our purposes
        out.plain.append(_part_text(part, out))


def _headers(msg: Message) -> tuple[dict[str, list[str]], int]:
    raw: dict[str, list[str]] = {}
    try:
        items = msg.raw_items()
        for name, value in items:
            key = str(name).strip().lower()
            if len(raw) > 500:
                break
            raw.setdefault(key, []).append(value if isinstance(value, str) else str(value))
    except Exception:
        pass
    return raw, len(raw.get("from", []))


def _ordered(msg: Message, names: tuple[str, ...], limit: int) -> list[tuple[str, str]]:
    """The first `limit` occurrences of the named headers, in message order (topmost
    first), names as spelt in `names`."""
    wanted = {name.lower(): name for name in names}
    out: list[tuple[str, str]] = []
    try:
        for name, value in msg.raw_items():
            key = wanted.get(str(name).strip().lower())
            if key is not None:
                out.append((key, value if isinstance(value, str) else str(value)))
                if len(out) >= limit:
                    break
    except Exception:  # a broken header block yields no trace headers, never a crash
        return out
    return out


def _empty(raw_size: int, parse_failed: bool) -> MinimisedMessage:
    return MinimisedMessage(headers={}, routing_headers={}, raw_size=raw_size,
                            parse_failed=parse_failed)


def _bounded(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    cut = text[:limit]
    space = cut.rfind(" ", max(0, limit - 200))
    return (cut[:space] if space > 0 else cut).rstrip(), True


_BLANK_RUN = re.compile(r"\n(?:[ \t]*+\n){2,}")


def _bounded_lines(text: str) -> tuple[str, bool]:
    """At most MAX_TEXT_LINES lines, runs of blank lines squeezed first: quote stripping
    runs a handful of patterns per line."""
    if text.count("\n") < MAX_TEXT_LINES:
        return text, False
    text = _BLANK_RUN.sub("\n\n", text)
    lines = text.split("\n", MAX_TEXT_LINES)
    if len(lines) <= MAX_TEXT_LINES:
        return text, True
    return "\n".join(lines[:MAX_TEXT_LINES]), True


def minimise(raw: bytes, max_body_chars: int = 8000,
             raw_size: int | None = None) -> MinimisedMessage:
    """Decode and minimise one raw RFC 5322 message (`raw_size`: the whole message's size
    when `raw` is its first MAX_RAW_BYTES). Never raises on bad input. A message beyond the
    structural limits of `limits.py` keeps only its top header fields and `too_complex`
    names the limit."""
    if not isinstance(raw, bytes | bytearray | memoryview):
        return _empty(0, True)
    raw = bytes(raw)
    raw_size = max(len(raw), raw_size or 0)
    try:
        try:
            return _minimise(raw[:MAX_RAW_BYTES], raw_size, max(200, max_body_chars), 0)
        except TooComplex as exc:
            return _headers_only(raw, raw_size, exc.limit)
    except Exception:  # last line of defence: untrusted input must not crash the caller
        return _empty(raw_size, True)


def _header_view(msg: Message) -> tuple[dict[str, list[str]], int, dict[str, str],
                                        dict[str, str]]:
    raw_headers, from_count = _headers(msg)
    headers: dict[str, str] = {}
    for name in MODEL_HEADERS:
        values = raw_headers.get(name.lower())
        if values:
            headers[name] = decode_header_value(values[0])
    routing: dict[str, str] = {}
    for name in ROUTING_HEADERS:
        values = raw_headers.get(name.lower())
        if values:
            routing[name] = decode_header_value(
                values[0], THREAD_HEADER_CHARS if name == "References" else 500)
    return raw_headers, from_count, headers, routing


def _auth_headers(msg: Message) -> list[tuple[str, str]]:
    return [(name, decode_header_value(value, MAX_RAW_HEADER_CHARS))
            for name, value in _ordered(msg, AUTH_HEADERS, MAX_AUTH_HEADERS)]


def _spam_headers(msg: Message) -> list[tuple[str, str]]:
    return [(name, decode_header_value(value, 500))
            for name, value in _ordered(msg, SPAM_HEADERS, MAX_SPAM_HEADERS)]


def _headers_only(raw: bytes, raw_size: int, limit: str) -> MinimisedMessage:
    msg = parse_headers(raw)
    raw_headers, from_count, headers, routing = _header_view(msg)
    return MinimisedMessage(
        headers=headers,
        routing_headers=routing,
        **_address_fields(raw_headers),
        auth_headers=_auth_headers(msg),
        spam_headers=_spam_headers(msg),
        from_header_count=from_count,
        content_type=_content_type(msg),
        truncated=True,
        raw_size=raw_size,
        too_complex=limit,
    )


def _minimise(raw: bytes, raw_size: int, max_body_chars: int, depth: int) -> MinimisedMessage:
    budget = Budget()
    msg = parse_message(raw, budget)
    raw_headers, from_count, headers, routing = _header_view(msg)

    collector = _Collector(budget)
    _walk(msg, collector, 0)
    report = detect_report(msg, raw) if depth == 0 else None
    auth_headers = _auth_headers(msg)
    content_type = _content_type(msg)

    hidden = ""
    quoted_html = False
    is_html_only = False
    if any(text.strip() for text in collector.plain):
        text = "\n\n".join(t for t in collector.plain if t.strip())
    elif collector.html:
        is_html_only = True
        texts, hiddens = [], []
        for html in collector.html:
            if len(html) > MAX_HTML_CHARS:
                collector.limits_hit.add("html_chars")
            visible, hid, quoted = html_to_text(html)
            texts.append(visible)
            hiddens.append(hid)
            quoted_html = quoted_html or quoted
        text = "\n\n".join(t for t in texts if t)
        hidden = " ".join(h for h in hiddens if h)[:MAX_HIDDEN_CHARS]
    else:
        text = ""
    text = text[:MAX_TEXT_CHARS]
    text, lines_cut = _bounded_lines(text)
    if lines_cut:
        collector.limits_hit.add("text_lines")
    if budget.truncated:
        collector.limits_hit.add("lines")

    own, forwarded_block, forwarded_from, forwarded, quoted = strip_quoted(
        text, headers.get("Subject", "")
    )

    # A message forwarded as an attachment: render it as a forwarded block.
    if collector.attached and not collector.report and depth < 1 and not forwarded:
        inner_msg = collector.attached[0]
        try:
            inner_raw = inner_msg.as_bytes(policy=email_policy.compat32)
        except Exception:
            inner_raw = b""
        inner = _minimise(inner_raw[:MAX_RAW_BYTES], len(inner_raw), max_body_chars, depth + 1)
        forwarded = True
        forwarded_from = inner.from_addrs
        forwarded_block = "---------- Forwarded message ---------\n" + inner.as_text()

    own, own_truncated = _bounded(own, max_body_chars)
    remaining = max(0, max_body_chars - len(own))
    forwarded_block, fwd_truncated = _bounded(forwarded_block, remaining)
    if forwarded and forwarded_block:
        body = own + "\n\n" + forwarded_block if own else forwarded_block
        own_chars = len(own)
    else:
        body = own
        own_chars = len(own)

    return MinimisedMessage(
        headers=headers,
        routing_headers=routing,
        **_address_fields(raw_headers),
        auth_headers=auth_headers,
        spam_headers=_spam_headers(msg),
        from_header_count=from_count,
        content_type=content_type,
        body=body,
        own_text_chars=own_chars,
        forwarded=forwarded,
        forwarded_from=forwarded_from,
        quoted_removed=quoted or quoted_html,
        truncated=own_truncated or fwd_truncated or raw_size > MAX_RAW_BYTES
        or len(text) >= MAX_TEXT_CHARS or lines_cut or budget.truncated,
        is_html_only=is_html_only,
        has_report_part=collector.report or content_type == "multipart/report",
        report=report,
        hidden_text=hidden,
        defects=collector.defects,
        raw_size=raw_size,
        parse_failed=False,
        limits_hit=sorted(collector.limits_hit),
    )
