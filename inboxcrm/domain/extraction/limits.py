"""The work budget of one message, applied while it is read (docs/architecture.md §7).

Everything in an inbound message is attacker-controlled, so every step that reads it is
bounded before it does the work, not checked afterwards:

- **MIME structure.** `parse_message` feeds the stdlib feed parser (linear in the input)
  in chunks, with a part class that counts while the tree is built: the 201st part, the
  9th level of nesting or the 1,001st header field raises `TooComplex` at once, so a part
  or header flood costs what was read up to the limit. The feed parser was chosen over a
  pre-scan of boundaries because it is the parser the rest of the code reads, so the
  limits and the tree can never disagree. `parse_headers` is the fallback that keeps the
  first header fields of a message too complex to parse, for routing and the review card.
- **Decoded sizes.** A part's encoded payload is cut before it is decoded
  (`bounded_payload`); HTML beyond `MAX_HTML_CHARS` is never parsed.
- **Charsets** come from an allow-list of text encodings seen in mail (`text_codec`).
  Python knows many more codecs, some of them quadratic (`punycode`), some not text at all
  (`zlib`, `uu`, `unicode_escape`): a charset outside the list is decoded as UTF-8, else
  cp1252, with replacement characters. The standard library decodes a part with its
  declared charset on its own (`get_payload()` of a part with 8-bit bytes, the generators,
  RFC 2231 parameter values, which the feed parser reads for the boundary) and so does
  every flufl.bounce detector through it; so the tree never holds a charset a library
  could misuse: `BoundedPart` rewrites each Content-Type and Content-Disposition field as
  it is parsed (`library_params`), keeping the declared charset for the project's own
  decoding (`declared_charset`), and `bounded_payload` reads and transfer-decodes a
  part's bytes itself.
- **Unicode normalisation** is quadratic in the length of a run of combining marks;
  `cap_combining_runs` keeps at most 30 in a row (UAX #15's stream-safe format) before any
  text is normalised.
- **HTML.** `html.parser` searches to the end of the document for the end of every
  construct that is never closed (`<!--a` repeated: quadratic); `terminated_html` drops the
  unterminated tail (a browser renders none of it either) in one linear scan first.

Anything that still runs long is stopped by the process pool's hard time limit
(`inboxcrm/platform/workpool.py`); either way the message goes to review as `too_complex`.
"""

from __future__ import annotations

import codecs
import functools
import re
import unicodedata
from dataclasses import dataclass
from email.feedparser import BytesFeedParser
from email.message import Message
from email.policy import compat32
from email.utils import quote
from typing import Any, Literal

Limit = Literal["parts", "depth", "headers"]

MAX_RAW_BYTES = 5 * 1024 * 1024  # parse at most this much of a message
MAX_PART_BYTES = 2 * 1024 * 1024  # decode at most this much of one part
MAX_PARTS = 200
MAX_DEPTH = 8
MAX_HEADER_FIELDS = 1000  # every part's header fields together
# The feed parser costs a few microseconds per line, whatever the line: beyond this many
# line breaks the rest is not read (a 5 MB message of base64 has ~70,000 lines; of blank
# lines, 5 million).
MAX_LINES = 50_000
MAX_HEADER_BLOCK_BYTES = 256 * 1024  # what the headers-only fallback reads
MAX_HTML_CHARS = 200_000
MAX_COMBINING_RUN = 30
FEED_CHUNK = 64 * 1024
# Content-Type and Content-Disposition: the stdlib's parameter parser is quadratic in a
# value with an unclosed quote and re-parses the field on every parameter read (flufl.bounce
# reads the charset some 50 times): a field is parsed once, at most this long, and a
# longer or altered one is stored rebuilt from at most MAX_PARAMS parameters.
PARAM_HEADERS = frozenset({"content-type", "content-disposition"})
MAX_PARAM_HEADER_CHARS = 2000
MAX_CLEAN_PARAM_HEADER_CHARS = 256
MAX_PARAMS = 10


class TooComplex(Exception):
    """The message exceeds a structural limit (`limit`: parts, depth or headers)."""

    def __init__(self, limit: Limit) -> None:
        super().__init__(f"message too complex: {limit}")
        self.limit: Limit = limit


