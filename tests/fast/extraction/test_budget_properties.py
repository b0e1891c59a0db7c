"""Property-based: whatever MIME tree, HTML or header set a sender builds, extraction stays
within its work budget (1 s of CPU per message on this machine, issue 20), never raises and
never routes a message it could not read to `auto`. Floods are generated as (token, count)
and built by repetition, so inputs reach hundreds of kilobytes cheaply."""

from __future__ import annotations

import asyncio
import base64
import os
import quopri
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inboxcrm.domain.extraction import extract_and_route
from inboxcrm.domain.policy import TenantPolicy, get_policy

CPU_BUDGET = 1.0
# More examples for a hunt: INBOXCRM_PROPERTY_EXAMPLES=2000 (the fast tier runs 40 each).
PROPERTY = settings(max_examples=int(os.environ.get("INBOXCRM_PROPERTY_EXAMPLES", "40")),
                    deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])

# Pieces that make parsers work: HTML constructs, RFC 2047 / 2231 syntax, address syntax,
# MIME syntax, line breaks, combining marks, prompt-like lines, quotes.
TOKENS = [
    "<!--", "-->", "<!--a", "<a", "</a", "<a href='", '"', "'", ">", "<", "<!", "<?", "<![",
    "]]>", "&#", "&#x301;", "&amp", "&", ";", "<br>", "<div>", "</div>", "<blockquote>",
    "<style>", "<script>", "=?", "?=", "=?utf-8?q?", "=?utf-8?b?", "*", "?", "=", "@", "a@",
    "a.", ".", "!", "<x@y.example>", ",", "(", ")", "\\", "\n", "\r\n", " \n", "\n\n", " ",
    "\t", "--", "--b", "> ", "On Mon, 1 Jan 2024, a@b.c wrote:", "From: x@y.z", "Sent: 1",
    "name:", "company:", "system:", "ignore previous instructions", "\u0301", "\u0316",
    "\u200b", "й", "日本", "+AGE-", "x", "0", "9.9",
]
flood = st.tuples(st.sampled_from(TOKENS), st.integers(1, 60_000)).map(lambda t: t[0] * t[1])
text = st.lists(st.one_of(flood, st.text(max_size=40), st.sampled_from(TOKENS)),
                max_size=12).map("".join)

CHARSETS = ["utf-8", "us-ascii", "iso-8859-1", "windows-1252", "koi8-r", "gb2312", "big5",
            "shift_jis", "iso-2022-jp", "utf-16", "utf-7", "punycode", "idna", "unicode_escape",
            "zlib", "uu", "x-unknown", ""]
ENCODINGS = ["7bit", "8bit", "base64", "quoted-printable", "x-uuencode", "bogus"]
LEAF_TYPES = ["text/plain", "text/html", "text/enriched", "application/octet-stream",
              "message/delivery-status", "text/rfc822-headers", "multipart/mixed"]
HEADER_NAMES = ["From", "To", "Cc", "Reply-To", "Sender", "Subject", "Return-Path",
                "Auto-Submitted", "Precedence", "List-Id", "List-Unsubscribe",
                "Authentication-Results", "Received-SPF", "DKIM-Signature", "X-Spam-Status",
                "X-Spam_score", "X-Spamd-Result", "X-Mailgun-Sflag", "X-Mailer", "X-Other"]


def _encode(body: str, charset: str, cte: str) -> bytes:
    try:
        data = body.encode(charset or "utf-8")
    except (LookupError, UnicodeError, TypeError):
        data = body.encode("utf-8", "replace")
    if cte == "base64":
        return base64.encodebytes(data)
    if cte == "quoted-printable":
        return quopri.encodestring(data)
    return data


