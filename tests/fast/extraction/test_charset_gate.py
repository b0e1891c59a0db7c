"""The charset allow-list holds for every library that reads a message (docs/architecture.md
§7, issue 36): the stdlib decodes a part that carries 8-bit bytes with its declared charset
on its own (`get_payload()`, the generators, RFC 2231 parameter values), and flufl.bounce's
detectors do through it, so the project sanitises the tree before any of them sees it.

Proof by instrument, not by timing: the codec registry is swapped for one that counts every
use (decode, encode, incremental or stream) of a codec off the allow-list, and every entry
point the minimiser and the report detectors call runs over the pathological corpus, the
labelled corpus, and 8-bit variants of each charset trick. No such codec may be used. The
punycode message that held a work child for its whole time limit is also checked against
the 1 s of CPU a message may cost (a limit of the budget, not a performance claim)."""

from __future__ import annotations

import base64
import codecs
import contextlib
import email.iterators
import encodings
import quopri
import sys
import time
from collections.abc import Callable, Iterator
from email.message import Message
from typing import Any

import pytest
from flufl.bounce import all_failures, scan_message
from flufl.bounce._scan import _DETECTORS

from inboxcrm.domain.extraction import extract_and_route, limits, minimise, view_message
from inboxcrm.domain.extraction.reports import detect_report, heuristic_view
from inboxcrm.domain.policy import TenantPolicy, get_policy
from tests.fixtures.pathological import CASES as PATHOLOGICAL
from tests.fixtures.pathological import HEAD
from tests.helpers.corpus import CASES as LABELLED

CPU_BUDGET = 1.0  # seconds of CPU per message (issue 20)

# Codecs Python has that are not on the allow-list: quadratic (punycode), not text at all
# (zlib, uu, hex, ...), escape languages (unicode_escape) or merely unexpected (utf-7).
REFUSED = ("punycode", "utf-7", "unicode_escape", "raw_unicode_escape", "idna", "zlib", "bz2",
           "uu", "base64", "hex", "rot13", "quopri", "utf-32", "cp037", "palmos")

# What made a work child spend its 5 s: a body of deltas the punycode decoder inserts one at
# a time into an ever longer string, and one byte >= 0x80 so that the stdlib decodes it.
PUNYCODE_BODY = b"\xe9-" + b"ba" * 150_000


def _single(body: bytes, content_type: str, cte: str = "8bit", head: bytes = HEAD) -> bytes:
    return (head + f"Content-Type: {content_type}\r\nContent-Transfer-Encoding: {cte}\r\n\r\n"
            .encode() + body)


def _multipart(inner: bytes, ctype: str = "multipart/mixed", head: bytes = HEAD) -> bytes:
    return (head + f"Content-Type: {ctype}; boundary=zz\r\n\r\n--zz\r\n".encode() + inner
            + b"\r\n--zz\r\nContent-Type: message/delivery-status\r\n\r\n"
              b"Reporting-MTA: dns; mx.example\r\n\r\nFinal-Recipient: rfc822; a@b.example\r\n"
              b"Action: failed\r\nStatus: 5.1.1\r\n\r\n--zz--\r\n")


BOUNCE_HEAD = HEAD.replace(b"From: Jane Doe <jane@initech.example>",
                           b"From: MAILER-DAEMON@mx.initech.example").replace(
    b"Subject: Question about pricing", b"Subject: Undeliverable: pricing")


def eight_bit_variants(charset: str, body: bytes = b"caf\xe9 au lait\r\n") -> list[
        tuple[str, bytes]]:
    """One charset trick in every shape a library might decode it in: 8-bit bodies (plain,
    HTML, in a multipart, in a report, in an attached message, in a bounce the heuristic
    detectors read), transfer encodings, spellings of the parameter and RFC 2231 forms."""
    part = (f"Content-Type: text/plain; charset={charset}\r\n"
            f"Content-Transfer-Encoding: 8bit\r\n\r\n").encode() + body
    return [
        ("plain", _single(body, f"text/plain; charset={charset}")),
        ("quoted", _single(body, f'text/plain; charset="{charset}"')),
        ("upper", _single(body, f"text/plain; charset={charset.upper()}")),
        ("html", _single(b"<p>" + body + b"</p>", f"text/html; charset={charset}")),
        ("base64", _single(base64.encodebytes(body), f"text/plain; charset={charset}",
                           "base64")),
        ("qp", _single(quopri.encodestring(body), f"text/plain; charset={charset}",
                       "quoted-printable")),
        ("rfc2231", _single(body, f"text/plain; charset*=utf-8''{charset}")),
        ("rfc2231_split", _single(
            body, f"text/plain; charset*0*=us-ascii''{charset[:2]}; charset*1={charset[2:]}")),
        ("rfc2231_boundary", _single(body, f"multipart/mixed; boundary*={charset}''"
                                           + "ba" * 2000)),
        ("rfc2231_filename", _single(body, f"text/plain; name*={charset}''" + "ba" * 2000,
                                     head=HEAD + f"Content-Disposition: inline; filename*="
                                     f"{charset}''{'ba' * 2000}\r\n".encode())),
        ("two_charsets", _single(body, f"text/plain; charset=utf-8; charset={charset}")),
        ("multipart", _multipart(part)),
        ("report", _multipart(part, "multipart/report; report-type=delivery-status")),
        ("rfc822", _single(HEAD + b"Content-Type: text/plain; charset=" + charset.encode()
                           + b"\r\n\r\n" + body, "message/rfc822")),
        ("bounce", _single(b"Delivery has failed to a@b.example\r\n" + body,
                           f"text/plain; charset={charset}", head=BOUNCE_HEAD)),
        ("bounce_multipart", _multipart(part, head=BOUNCE_HEAD)),
    ]