@dataclass
class Budget:
    """What one parse has used. `strict`: raise TooComplex at a limit; otherwise stop
    reading header fields there (the headers-only fallback)."""

    strict: bool = True
    parts: int = 0
    header_fields: int = 0
    lines: int = 0
    truncated: bool = False  # MAX_LINES reached: the rest of the input was not read


class BoundedPart(Message):
    """A MIME part that charges the parse's `Budget` while the feed parser builds the tree:
    the parser attaches a subpart as soon as it starts and sets each header field as it
    reads it, so a limit stops the parse where it is reached. Its Content-Type and
    Content-Disposition fields are stored as `library_params` makes them, before the
    parser or anything else reads a parameter; the charset the sender declared is kept in
    `declared`."""

    def __init__(self, policy: Any = compat32, budget: Budget | None = None) -> None:
        super().__init__(policy)
        self._budget = budget if budget is not None else Budget()
        self._depth = 0
        self.declared: str | None = None  # the first Content-Type's charset, as declared
        self._typed = False

    def attach(self, payload: Any) -> None:
        budget = self._budget
        budget.parts += 1
        if budget.parts > MAX_PARTS:
            raise TooComplex("parts")
        if self._depth + 1 > MAX_DEPTH:
            raise TooComplex("depth")
        if isinstance(payload, BoundedPart):
            payload._depth = self._depth + 1
        super().attach(payload)

    def set_raw(self, name: str, value: str) -> None:
        budget = self._budget
        budget.header_fields += 1
        if budget.header_fields > MAX_HEADER_FIELDS:
            if budget.strict:
                raise TooComplex("headers")
            return
        field = name.strip().lower() if isinstance(name, str) else ""
        if field in PARAM_HEADERS:
            value, charset = library_params(name, value)
            if field == "content-type" and not self._typed:
                self._typed = True
                self.declared = charset
        super().set_raw(name, value)


def _line_breaks(data: bytes) -> int:
    """Line breaks as the feed parser counts them (\n, \r, \r\n), at C speed."""
    return data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")


def _first_lines(data: bytes, lines: int) -> bytes:
    """The longest prefix of `data` with at most `lines` line breaks (a binary search)."""
    low, high = 0, len(data)
    while low < high:
        middle = (low + high + 1) // 2
        if _line_breaks(data[:middle]) <= lines:
            low = middle
        else:
            high = middle - 1
    return data[:low]


def _feed(raw: bytes, budget: Budget) -> Message:
    parser = BytesFeedParser(_factory=functools.partial(BoundedPart, budget=budget),
                             policy=compat32)
    for start in range(0, len(raw), FEED_CHUNK):
        chunk = raw[start:start + FEED_CHUNK]
        breaks = _line_breaks(chunk)
        if budget.lines + breaks > MAX_LINES:
            parser.feed(_first_lines(chunk, MAX_LINES - budget.lines))
            budget.lines = MAX_LINES
            budget.truncated = True
            break
        budget.lines += breaks
        parser.feed(chunk)
    return parser.close()


def parse_message(raw: bytes, budget: Budget | None = None) -> Message:
    """The MIME tree of `raw` (at most MAX_RAW_BYTES of it), or TooComplex at the first
    limit reached. `budget` is shared by the parses of one message (an encoded forwarded
    message is parsed on its own, and counts against the same limits)."""
    return _feed(raw[:MAX_RAW_BYTES], budget if budget is not None else Budget())


_HEADER_END = re.compile(rb"\r?\n\r?\n")


def parse_headers(raw: bytes) -> Message:
    """The top-level header fields only (the first MAX_HEADER_FIELDS of them), for a message
    whose body is too complex to parse. Never raises TooComplex."""
    block = raw[:MAX_HEADER_BLOCK_BYTES]
    end = _HEADER_END.search(block)
    head = block[: end.end()] if end else block
    return _feed(head, Budget(strict=False))


