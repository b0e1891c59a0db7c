"""The work budget of one message (docs/architecture.md §7): every pathological input of
tests/fixtures/pathological is handled within 1 s of CPU, routed to review as `too_complex`
where its structure is beyond the limits, never `auto`, never a crash; the limits hold while
parsing; a runaway extraction in a work pool is killed and becomes `too_complex`."""

from __future__ import annotations

import asyncio
import time
import unicodedata
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from inboxcrm.domain.extraction import (
    extract_and_route,
    extract_offline,
    limits,
    minimise,
    view_message,
    work_pool,
)
from inboxcrm.domain.policy import TenantPolicy, get_policy
from inboxcrm.domain.review_card import ReviewCard, _message
from inboxcrm.platform.config import Settings
from inboxcrm.platform.workpool import BudgetExceeded, WorkPool
from tests.fixtures.pathological import CASES, Pathological, by_name
from tests.helpers.corpus import CASES as CORPUS

CPU_BUDGET = 1.0  # seconds of CPU per message on this machine (issue 20)


@pytest.fixture
def globex(monkeypatch: pytest.MonkeyPatch) -> TenantPolicy:
    monkeypatch.delenv("INBOXCRM_POLICY_DIR", raising=False)
    return get_policy("globex")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
async def test_each_pathological_message_is_handled_within_budget(
        globex: TenantPolicy, case: Pathological) -> None:
    raw = case.raw
    started = time.process_time()
    outcome = await extract_and_route(raw, globex)  # in this process: no kill to hide behind
    spent = time.process_time() - started
    assert spent < CPU_BUDGET, f"{case.name}: {spent:.2f} s of CPU"
    assert outcome.route in ("review", "ignore"), outcome.reasons
    if case.too_complex:
        assert outcome.reasons[0] == "too_complex" and outcome.route == "review"


def test_the_corpus_covers_every_attack_of_the_issue() -> None:
    tags = {tag for case in CASES for tag in case.tags}
    assert {"comment_flood", "tag_flood", "deep_nesting", "encoded_word_flood",
            "blank_line_flood", "charset_tricks", "huge_line", "header_flood",
            "part_flood"} <= tags
    assert len({case.name for case in CASES}) == len(CASES)
    assert any("punycode" in case.name for case in CASES)


