"""Real mail as a mail administrator sees it (issue 15): sender authentication from the
trusted boundary only, spam and bulk verdicts, bounces and reports, forwards and replies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inboxcrm.cli.extract import run_extract_command
from inboxcrm.domain.extraction import extract_and_route, minimise
from inboxcrm.domain.policy import TenantPolicy, get_policy
from tests.helpers.corpus import mail
from tests.helpers.reports import arf_complaint, dsn_bounce

GLOBEX = "hello@globex.test"
PROSPECT = "Jane Doe <jane@initech.example>"
ASK = "Hello,\n\nWhat does the team plan cost for 20 seats?\n\nJane Doe\nInitech"


@pytest.fixture
def globex(monkeypatch: pytest.MonkeyPatch) -> TenantPolicy:
    monkeypatch.delenv("INBOXCRM_POLICY_DIR", raising=False)
    return get_policy("globex")


def inquiry(*headers: tuple[str, str], from_: str = PROSPECT, body: str = ASK,
            subject: str = "Pricing") -> bytes:
    return mail(from_=from_, to=GLOBEX, subject=subject, body=body, headers=headers)


def results(authserv: str, spec: str) -> tuple[str, str]:
    return ("Authentication-Results", f"{authserv}; {spec}")


TRUSTED_DMARC = results("mx.globex.test", "spf=pass smtp.mailfrom=initech.example; "
                        "dkim=pass header.d=initech.example; "
                        "dmarc=pass header.from=initech.example")


# --------------------------------------------------------------------------- authentication

def test_globex_is_the_production_default_tenant(globex: TenantPolicy) -> None:
    assert globex.mailboxes == [GLOBEX] and globex.domains == ["globex.test"]
    assert globex.sender_authentication == "required"
    assert globex.trusted_authserv_ids == ["mx.globex.test"]
    assert all(rule.new_prospect_requires_approval for rule in globex.followup_rules)
    assert get_policy("acme").sender_authentication == "off"


async def test_trusted_dmarc_pass_is_authenticated(globex: TenantPolicy) -> None:
    outcome = await extract_and_route(inquiry(TRUSTED_DMARC), globex)
    assert outcome.route == "auto", outcome.reasons
    assert outcome.authentication["verdict"] == "pass"
    assert outcome.authentication["method"] == "dmarc"
    assert outcome.authentication["authority"] == "mx.globex.test"


@pytest.mark.parametrize(("spec", "method"), [
    ("spf=pass smtp.mailfrom=bounce.initech.example", "spf"),
    ("dkim=pass header.d=initech.example; spf=fail smtp.mailfrom=x.example", "dkim"),
])
async def test_aligned_spf_or_dkim_pass_is_authenticated(
    globex: TenantPolicy, spec: str, method: str,
) -> None:
    outcome = await extract_and_route(inquiry(results("mx.globex.test", spec)), globex)
    assert outcome.route == "auto", outcome.reasons
    assert outcome.authentication["method"] == method


@pytest.mark.parametrize(("headers", "reason"), [
    # nothing at all
    ((), "sender_auth_missing"),
    # the sender wrote a pass under an authserv-id the tenant does not trust
    ((results("mx.attacker.example", "dmarc=pass header.from=initech.example"),),
     "sender_auth_untrusted"),
    # a forged trusted-looking header *below* the boundary's own fail: the topmost counts
    ((results("mx.globex.test", "spf=fail smtp.mailfrom=initech.example; dmarc=fail "
                                "header.from=initech.example"),
      results("mx.globex.test", "dmarc=pass header.from=initech.example")),
     "sender_auth_failed"),
    ((results("mx.globex.test", "spf=softfail smtp.mailfrom=initech.example"),),
     "sender_auth_failed"),
    # a genuine pass, but for the spammer's own domain
    ((results("mx.globex.test", "spf=pass smtp.mailfrom=spam.example; "
                                "dkim=pass header.d=spam.example"),),
     "sender_auth_misaligned"),
    # a one-label parent domain never aligns
    ((results("mx.globex.test", "dkim=pass header.d=example"),), "sender_auth_misaligned"),
    # provider headers arriving through the standard webhook: the sender may have written them
    ((("X-Mailgun-Spf", "Pass"), ("X-Mailgun-Dkim-Check-Result", "Pass"),
      ("Received-SPF", "Pass (sender SPF authorized) envelope-from=jane@initech.example")),
     "sender_auth_missing"),
    # unparseable results under the trusted ID count as none
    ((results("mx.globex.test", "((("),), "sender_auth_untrusted"),
])
async def test_unauthenticated_sender_goes_to_review_with_the_reason(
    globex: TenantPolicy, headers: tuple[tuple[str, str], ...], reason: str,
) -> None:
    outcome = await extract_and_route(inquiry(*headers), globex)
    assert outcome.route == "review"
    assert reason in outcome.reasons
    assert outcome.authentication["verdict"] != "pass"
    assert outcome.authentication["reason"] == reason


async def test_mailgun_verdict_counts_on_the_mailgun_source_only(globex: TenantPolicy) -> None:
    raw = inquiry(("X-Mailgun-Spf", "Pass"), ("X-Envelope-From", "<jane@initech.example>"))
    via_mailgun = await extract_and_route(raw, globex, source="mailgun")
    assert via_mailgun.route == "auto", via_mailgun.reasons
    assert via_mailgun.authentication["authority"] == "mailgun"
    via_standard = await extract_and_route(raw, globex, source="standard")
    assert via_standard.route == "review"
    misaligned = inquiry(("X-Mailgun-Dkim-Check-Result", "Pass"),
                         ("DKIM-Signature", "v=1; a=rsa-sha256; d=spam.example; s=k; b=x"))
    outcome = await extract_and_route(misaligned, globex, source="mailgun")
    assert "sender_auth_misaligned" in outcome.reasons


async def test_postmark_received_spf_counts_on_the_postmark_source_only(
    globex: TenantPolicy,
) -> None:
    raw = inquiry(("Received-SPF", "Pass (sender SPF authorized) identity=mailfrom; "
                                   "client-ip=192.0.2.1; envelope-from=jane@initech.example"))
    assert (await extract_and_route(raw, globex, source="postmark")).route == "auto"
    assert (await extract_and_route(raw, globex, source="mailgun")).route == "review"


async def test_prefer_mode_only_stops_explicit_failures(globex: TenantPolicy) -> None:
    prefer = globex.model_copy(update={"sender_authentication": "prefer"})
    assert (await extract_and_route(inquiry(), prefer)).route == "auto"
    failing = inquiry(results("mx.globex.test", "dmarc=fail header.from=initech.example"))
    outcome = await extract_and_route(failing, prefer)
    assert outcome.route == "review" and "sender_auth_failed" in outcome.reasons
    off = globex.model_copy(update={"sender_authentication": "off"})
    assert (await extract_and_route(failing, off)).route == "auto"


async def test_opt_out_is_honoured_without_authentication(globex: TenantPolicy) -> None:
    """Fewer emails is the safe direction: an opt-out never waits for a verdict."""
    outcome = await extract_and_route(inquiry(body="Please unsubscribe me.\n\nJane"), globex)
    assert outcome.route == "opt_out"


def test_cli_shows_the_verdict_and_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("INBOXCRM_POLICY_DIR", raising=False)
    path = tmp_path / "forged.eml"
    path.write_bytes(inquiry(results("mx.attacker.example", "dmarc=pass")))
    assert run_extract_command(path, "globex", True) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"extraction", "route", "reasons", "canonical_email"} <= set(doc)
    assert doc["route"] == "review"
    assert doc["authentication"]["verdict"] == "none"
    assert doc["authentication"]["reason"] == "sender_auth_untrusted"
    assert "sender_auth_untrusted" in doc["reasons"]


# --------------------------------------------------------------------------- spam and bulk

@pytest.mark.parametrize("header", [
    ("X-Spam-Flag", "YES"),
    ("X-Spam-Status", "Yes, score=7.1 required=5.0 tests=BAYES_99"),
    ("X-Spam-Status", "No, score=6.3 required=8.0"),  # the tenant's threshold (5) decides
    ("X-Spam_score", "7.1"),
    ("X-Spam-Score", "5.0"),
])
async def test_upstream_spam_verdict_is_ignored(globex: TenantPolicy,
                                                header: tuple[str, str]) -> None:
    outcome = await extract_and_route(inquiry(TRUSTED_DMARC, header), globex)
    assert outcome.route == "ignore" and "upstream_spam" in outcome.reasons


async def test_spam_threshold_is_per_tenant(globex: TenantPolicy) -> None:
    raw = inquiry(TRUSTED_DMARC, ("X-Spam-Score", "4.2"))
    assert (await extract_and_route(raw, globex)).route == "auto"
    strict = globex.model_copy(update={"spam_score_threshold": 4.0})
    assert (await extract_and_route(raw, strict)).route == "ignore"


async def test_mailgun_spam_flag_counts_on_the_mailgun_source(globex: TenantPolicy) -> None:
    raw = inquiry(TRUSTED_DMARC, ("X-Mailgun-Sflag", "Yes"))
    assert (await extract_and_route(raw, globex, source="mailgun")).route == "ignore"


async def test_forwarders_precedence_bulk_on_a_human_reply_goes_to_review(
    globex: TenantPolicy,
) -> None:
    outcome = await extract_and_route(inquiry(TRUSTED_DMARC, ("Precedence", "bulk")), globex)
    assert outcome.route == "review" and "bulk_precedence" in outcome.reasons


@pytest.mark.parametrize("headers", [
    (("List-Unsubscribe", "<https://news.example/u>"), ("Feedback-ID", "a:b:c:esp")),
    (("List-Id", "<news.initech.example>"),),
    (("Precedence", "bulk"), ("X-Mailer", "MailChimp Mailer")),
])
async def test_clear_bulk_mail_is_ignored(globex: TenantPolicy,
                                          headers: tuple[tuple[str, str], ...]) -> None:
    outcome = await extract_and_route(inquiry(TRUSTED_DMARC, *headers), globex)
    assert outcome.route == "ignore", outcome.reasons


async def test_one_weak_bulk_signal_goes_to_review(globex: TenantPolicy) -> None:
    outcome = await extract_and_route(
        inquiry(TRUSTED_DMARC, ("List-Unsubscribe", "<https://x.example/u>")), globex)
    assert outcome.route == "review" and "bulk_suspected" in outcome.reasons
    undisclosed = mail(from_=PROSPECT, to="undisclosed-recipients:;", subject="Pricing",
                       body=ASK, headers=[TRUSTED_DMARC])
    outcome = await extract_and_route(undisclosed, globex)
    assert outcome.route == "review" and "bulk_suspected" in outcome.reasons


# --------------------------------------------------------------------------- reports

def test_dsn_hard_bounce_names_the_failed_recipient() -> None:
    report = minimise(dsn_bounce("gone@initech.example").encode()).report
    assert report is not None and report.kind == "dsn"
    assert report.recipients == ["gone@initech.example"] and report.suppresses == "bounced"


def test_dsn_soft_bounce_and_delay_suppress_nothing() -> None:
    soft = minimise(dsn_bounce("full@initech.example", status="4.2.2").encode()).report
    assert soft is not None and soft.suppresses is None
    delay = minimise(dsn_bounce("x@initech.example", action="delayed", status="4.4.7")
                     .encode()).report
    assert delay is not None and delay.kind == "delay" and delay.suppresses is None


def test_arf_report_names_the_complainant() -> None:
    report = minimise(arf_complaint("angry@initech.example").encode()).report
    assert report is not None and report.kind == "arf" and report.feedback_type == "abuse"
    assert report.recipients == ["angry@initech.example"] and report.suppresses == "complaint"


async def test_reports_are_ignored_with_suppression_candidates(globex: TenantPolicy) -> None:
    bounce = await extract_and_route(dsn_bounce("gone@initech.example", mailbox=GLOBEX)
                                     .encode(), globex)
    assert bounce.route == "ignore"
    assert bounce.suppression_candidates == {"reason": "bounced",
                                             "recipients": ["gone@initech.example"]}
    complaint = await extract_and_route(arf_complaint("a@initech.example").encode(), globex)
    assert complaint.route == "ignore" and "abuse_report" in complaint.reasons
    assert complaint.suppression_candidates == {"reason": "complaint",
                                                "recipients": ["a@initech.example"]}


NON_STANDARD_BOUNCE = (
    "From: Mail Delivery Subsystem <mdaemon@mx.example.net>\r\nTo: hello@globex.test\r\n"
    "Subject: Delivery failure\r\n\r\n"
    "Hi. This is the qmail-send program at mx.example.net.\r\n"
    "I'm afraid I wasn't able to deliver your message to the following addresses.\r\n"
    "This is a permanent error; I've given up. Sorry it didn't work out.\r\n\r\n"
    "<gone@initech.example>:\r\nSorry, no mailbox here by that name. (#5.1.1)\r\n\r\n"
    "--- Below this line is a copy of the message.\r\n\r\nFrom: hello@globex.test\r\n"
)


async def test_non_standard_bounce_found_by_the_detector(globex: TenantPolicy) -> None:
    report = minimise(NON_STANDARD_BOUNCE.encode()).report
    assert report is not None and report.kind == "bounce"
    assert report.recipients == ["gone@initech.example"]
    outcome = await extract_and_route(NON_STANDARD_BOUNCE.encode(), globex)
    assert outcome.route == "ignore" and outcome.suppression_candidates is not None


@pytest.mark.parametrize("subject", ["Undeliverable: Pricing", "Returned mail: see transcript",
                                     "Delivery failure", "Non remis : Pricing",
                                     "Unzustellbar: Pricing"])
async def test_bounce_subjects_are_reports_even_without_a_daemon_sender(
    subject: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("INBOXCRM_POLICY_DIR", raising=False)
    raw = mail(from_="System <system-notices@mx.example.net>", subject=subject,
               body="Your message to <someone@initech.example> could not be delivered.")
    outcome = await extract_and_route(raw, get_policy("acme"))
    assert outcome.route == "ignore", outcome.reasons


async def test_ses_bounce_notification_is_a_report(globex: TenantPolicy) -> None:
    body = json.dumps({"notificationType": "Bounce", "bounce": {
        "bounceType": "Permanent",
        "bouncedRecipients": [{"emailAddress": "gone@initech.example"}]}})
    raw = mail(from_="AWS Notifications <no-reply@sns.amazonaws.com>",
               subject="AWS Notification Message", body=body)
    outcome = await extract_and_route(raw, globex)
    assert outcome.route == "ignore"
    assert outcome.suppression_candidates == {"reason": "bounced",
                                              "recipients": ["gone@initech.example"]}


# --------------------------------------------------------------------------- forwards

def _attached(inner: bytes, content_type: str) -> bytes:
    return (
        b"From: Jane Doe <jane@initech.example>\r\nTo: hello@globex.test\r\n"
        b"Subject: Fwd: Pricing\r\nMIME-Version: 1.0\r\n"
        b'Content-Type: multipart/mixed; boundary="M"\r\n\r\n'
        b"--M\r\nContent-Type: text/plain\r\n\r\nSee the attached message.\r\n"
        b"--M\r\nContent-Type: " + content_type.encode() + b"\r\n\r\n" + inner
        + b"\r\n--M--\r\n")


async def test_message_global_is_a_forward_like_message_rfc822(globex: TenantPolicy) -> None:
    inner = ("From: Dana Müller <dana@müller.example>\r\nTo: jane@initech.example\r\n"
             "Subject: Preise\r\n\r\nWas kostet das Team-Paket?\r\n").encode()
    routes = []
    for ctype in ("message/rfc822", "message/global"):
        outcome = await extract_and_route(_attached(inner, ctype), globex)
        assert minimise(_attached(inner, ctype)).forwarded
        routes.append((outcome.route, "forwarded_sender_mismatch" in outcome.reasons))
    assert routes == [("review", True), ("review", True)]


async def test_colleague_forwarding_a_prospect_is_proposed_for_review(
    globex: TenantPolicy,
) -> None:
    raw = mail(from_="Carla <carla@globex.test>", to=GLOBEX, subject="Fwd: Pricing",
               body="Can someone follow up?\n\n---------- Forwarded message ---------\n"
                    "From: Jane Doe <jane@initech.example>\nDate: Mon, 3 Jun 2024\n"
                    "Subject: Pricing\n\nWhat does it cost?\n")
    outcome = await extract_and_route(raw, globex)
    assert outcome.route == "review"
    assert "internal_forward" in outcome.reasons and "own_domain" not in outcome.reasons
    assert outcome.canonical_email == "jane@initech.example"
    assert outcome.extraction.sender_email.value == "jane@initech.example"


async def test_colleague_mail_without_a_forward_is_still_a_loop(globex: TenantPolicy) -> None:
    raw = mail(from_="Carla <carla@globex.test>", to=GLOBEX, subject="Lunch", body="Lunch?")
    assert (await extract_and_route(raw, globex)).reasons == ["own_domain"]


async def test_empty_body_goes_to_review(globex: TenantPolicy) -> None:
    outcome = await extract_and_route(inquiry(TRUSTED_DMARC, body=""), globex)
    assert outcome.route == "review" and "empty_message" in outcome.reasons


@pytest.mark.parametrize("attribution", [
    "12 мая 2024 г., в 10:00, Пётр Иванов <petr@rival.example> написал:",
    "Am 12.05.2024 um 10:00 schrieb Petr Ivanov <petr@rival.example>:",
    "Le 12 mai 2024 à 10:00, Petr Ivanov <petr@rival.example> a écrit :",
    "El 12 may 2024, a las 10:00, Petr Ivanov <petr@rival.example> escribió:",
    "W dniu 12.05.2024 o 10:00 Petr Ivanov <petr@rival.example> napisał:",
    "Den 12 maj 2024 kl. 10:00 skrev Petr Ivanov <petr@rival.example>:",
])
async def test_quoted_reply_is_stripped_in_many_languages(
    globex: TenantPolicy, attribution: str,
) -> None:
    body = f"Yes, please send the offer.\n\nJane Doe\n\n{attribution}\n> Our prices...\n"
    outcome = await extract_and_route(inquiry(TRUSTED_DMARC, body=body,
                                              subject="Re: Pricing"), globex)
    assert "different_contact_address" not in outcome.reasons
    assert outcome.route == "auto", outcome.reasons


async def test_bottom_posted_reply_keeps_the_writers_text(globex: TenantPolicy) -> None:
    body = "On 04/02/2012 06:26 PM, Petr wrote:\n> Hi\n\nHello, what does it cost?\n"
    msg = minimise(inquiry(body=body, subject="Re: Test"))
    assert "what does it cost" in msg.own_text and "> Hi" not in msg.own_text