def bounded_payload(part: Message, limit: int = 0) -> bytes:
    """The decoded payload of a non-multipart part, at most `limit` (MAX_PART_BYTES) bytes;
    the encoded text is cut before it is decoded (base64 needs 4/3 as many characters,
    quoted-printable at most 3). The part's bytes are read here, never through
    `get_payload()`, which decodes a part with 8-bit bytes with its declared charset; only
    the transfer decoding is the stdlib's, on a copy that declares no charset."""
    limit = limit or MAX_PART_BYTES
    payload = getattr(part, "_payload", None)
    if not isinstance(payload, str):
        return b""
    cte = str(part.get("content-transfer-encoding", "")).strip().lower()
    factor = {"base64": 2, "quoted-printable": 3}.get(cte, 1)
    payload = payload[:limit * factor]
    if cte in TRANSFER_ENCODINGS:
        carrier = Message()
        carrier["Content-Transfer-Encoding"] = cte
        carrier.set_payload(payload)
        try:
            data = carrier.get_payload(decode=True)
        except Exception:  # a transfer encoding the stdlib gives up on
            data = None
        if isinstance(data, bytes):
            return data[:limit]
    payload = payload[:limit]
    try:
        return payload.encode("ascii", errors="surrogateescape")  # the bytes as received
    except UnicodeError:  # text a caller set (never the parser): its UTF-8
        return payload.encode("utf-8", errors="surrogateescape")


TRANSFER_ENCODINGS = frozenset({"base64", "quoted-printable", "x-uuencode", "uuencode", "uue",
                                "x-uue"})


# --------------------------------------------------------------------------- charsets

# Python codec names (after codecs.lookup) of the text encodings mail is written in.
ALLOWED_CODECS = frozenset({
    "ascii", "utf-8", "utf-16", "utf-16-le", "utf-16-be", "latin-1",
    *(f"iso8859-{n}" for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16)),
    *(f"cp{n}" for n in (1250, 1251, 1252, 1253, 1254, 1255, 1256, 1257, 1258, 874, 437, 850,
                         866, 932, 949, 950)),
    "koi8-r", "koi8-u", "mac-roman", "tis-620",
    "gb2312", "gbk", "gb18030", "hz", "big5", "big5hkscs",
    "shift_jis", "shift_jis_2004", "shift_jisx0213", "euc_jp", "euc_jis_2004", "euc_jisx0213",
    "iso2022_jp", "iso2022_jp_1", "iso2022_jp_2", "iso2022_jp_2004", "iso2022_jp_3",
    "iso2022_jp_ext", "euc_kr", "johab", "iso2022_kr",
})
# Names mail software writes that Python does not know.
CHARSET_ALIASES = {"windows-874": "cp874", "x-mac-roman": "mac-roman",
                   "iso-8859-8-i": "iso8859-8", "iso-8859-6-i": "iso8859-6",
                   "ks_c_5601-1987": "cp949", "x-sjis": "shift_jis", "x-euc-jp": "euc_jp",
                   "x-gbk": "gbk"}


@functools.lru_cache(maxsize=256)
def text_codec(charset: str | None) -> str | None:
    """The Python codec for a declared charset, or None when it is absent, unknown or not
    on the allow-list (the caller then decodes as UTF-8 / cp1252 with replacement)."""
    if not charset:
        return None
    name = charset.strip().strip('"').lower()
    if not name or len(name) > 40:
        return None
    try:
        info = codecs.lookup(CHARSET_ALIASES.get(name, name))
    except LookupError:
        return None
    if info.name not in ALLOWED_CODECS:
        return None
    if info.name in ("latin-1", "iso8859-1"):
        return "cp1252"  # what "latin-1" senders mean; a superset for printable text
    return info.name


def charset_allowed(charset: str | None) -> bool:
    """False for a declared charset that is not used (see `text_codec`)."""
    return not charset or text_codec(charset) is not None


def library_charset(charset: object) -> bool:
    """Whether a `charset` parameter may stay in the tree: the codec the standard library
    would look it up as (it does not strip or alias) is on the allow-list."""
    if not isinstance(charset, str) or not charset or len(charset) > 40:
        return False
    try:
        return codecs.lookup(charset).name in ALLOWED_CODECS
    except (LookupError, ValueError, TypeError):
        return False


def declared_charset(part: Message) -> str | None:
    """The charset a part's sender declared (lower case), for the project's own decoding
    (`text_codec`); the tree itself keeps it only if `library_charset` allows it."""
    if isinstance(part, BoundedPart):
        return part.declared.lower() if part.declared else None
    try:
        return part.get_content_charset()
    except Exception:  # a parameter the stdlib cannot parse
        return None


