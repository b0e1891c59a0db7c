from __future__ import annotations

import time

import pytest

from inboxcrm.domain.extraction.minimise import (
    MODEL_HEADERS,
    decode_bytes,
    decode_header_value,
    html_to_text,
    minimise,
)
from tests.helpers.corpus import mail, multipart


def test_only_headers_that_matter_reach_the_model() -> None:
    raw = mail(headers=[("Received", "from secret-host by mx"), ("X-Internal-Id", "42"),
                        ("Reply-To", "jane@initech.example"), ("List-Id", "<l.example>")])
    msg = minimise(raw)
    assert set(msg.headers) <= set(MODEL_HEADERS)
    assert {"From", "To", "Subject", "Reply-To", "List-Id", "Content-Type"} <= set(msg.headers)
    text = msg.as_text()
    assert "secret-host" not in text and "X-Internal-Id" not in text and "Date:" not in text


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("=?utf-8?q?Gr=C3=BC=C3=9Fe_aus_K=C3=B6ln?=", "Grüße aus Köln"),
        ("=?ISO-8859-1?B?Sv5yZ2Vu?=", "Jþrgen"),
        ("=?utf-8?b?w6k?= =?utf-8?b?w6k=?=", "éé"),  # missing padding, adjacent words
        ("Hello =?unknown-charset?q?caf=C3=A9?=", "Hello café"),
        ("=?utf-8?q?broken=ZZ?=", "broken=ZZ"),
        ("folded\r\n  line", "folded line"),
        ("ctrl\x00chars\x1b", "ctrl chars"),
        ("=?base64?b?aGk=?=", "hi"),  # a non-text "charset" falls back safely
    ],
)
def test_header_decoding(raw: str, expected: str) -> None:
    assert decode_header_value(raw) == expected


def test_raw_8bit_headers_latin1_and_utf8() -> None:
    raw = (b"From: J\xfcrgen <j@stahl.example>\r\nSubject: Caf\xc3\xa9 \r\n"
           b"Content-Type: text/plain\r\n\r\nhi")
    msg = minimise(raw)
    assert msg.from_addrs[0].name == "Jürgen"
    assert msg.subject == "Café"


def test_decode_bytes_fallbacks() -> None:
    assert decode_bytes("é".encode("latin-1"), "iso-8859-1") == "é"
    assert decode_bytes("é".encode(), None) == "é"
    assert decode_bytes(b"\xe9t\xe9", "utf-8") == "été"  # mislabelled latin-1
    assert decode_bytes(b"\xff\xfe\x00", "no-such") != ""


def test_html_only_converted_hidden_and_quoted_removed() -> None:
    html = ("<html><head><title>T</title><style>.a{}</style><script>alert(1)</script></head>"
            "<body><p>Hello&nbsp;<b>there</b> &amp; welcome</p><ul><li>one</li><li>two</li></ul>"
            "<span style='display: none'>hidden instruction</span>"
            "<blockquote>old quoted text</blockquote><p>Bye</p></body></html>")
    visible, hidden, quoted = html_to_text(html)
    assert "Hello\xa0there & welcome" in visible or "Hello there & welcome" in visible
    assert "one\n" in visible and "Bye" in visible
    assert "alert" not in visible and ".a{}" not in visible and "T" not in visible.split()
    assert "hidden instruction" not in visible and "hidden instruction" in hidden
    assert "old quoted" not in visible and quoted
    msg = minimise(mail(content_type="text/html", body=html))
    assert msg.is_html_only and "welcome" in msg.body and "hidden instruction" in msg.hidden_text


def test_malformed_html_never_raises() -> None:
    for html in ["<p><b>unclosed", "</div></div><<<>>>", "<" * 10000, "<div>" * 5000 + "x",
                 "<!-- never closed", "<p style='display:none'>a</P>b"]:
        text, _, _ = html_to_text(html)
        assert isinstance(text, str)


@pytest.mark.parametrize(
    "attribution",
    [
        "On Mon, 3 Jun 2024 at 09:12, Bob <bob@rival.example> wrote:",
        "Am 03.06.2024 um 09:12 schrieb Bob <bob@rival.example>:",
        "Le lun. 3 juin 2024 à 09:12, Bob <bob@rival.example> a écrit :",
        "El lun, 3 jun 2024 a las 09:12, Bob (<bob@rival.example>) escribió:",
        "Em seg., 3 de jun. de 2024 às 09:12, Bob <bob@rival.example> escreveu:",
        "Il giorno lun 3 giu 2024 alle ore 09:12 Bob <bob@rival.example> ha scritto:",
        "Op ma 3 jun. 2024 om 09:12 schreef Bob <bob@rival.example>:",
    ],
)
def test_reply_chains_stripped_in_each_language(attribution: str) -> None:
    body = f"My own words.\n\nJane\n\n{attribution}\n> quoted words\n> more\n"
    msg = minimise(mail(body=body))
    assert "My own words." in msg.body and "Jane" in msg.body
    assert "quoted words" not in msg.body and "bob@rival" not in msg.body
    assert msg.quoted_removed