def _with_8bit(raw: bytes) -> bytes:
    """A corpus message with one byte >= 0x80 in its body (what makes the stdlib decode)."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    return head + sep + b"\xe9" + body + b"\xe9\r\n"


def _messages() -> Iterator[tuple[str, bytes]]:
    for case in PATHOLOGICAL:
        yield case.name, case.raw
        if "charset_tricks" in case.tags:
            yield f"{case.name}_8bit", _with_8bit(case.raw)
    for labelled in LABELLED:
        yield labelled.id, labelled.raw
    for charset in REFUSED:
        for shape, raw in eight_bit_variants(charset):
            yield f"{charset}_{shape}", raw
    for shape, raw in eight_bit_variants("punycode", PUNYCODE_BODY):
        yield f"punycode_quadratic_{shape}", raw


MESSAGES = dict(_messages())


# --------------------------------------------------------------------------- the instrument


IDN_CODE = ("/idna/", "/email_validator/")  # address validation: IDNA of a domain's labels


def _idn_label() -> bool:
    """The deliberate uses: a sender's domain (of an address already cut at 320 characters)
    converted between IDNA and Unicode, label by label, by the address validator and by the
    rules extractor (an `xn--` label, at most 63 characters)."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if (code.co_name == "_domain_company" and code.co_filename.endswith("rules.py")) or any(
                part in code.co_filename for part in IDN_CODE):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def codec_uses() -> Iterator[list[str]]:
    """Every use of a codec off the allow-list while the block runs. The stdlib's search
    function is swapped for one that wraps what it finds; unregistering a search function
    clears the interpreter's codec cache, so codecs looked up before are wrapped too."""
    used: list[str] = []

    def counted(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        def use(*args: Any, **kwargs: Any) -> Any:
            if not _idn_label():
                used.append(name)
            return fn(*args, **kwargs)
        return use

    def search(name: str) -> codecs.CodecInfo | None:
        info: codecs.CodecInfo | None = encodings.search_function(name)
        if info is None or info.name in limits.ALLOWED_CODECS:
            return info
        return codecs.CodecInfo(
            counted(info.encode, info.name), counted(info.decode, info.name), name=info.name,
            incrementalencoder=counted(info.incrementalencoder, info.name),
            incrementaldecoder=counted(info.incrementaldecoder, info.name),
            streamreader=counted(info.streamreader, info.name),
            streamwriter=counted(info.streamwriter, info.name),
            _is_text_encoding=getattr(info, "_is_text_encoding", True))

    codecs.unregister(encodings.search_function)
    codecs.register(search)
    try:
        yield used
    finally:
        codecs.unregister(search)
        codecs.register(encodings.search_function)


def test_the_instrument_sees_a_refused_codec_used_by_the_stdlib() -> None:
    """The instrument can fail: an unsanitised stdlib tree decodes punycode and is seen."""
    from email import message_from_bytes

    tree = message_from_bytes(_single(b"\xe9-abc", "text/plain; charset=punycode"))
    codecs.lookup("punycode")  # cached before the block: still seen
    with codec_uses() as used:
        tree.get_payload()
    assert used == ["punycode"]
    with codec_uses() as used:
        assert limits.text_codec("utf-8") == "utf-8"
        b"caf\xc3\xa9".decode("utf-8")
    assert used == []


# --------------------------------------------------------------------------- entry points


def _stdlib_reads(tree: Message) -> None:
    """What the stdlib offers a caller of a parsed tree (and flufl.bounce calls)."""
    for part in tree.walk():
        for read in (part.get_payload, lambda p=part: p.get_payload(decode=True),
                     part.get_content_charset, part.get_charsets, part.get_filename,
                     part.get_boundary, part.get_params, part.get_content_type,
                     lambda p=part: p.get_param("charset"),
                     lambda p=part: p.get_params(header="content-disposition"),
                     part.as_string, part.as_bytes, lambda p=part: str(p)):
            with contextlib.suppress(Exception):  # only the codecs used are the question
                read()
    with contextlib.suppress(Exception):
        list(email.iterators.body_line_iterator(tree))
    with contextlib.suppress(Exception):
        list(email.iterators.body_line_iterator(tree, decode=True))
    with contextlib.suppress(Exception):
        list(email.iterators.typed_subpart_iterator(tree))


def _flufl_reads(tree: Message) -> None:
    """flufl.bounce's entry points and each of its detectors on its own (scan_message
    stops at the first that answers)."""
    for run in (all_failures, scan_message, *(lambda t, d=d: d().process(t)
                                              for d in _DETECTORS)):
        with contextlib.suppress(Exception):
            run(tree)


def _tree(raw: bytes) -> Message | None:
    try:
        return limits.parse_message(raw)
    except limits.TooComplex:
        return None


@pytest.fixture(scope="module")
def globex() -> TenantPolicy:
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("INBOXCRM_POLICY_DIR", raising=False)
        return get_policy("globex")


@pytest.mark.parametrize("name", list(MESSAGES))
async def test_no_library_decodes_with_a_charset_off_the_allow_list(
        name: str, globex: TenantPolicy) -> None:
    raw = MESSAGES[name]
    with codec_uses() as used:
        # the trees the project hands a library: the message (the stdlib, the report
        # parsers) and the heuristic detectors' view of it (flufl.bounce)
        tree, view = _tree(raw), _tree(heuristic_view(raw))
        for parsed in (tree, view):
            if parsed is not None:
                _stdlib_reads(parsed)
        if view is not None:
            _flufl_reads(view)
        if tree is not None:
            detect_report(tree, raw)
        minimise(raw)
        view_message(raw, globex, "standard")
        await extract_and_route(raw, globex)
    assert used == [], f"{name}: {sorted(set(used))} used {len(used)} times"


def test_the_variants_reach_the_code_that_used_to_decode() -> None:
    """The 8-bit variants are the trigger: the stdlib keeps their bytes as surrogate escapes
    (what makes `get_payload()` decode), and a refused charset is said on the message."""
    for charset in REFUSED:
        variants = dict(eight_bit_variants(charset))
        tree = limits.parse_message(variants["plain"])
        assert any("\udce9" in str(part.__dict__.get("_payload")) for part in tree.walk())
        assert limits.declared_charset(tree) == charset
        assert tree.get_content_charset() is None  # gone from what libraries read
        assert "charset" in minimise(variants["plain"]).limits_hit, charset
        assert "charset" in minimise(variants["rfc2231"]).limits_hit, charset


def test_allowed_charsets_are_kept_for_libraries_and_used() -> None:
    raw = _single("Grüße aus Köln".encode("iso-8859-1"), "text/plain; charset=iso-8859-1")
    tree = limits.parse_message(raw)
    assert tree.get_content_charset() == "iso-8859-1"
    assert tree["Content-Type"] == "text/plain; charset=iso-8859-1"  # a clean field as sent
    message = minimise(raw)
    assert message.body == "Grüße aus Köln" and message.limits_hit == []
    # a name only the project's aliases know is used by the project, never by a library
    thai = _single("สวัสดี".encode("cp874"), "text/plain; charset=windows-874")
    assert limits.parse_message(thai).get_content_charset() is None
    assert minimise(thai).body == "สวัสดี"


def test_rfc2231_values_are_decoded_by_the_project() -> None:
    raw = _single(b"hello", "multipart/mixed; boundary*=punycode''" + "ba" * 3000)
    tree = limits.parse_message(raw)
    boundary = tree.get_boundary()
    assert boundary is not None and boundary.isascii()
    assert len(str(tree["Content-Type"])) <= limits.MAX_PARAM_HEADER_CHARS + 50


def test_a_parameter_flood_is_parsed_once_and_stored_short() -> None:
    raw = _single(b"hello\xe9", 'text/plain; a="' + ";" * 200_000 + "; charset=punycode")
    started = time.process_time()
    message = minimise(raw)
    assert time.process_time() - started < CPU_BUDGET
    assert message.body.startswith("hello")
    tree = limits.parse_message(raw)
    assert len(str(tree["Content-Type"])) <= limits.MAX_PARAM_HEADER_CHARS


# --------------------------------------------------------------------------- the CPU bound


@pytest.mark.parametrize("shape", [shape for shape, _ in eight_bit_variants("punycode")])
async def test_the_punycode_message_and_its_variants_stay_within_the_cpu_budget(
        shape: str, globex: TenantPolicy) -> None:
    raw = MESSAGES[f"punycode_quadratic_{shape}"]
    assert len(raw) > 300_000
    started = time.process_time()
    outcome = await extract_and_route(raw, globex)
    view_message(raw, globex, "standard")
    spent = time.process_time() - started
    assert spent < CPU_BUDGET, f"{shape}: {spent:.2f} s of CPU"
    assert outcome.route in ("review", "ignore", "auto"), outcome.reasons