def test_inboxcrm_extract_reads_a_pathological_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `inboxcrm extract` runs (`extract_offline`): the limits hold in the CLI too."""
    monkeypatch.delenv("INBOXCRM_POLICY_DIR", raising=False)
    path = tmp_path / "deep.eml"
    path.write_bytes(by_name("deep_nesting").raw)
    outcome = extract_offline(path, "globex").outcome
    assert outcome.route == "review" and outcome.reasons[0] == "too_complex"


# --------------------------------------------------------------------------- while parsing


def _nested(depth: int) -> bytes:
    return by_name("deep_nesting").build.__globals__["_nested"](depth)  # type: ignore[no-any-return]


def test_limits_stop_the_parse_where_they_are_reached() -> None:
    with pytest.raises(limits.TooComplex) as deep:
        limits.parse_message(_nested(limits.MAX_DEPTH + 1))
    assert deep.value.limit == "depth"
    limits.parse_message(_nested(limits.MAX_DEPTH))  # the limit itself is fine
    budget = limits.Budget()
    with pytest.raises(limits.TooComplex) as parts:
        limits.parse_message(by_name("part_flood").raw, budget)
    assert parts.value.limit == "parts" and budget.parts == limits.MAX_PARTS + 1
    budget = limits.Budget()
    with pytest.raises(limits.TooComplex) as headers:
        limits.parse_message(by_name("header_flood").raw, budget)
    assert headers.value.limit == "headers"
    assert budget.header_fields == limits.MAX_HEADER_FIELDS + 1


def test_a_message_too_complex_to_parse_keeps_its_headers_for_the_reviewer() -> None:
    message = minimise(by_name("part_flood").raw)
    assert message.too_complex == "parts" and message.body == ""
    assert message.from_addrs[0].address == "jane@initech.example"
    assert message.headers["Subject"] == "Question about pricing"


def test_lines_beyond_the_limit_are_not_read() -> None:
    raw = by_name("newline_flood").raw
    budget = limits.Budget()
    limits.parse_message(raw, budget)
    assert budget.truncated and budget.lines == limits.MAX_LINES
    message = minimise(raw)
    assert message.truncated and "lines" in message.limits_hit
    assert message.from_addrs[0].address == "jane@initech.example"


def test_a_payload_is_cut_before_it_is_decoded() -> None:
    message = limits.parse_message(by_name("huge_base64").raw)
    assert len(limits.bounded_payload(message, 1000)) == 1000
    assert limits.bounded_payload(message, 1000).startswith(b"hello world")


@pytest.mark.parametrize("charset", ["punycode", "idna", "unicode_escape",
                                     "raw_unicode_escape", "uu", "zlib", "base64", "rot13",
                                     "utf-7", "x-unknown", "a" * 50])
def test_charsets_off_the_allow_list_are_not_used(charset: str) -> None:
    assert limits.text_codec(charset) is None
    assert not limits.charset_allowed(charset)


@pytest.mark.parametrize(("charset", "codec"), [
    ("utf-8", "utf-8"), ("US-ASCII", "ascii"), ("iso-8859-1", "cp1252"),
    ("ISO-8859-15", "iso8859-15"), ("windows-1251", "cp1251"), ("koi8-r", "koi8-r"),
    ("koi8-u", "koi8-u"), ("gb2312", "gb2312"), ("GBK", "gbk"), ("gb18030", "gb18030"),
    ("big5", "big5"), ("shift_jis", "shift_jis"), ("euc-jp", "euc_jp"),
    ("iso-2022-jp", "iso2022_jp"), ("euc-kr", "euc_kr"), ("ks_c_5601-1987", "cp949"),
    ("windows-874", "cp874"), ('"utf-8"', "utf-8"),
])
def test_charsets_mail_is_written_in_are_used(charset: str, codec: str) -> None:
    assert limits.text_codec(charset) == codec


def test_a_disallowed_charset_is_decoded_with_replacement_and_said() -> None:
    assert "charset" in minimise(by_name("punycode_body").raw).limits_hit
    # "mnchen-3ya" is "münchen" in punycode: shown as the bytes it is, never decoded so
    raw = (b"From: a@initech.example\r\nSubject: =?punycode?q?mnchen-3ya?=\r\n"
           b"Content-Type: text/plain; charset=punycode\r\n\r\nmnchen-3ya\r\n")
    message = minimise(raw)
    assert message.headers["Subject"] == "mnchen-3ya"
    assert message.body == "mnchen-3ya" and message.limits_hit == ["charset"]


def test_combining_mark_runs_are_capped_before_normalisation() -> None:
    text = "a" + "\u0301\u0316" * 1000 + "b"
    capped = limits.cap_combining_runs(text)
    assert capped.startswith("a") and capped.endswith("b")
    assert len(capped) == 2 + limits.MAX_COMBINING_RUN
    assert limits.cap_combining_runs("plain ascii") == "plain ascii"
    assert limits.cap_combining_runs("Müller, São Paulo") == "Müller, São Paulo"


def test_the_non_starter_class_matches_this_pythons_unicode_tables() -> None:
    """Every code point that starts a run of non-starters after NFKD is in the class (the
    scan covers every plane, the class is built from the first two)."""
    import re

    pattern = re.compile(f"[{limits.NON_STARTERS}]")
    for cp in range(0x110000):
        ch = chr(cp)
        starts_run = unicodedata.combining(ch) or (
            unicodedata.decomposition(ch)
            and unicodedata.combining(unicodedata.normalize("NFKD", ch)[0]))
        assert bool(pattern.match(ch)) == bool(starts_run), hex(cp)


@pytest.mark.parametrize(("html", "kept"), [
    ("<p>hello</p><!--a<!--a<!--a", "<p>hello</p>"),
    ("<p>hello</p><!-- fine --><b>x</b>", "<p>hello</p><!-- fine --><b>x</b>"),
    ("<p>hello</p><a href='x'", "<p>hello</p>"),
    ("<p>hello</p><a<a<a", "<p>hello</p>"),
    ("a < b and c > d", "a < b and c > d"),
    ("<p>1 < 2</p>", "<p>1 < 2</p>"),
])
def test_html_loses_only_its_unterminated_tail(html: str, kept: str) -> None:
    assert limits.terminated_html(html) == kept


# --------------------------------------------------------------------------- the hard limit


@pytest.fixture
async def tight_pool() -> AsyncIterator[WorkPool]:
    """The extraction pool with a time limit no pathological message can meet."""
    settings = Settings(work_time_limit_seconds=0.02, work_memory_limit_mb=1024)
    async with work_pool(settings, 1) as pool:
        yield pool


async def test_extraction_over_the_time_limit_is_killed_and_goes_to_review(
        globex: TenantPolicy, tight_pool: WorkPool) -> None:
    raw = by_name("end_tag_flood").raw  # ~0.2 s of honest work: ten times the limit
    outcome = await extract_and_route(raw, globex, runner=tight_pool)
    assert outcome.route == "review" and outcome.reasons == ["too_complex"]
    assert outcome.canonical_email is None and outcome.extraction.needs_human_review
    assert tight_pool.stats.killed == 1
    # the next (ordinary) message is not held up by what happened
    ordinary = (b"From: Jane Doe <jane@initech.example>\r\nTo: hello@globex.test\r\n"
                b"Subject: Hi\r\n\r\nHi\r\n")
    for _ in range(50):  # the replacement child may still be starting
        if (await extract_and_route(ordinary, globex, runner=tight_pool)).reasons != [
                "too_complex"]:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the pool never recovered")


async def test_extraction_through_the_pool_matches_in_process(globex: TenantPolicy) -> None:
    settings = Settings(work_time_limit_seconds=10)
    messages = [case.raw for case in CORPUS[:30]] + [by_name("part_flood").raw]
    async with work_pool(settings, 1) as pool:
        for raw in messages:
            pooled = await extract_and_route(raw, globex, runner=pool)
            assert pooled == await extract_and_route(raw, globex)


async def test_the_review_card_shows_a_message_over_budget_without_reading_it(
        globex: TenantPolicy) -> None:
    class OverBudget:
        async def run(self, *_: object, **__: object) -> object:
            raise BudgetExceeded("time", 5.0)

        def for_tenant(self, tenant: str) -> OverBudget:
            return self

    card = ReviewCard(workflow_id="w", tenant="globex", source="standard", mailbox="m",
                      state="awaiting_review", reason="too_complex", reasons=["too_complex"],
                      waiting=True)
    await _message(card, by_name("comment_flood").raw, ["too_complex"], {}, OverBudget())  # type: ignore[arg-type]
    assert card.lines == [] and card.truncated
    assert any("work budget" in value for _, value in card.headers)
    message, auth = view_message(by_name("part_flood").raw, globex, "standard")
    assert message.too_complex == "parts" and auth is not None


async def test_shadow_modes_second_opinion_runs_under_the_budget_too(
        globex: TenantPolicy, tight_pool: WorkPool) -> None:
    """A shadowed item's second extractor reads the message through the same pool: a
    pathological message costs a child its time limit, never the worker's loop."""
    from inboxcrm.domain.extraction.rules import RulesExtractor
    from inboxcrm.domain.shadow import second_opinion

    opinion = await second_opinion(by_name("end_tag_flood").raw, globex, "standard", "auto",
                                   RulesExtractor(), tight_pool)
    assert opinion["route"] == "review" and opinion["reasons"] == ["too_complex"]
    assert opinion["differs"] is True and tight_pool.stats.killed == 1