def test_wrapped_attribution_and_interleaved_quotes() -> None:
    body = ("Answer one.\n> question one\nAnswer two.\n\nOn Mon, 3 Jun 2024 at 09:12, a very "
            "long name\n<bob@rival.example> wrote:\n> old\n")
    msg = minimise(mail(body=body))
    assert "Answer one." in msg.body and "Answer two." in msg.body
    assert "question one" not in msg.body and "bob@rival" not in msg.body


def test_ordinary_sentence_is_not_an_attribution() -> None:
    msg = minimise(mail(body="On reflection, I think my colleague wrote:\nthe plan is good"))
    assert "the plan is good" in msg.body


def test_forwarded_block_kept_and_original_sender_found() -> None:
    body = ("Please help.\n\n---------- Forwarded message ---------\n"
            "From: Carl <carl@customer.example>\nDate: Mon\nSubject: x\n\nOriginal text.\n"
            "\nOn Sun, 2 Jun 2024, Dave <dave@d.example> wrote:\n> older\n")
    msg = minimise(mail(subject="Fwd: x", body=body))
    assert msg.forwarded and [m.address for m in msg.forwarded_from] == ["carl@customer.example"]
    assert msg.own_text == "Please help."
    assert "Original text." in msg.forwarded_text and "older" not in msg.body


def test_signature_kept_sent_from_phone_kept() -> None:
    msg = minimise(mail(body="Hi.\n\n-- \nJane Doe\nInitech GmbH\n\nSent from my iPhone"))
    assert "Initech GmbH" in msg.body


def test_bounded_length() -> None:
    msg = minimise(mail(body="word " * 10000), max_body_chars=1000)
    assert len(msg.body) <= 1000 and msg.truncated
    short = minimise(mail(body="short"))
    assert not short.truncated


def test_huge_message_is_fast_and_bounded() -> None:
    raw = mail(body="Pricing please.\n" + "x" * (30 * 1024 * 1024))
    started = time.monotonic()
    msg = minimise(raw)
    assert time.monotonic() - started < 10
    assert msg.truncated and len(msg.body) <= 8000 and msg.raw_size == len(raw)
    assert msg.body.startswith("Pricing please.")


def test_deep_and_wide_mime() -> None:
    inner = b"Content-Type: text/plain\r\n\r\ndeep text"
    for depth in range(60):
        boundary = f"b{depth}".encode()
        inner = (b'Content-Type: multipart/mixed; boundary="' + boundary + b'"\r\n\r\n--'
                 + boundary + b"\r\n" + inner + b"\r\n--" + boundary + b"--\r\n")
    msg = minimise(b"From: a@b.example\r\n" + inner)
    assert msg.from_addrs[0].address == "a@b.example"
    wide = multipart(subtype="mixed", parts=[("Content-Type: text/plain", b"p")] * 500)
    assert minimise(wide).body.count("p") <= 200


@pytest.mark.parametrize(
    "raw",
    [b"", b"\x00", b"\xff" * 1000, b"From:\r\n\r\n", b"Content-Type: multipart/mixed\r\n\r\nx",
     b"Content-Type: multipart/mixed; boundary=\r\n\r\n--\r\n",
     b"Content-Transfer-Encoding: base64\r\n\r\n!!!!", b"\r\n\r\n\r\n",
     b"From: =?utf-8?b?\xff\xfe?= <x@y.example>\r\n\r\nbody",
     b"Subject: " + b"=?utf-8?q?a?=" * 5000 + b"\r\n\r\n",
     b"Content-Type: text/plain; charset=\"utf-7\"\r\n\r\n+AGkAIQ-",
     b"Content-Type: text/plain; charset=rot13\r\n\r\nuryyb"],
)
def test_never_raises(raw: bytes) -> None:
    msg = minimise(raw)
    assert isinstance(msg.as_text(), str)


def test_non_bytes_input() -> None:
    assert minimise("not bytes").parse_failed  # type: ignore[arg-type]
