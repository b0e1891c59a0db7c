"""Upstream spam verdicts in every common dialect (inboxcrm/domain/extraction/spam.py): a
header a sender could write may only make a message less trusted. Messages on `globex`
(production defaults), authenticated by its trusted boundary, so only the verdict decides."""

from __future__ import annotations

import pytest

from inboxcrm.domain.extraction import extract_and_route
from inboxcrm.domain.extraction.spam import spam_verdict
from inboxcrm.domain.policy import TenantPolicy, get_policy
from tests.helpers.corpus import mail

TRUSTED_DMARC = ("Authentication-Results", "mx.globex.test; spf=pass smtp.mailfrom=initech."
                 "example; dkim=pass header.d=initech.example; dmarc=pass "
                 "header.from=initech.example")


@pytest.fixture
def globex(monkeypatch: pytest.MonkeyPatch) -> TenantPolicy:
    monkeypatch.delenv("INBOXCRM_POLICY_DIR", raising=False)
    return get_policy("globex")


def inquiry(*headers: tuple[str, str]) -> bytes:
    return mail(from_="Jane Doe <jane@initech.example>", to="hello@globex.test",
                subject="Pricing", headers=(TRUSTED_DMARC, *headers),
                body="Hello,\n\nWhat does the team plan cost for 20 seats?\n\nJane Doe\nInitech")


SPAM = [
    # SpamAssassin
    [("X-Spam-Flag", "YES")],
    [("X-Spam-Status", "Yes, score=7.1 required=5.0 tests=BAYES_99")],
    [("X-Spam-Level", "*******")],
    [("X-Spam-Score", "7.1")],
    # Exim's spamd ACL headers (the message: X-Spam_score 7.1 went auto)
    [("X-Spam_score", "7.1"), ("X-Spam_score_int", "71"), ("X-Spam_bar", "+++++++")],
    [("X-Spam_score_int", "71")],
    [("X-Spam_bar", "+++++++")],
    [("X-Spam-Bar", "++++++")],
    # rspamd
    [("X-Spamd-Result", "default: True [16.20 / 15.00]; BAYES_SPAM(5.10)[99.99%]")],
    [("X-Spamd-Result", "default: False [7.10 / 15.00]; R_SPF_FAIL(1.00)[-all]")],
    [("X-Rspamd-Score", "7.10")],
    [("X-Spam", "Yes")],
    [("X-Spamd-Bar", "+++++++")],
    [("X-Rspamd-Action", "add header")],
    # providers and suites
    [("X-Mailgun-Sflag", "Yes")],
    [("X-Mailgun-Sscore", "9.2")],
    [("X-PM-Spam-Score", "6")],
    [("X-MS-Exchange-Organization-SCL", "6")],
    [("X-Forefront-Antispam-Report", "CIP:192.0.2.1;CTRY:;LANG:en;SCL:9;SRV:;IPV:NLI;"
                                     "SFV:SPM;H:mail.example;PTR:;CAT:SPM;SFS:;DIR:INB;")],
]
NOT_SPAM = [
    [("X-Spam-Status", "No, score=1.2 required=5.0")],
    [("X-Spam-Level", "*")],
    [("X-Spam_score", "-0.1"), ("X-Spam_score_int", "-1"), ("X-Spam_bar", "/")],
    [("X-Spamd-Result", "default: False [1.20 / 15.00]; ARC_NA(0.00)[]")],
    [("X-Rspamd-Score", "2.5"), ("X-Spam", "No"), ("X-Rspamd-Action", "no action")],
    [("X-Mailgun-Sflag", "No"), ("X-Mailgun-Sscore", "0.1")],
    [("X-MS-Exchange-Organization-SCL", "-1")],
    [("X-Forefront-Antispam-Report", "CIP:192.0.2.1;SCL:1;SFV:NSPM;CAT:NONE;DIR:INB;")],
]


@pytest.mark.parametrize("headers", SPAM, ids=lambda h: h[0][0])
async def test_every_dialects_spam_verdict_keeps_the_message_from_auto(
        globex: TenantPolicy, headers: list[tuple[str, str]]) -> None:
    for source in ("standard", "postmark", "mailgun"):
        outcome = await extract_and_route(inquiry(*headers), globex, source=source)
        assert outcome.route == "ignore" and "upstream_spam" in outcome.reasons, (
            source, outcome.reasons)


@pytest.mark.parametrize("headers", NOT_SPAM, ids=lambda h: h[0][0])
async def test_a_clean_verdict_below_the_threshold_leaves_the_message_alone(
        globex: TenantPolicy, headers: list[tuple[str, str]]) -> None:
    outcome = await extract_and_route(inquiry(*headers), globex)
    assert outcome.route == "auto", outcome.reasons


async def test_a_clean_verdict_never_rescues_a_spam_verdict(globex: TenantPolicy) -> None:
    """The sender writes "not spam" on top of (or below) the filter's verdict: the spam
    verdict still counts, whichever comes first."""
    clean = [("X-Spam-Status", "No, score=-5.0"), ("X-Spam-Flag", "NO"),
             ("X-Spamd-Result", "default: False [-9.00 / 15.00]"), ("X-Spam", "No")]
    for spam in SPAM:
        for headers in (clean + spam, spam + clean):
            outcome = await extract_and_route(inquiry(*headers), globex)
            assert outcome.route == "ignore", (headers, outcome.reasons)


async def test_a_spam_verdict_repeated_lower_down_still_counts(globex: TenantPolicy) -> None:
    headers = [("X-Spam_score", "0.0")] * 5 + [("X-Spam_score", "7.1")]
    assert (await extract_and_route(inquiry(*headers), globex)).route == "ignore"


async def test_the_tenant_chooses_review_instead_of_ignore(globex: TenantPolicy) -> None:
    reviewing = globex.model_copy(update={"spam_action": "review"})
    outcome = await extract_and_route(inquiry(("X-Spam_score", "7.1")), reviewing)
    assert outcome.route == "review" and "upstream_spam" in outcome.reasons
    clean = await extract_and_route(inquiry(("X-Spam_score", "1.0")), reviewing)
    assert clean.route == "auto"


async def test_the_tenant_threshold_applies_to_every_scored_dialect(
        globex: TenantPolicy) -> None:
    lenient = globex.model_copy(update={"spam_score_threshold": 8.0})
    for header in (("X-Spam_score", "7.1"), ("X-Spam_score_int", "71"),
                   ("X-Rspamd-Score", "7.1"), ("X-Spamd-Result", "default: False [7.1 / 15]"),
                   ("X-Spam-Level", "*******"), ("X-Mailgun-Sscore", "7.1")):
        assert (await extract_and_route(inquiry(header), lenient)).route == "auto", header
        assert (await extract_and_route(inquiry(header), globex)).route == "ignore", header


def test_verdict_names_the_header_that_decided() -> None:
    verdict = spam_verdict([("X-Spam-Status", "No, score=0.1"), ("X-Spam_score_int", "71")], 5)
    assert verdict.spam and verdict.header == "X-Spam_score_int" and verdict.score == 7.1
    assert not spam_verdict([("X-Spam-Status", "garbage=9 score=x")], 5).spam