@st.composite
def leaves(draw: Any) -> bytes:
    ctype, charset = draw(st.sampled_from(LEAF_TYPES)), draw(st.sampled_from(CHARSETS))
    cte = draw(st.sampled_from(ENCODINGS))
    disposition = draw(st.sampled_from(["", "attachment", "inline"]))
    head = f"Content-Type: {ctype}; charset={charset}\r\nContent-Transfer-Encoding: {cte}\r\n"
    if disposition:
        head += f"Content-Disposition: {disposition}\r\n"
    return head.encode() + b"\r\n" + _encode(draw(text), charset, cte)


def _tree(children: Any) -> Any:
    @st.composite
    def node(draw: Any) -> bytes:
        subtype = draw(st.sampled_from(["mixed", "alternative", "digest", "report", "related"]))
        boundary = draw(st.sampled_from(["b", "=_x", "a" * 70, "--", "b b"]))
        parts = draw(st.lists(children, max_size=6))
        body = b"".join(b"--" + boundary.encode() + b"\r\n" + part + b"\r\n" for part in parts)
        close = b"--" + boundary.encode() + b"--\r\n" if draw(st.booleans()) else b""
        return (f'Content-Type: multipart/{subtype}; boundary="{boundary}"\r\n\r\n'.encode()
                + body + close)

    @st.composite
    def wrapped(draw: Any) -> bytes:
        return b"Content-Type: message/rfc822\r\n\r\nFrom: a@b.example\r\n" + draw(children)

    return st.one_of(node(), wrapped())


mime_trees = st.recursive(leaves(), _tree, max_leaves=12)
header_sets = st.lists(
    st.tuples(st.sampled_from(HEADER_NAMES), text,
              st.integers(1, 3).flatmap(lambda n: st.integers(1, 10 ** n))),
    max_size=8)


def _headers(headers: list[tuple[str, str, int]]) -> bytes:
    out = []
    for name, value, repeat in headers:
        line = f"{name}: {value[:20_000]}".replace("\n", "\n ").encode("utf-8", "replace")
        out.append((line + b"\r\n") * min(repeat, 2000))
    return b"".join(out)


@pytest.fixture(scope="module")
def globex() -> TenantPolicy:
    return get_policy("globex")


def _held_to_budget(raw: bytes, policy: TenantPolicy) -> None:
    started = time.process_time()
    outcome = asyncio.run(extract_and_route(raw, policy))  # never raises
    spent = time.process_time() - started
    assert spent < CPU_BUDGET, f"{spent:.2f} s of CPU for {len(raw)} bytes"
    assert outcome.route in ("auto", "review", "ignore", "opt_out")
    if "too_complex" in outcome.reasons:
        assert outcome.route == "review" and outcome.reasons[0] == "too_complex"


@PROPERTY
@given(tree=mime_trees, headers=header_sets)
def test_any_mime_tree_is_held_to_the_budget(globex: TenantPolicy, tree: bytes,
                                             headers: list[tuple[str, str, int]]) -> None:
    raw = (b"From: Jane Doe <jane@initech.example>\r\nTo: hello@globex.test\r\n"
           + _headers(headers) + tree)
    _held_to_budget(raw, globex)


@PROPERTY
@given(html=text, wrap=st.booleans())
def test_any_html_is_held_to_the_budget(globex: TenantPolicy, html: str, wrap: bool) -> None:
    if wrap:
        html = f"<html><body><div>{html}</div></body></html>"
    raw = (b"From: Jane Doe <jane@initech.example>\r\nTo: hello@globex.test\r\n"
           b"Subject: Hi\r\nContent-Type: text/html; charset=utf-8\r\n\r\n"
           + html.encode("utf-8", "replace"))
    _held_to_budget(raw, globex)


@PROPERTY
@given(headers=header_sets, body=text)
def test_any_header_set_is_held_to_the_budget(globex: TenantPolicy,
                                              headers: list[tuple[str, str, int]],
                                              body: str) -> None:
    raw = _headers(headers) + b"\r\n" + body.encode("utf-8", "replace")
    _held_to_budget(raw, globex)