def _collapsed(value: str | tuple[str | None, str | None, str]) -> str:
    """An RFC 2231 parameter's text, decoded here with an allowed codec (UTF-8 if it names
    another): the stdlib would decode it with whatever codec the value names."""
    if not isinstance(value, tuple):
        return value
    charset, _, text = value
    data = text.encode("latin-1", errors="replace")  # the stdlib unquoted %XX as latin-1
    return data.decode(text_codec(charset) or "utf-8", errors="replace")


def library_params(name: str, value: str) -> tuple[str, str | None]:
    """A Content-Type or Content-Disposition field as a library may read it, and the
    charset it declares. Unchanged when it is short, has no RFC 2231 value and its charset
    (if any) passes `library_charset`; otherwise rebuilt from its first MAX_PARAMS
    parameters, RFC 2231 values decoded here, in ASCII, without a charset that fails."""
    text = value if isinstance(value, str) else str(value)
    cut = text[:MAX_PARAM_HEADER_CHARS]
    scratch = Message()
    scratch.set_raw(name, cut)
    try:
        params = scratch.get_params(header=name) or []
    except Exception:  # a parameter the stdlib cannot parse (an RFC 2231 index > 4300 digits)
        return cut.split(";", 1)[0].strip(), None
    if not params:
        return cut, None
    changed = len(text) > MAX_CLEAN_PARAM_HEADER_CHARS or len(params) > MAX_PARAMS + 1
    charset: str | None = None
    kept: list[tuple[str, str]] = []
    for key, raw in params[1:MAX_PARAMS + 1]:
        changed = changed or isinstance(raw, tuple)
        param = _collapsed(raw)
        if key.strip().lower() == "charset":
            if charset is None:
                charset = param.strip()
            if not library_charset(param):
                changed = True
                continue
        kept.append((key.strip(), param))
    if not changed:
        return text, charset
    rebuilt = str(params[0][0]).strip()[:MAX_CLEAN_PARAM_HEADER_CHARS]
    for key, param in kept:
        item = f'; {key}="{quote(param)}"' if param else f"; {key}"
        if len(rebuilt) + len(item) > MAX_PARAM_HEADER_CHARS:
            break  # whole parameters only: a cut one could leave a quote open
        rebuilt += item
    return rebuilt.encode("ascii", errors="replace").decode("ascii"), charset


# --------------------------------------------------------------------------- normalisation


def _non_starters() -> str:
    """A character class of every code point that starts a run of non-starters after NFKD:
    combining marks (canonical combining class > 0) and the few starters that decompose to
    one. Computed from this Python's Unicode tables (BMP and SMP, where all of them are)."""
    combining, decomposition = unicodedata.combining, unicodedata.decomposition
    points = []
    for cp in range(0x20000):
        ch = chr(cp)
        if combining(ch) or (decomposition(ch) and combining(
                unicodedata.normalize("NFKD", ch)[0])):
            points.append(cp)
    ranges: list[list[int]] = []
    for cp in points:
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}"
                   for a, b in ranges)


NON_STARTERS = _non_starters()
_LONG_RUN = re.compile(f"[{NON_STARTERS}]{{{MAX_COMBINING_RUN + 1},}}")


def cap_combining_runs(text: str) -> str:
    """At most MAX_COMBINING_RUN combining marks in a row (linear; normalisation of a
    longer run is quadratic in CPython)."""
    if text.isascii():
        return text
    return _LONG_RUN.sub(lambda m: m.group(0)[:MAX_COMBINING_RUN], text)


# --------------------------------------------------------------------------- HTML


def terminated_html(html: str) -> str:
    """`html` without its unterminated tail: from the first comment without `-->`, or the
    first `<` + letter, `/`, `!` or `?` without a later `>`, to the end. html.parser
    searches the rest of the document for each of those (quadratic on `<!--a<!--a…`);
    a browser shows nothing of an unclosed comment or tag either. One linear scan."""
    last_gt = html.rfind(">")
    pos = 0
    n = len(html)
    while pos < n:
        lt = html.find("<", pos)
        if lt < 0:
            break
        if html.startswith("<!--", lt):
            close = html.find("-->", lt + 4)
            if close < 0:
                return html[:lt]
            pos = close + 3
            continue
        following = html[lt + 1: lt + 2]
        if following and (following.isalpha() or following in "/!?"):
            if lt > last_gt:
                return html[:lt]
            close = html.find(">", lt + 1)
            pos = close + 1
            continue
        pos = lt + 1
    return html
