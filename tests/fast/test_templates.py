"""Each tenant's own words (docs/architecture.md §5): templates load from the tenant's policy
folder, refuse without the opt-out link or the postal address (naming the file and what is
missing), render only documented fields in jinja2's sandbox, choose the message's language,
and a changed word is a new rule version. `inboxcrm template preview` shows what would be
sent and writes nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from inboxcrm.domain.extraction import extract_with_rules
from inboxcrm.domain.followup import FollowupRefused, compose
from inboxcrm.domain.policy import PolicyError, TenantPolicy, load_policies
from inboxcrm.domain.templates import Fields as TemplateFields
from inboxcrm.domain.templates import (
    LanguageSource,
    build,
    from_sources,
    message_languages,
    render,
    reply_languages,
)
from inboxcrm.platform.config import Settings

ROOT = Path(__file__).resolve().parents[2]
GOOD_TEXT = ("Hello {{ first_name or 'there' }},\nthanks.\n{{ signature }}\n--\n"
             "{{ postal_address }}\nOpt out: {{ opt_out_url }}\n")


def _tenant(directory: Path, name: str = "north", *, text: str = GOOD_TEXT,
            subject: str = "Thanks, {{ first_name or 'friend' }}", html: str | None = None,
            policy: dict[str, object] | None = None) -> Path:
    """A tenant's policy file and its `ack` template in `directory`."""
    data: dict[str, object] = {
        "tenant": name, "mailboxes": [f"sales@{name}.test"], "domains": [f"{name}.test"],
        "followup_rules": [{"rule_id": "ack", "version": 1, "intents": ["pricing_request"],
                            "template_id": "ack"}],
        "sender_authentication": "off",
        "sender": {"from": f"North Sales <sales@{name}.test>",
                   "reply_to": f"team@{name}.test",
                   "postal_address": "North Ltd., 1 Fjord Road, 0150 Oslo, Norway",
                   "signature": "The North team"},
        **(policy or {}),
    }
    (directory / f"{name}.json").write_text(json.dumps(data), encoding="utf-8")
    folder = directory / name / "templates"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ack.en.subject").write_text(subject + "\n", encoding="utf-8")
    (folder / "ack.en.txt").write_text(text, encoding="utf-8")
    if html is not None:
        (folder / "ack.en.html").write_text(html, encoding="utf-8")
    return folder


def _settings(**values: object) -> Settings:
    return Settings(unsubscribe_secret="test-unsubscribe-secret-of-32-bytes-or-more",  # type: ignore[arg-type]
                    public_relay_url="https://relay.example", **values)  # type: ignore[arg-type]


def _refusal(directory: Path) -> str:
    with pytest.raises(PolicyError) as info:
        load_policies(directory)
    return str(info.value)


# --- loading and refusing ------------------------------------------------------------------
def test_the_shipped_tenants_have_their_own_words() -> None:
    policies = load_policies(ROOT / "policies")
    acme, globex = policies["acme"], policies["globex"]
    acme_ack = acme.template_for(acme.followup_rules[0])
    globex_ack = globex.template_for(globex.followup_rules[0])
    assert set(acme_ack.languages) == {"en", "de"} and set(globex_ack.languages) == {"en"}
    assert globex_ack.languages["en"].html is not None
    assert acme_ack.version != globex_ack.version
    assert acme.sender.from_address != globex.sender.from_address
    assert all(p.sender.postal_address for p in policies.values() if p.followup_rules)


@pytest.mark.parametrize(("text", "missing"), [
    ("Hello\n{{ postal_address }}\n", "the opt-out link ({{ opt_out_url }})"),
    ("Hello\nStop: {{ opt_out_url }}\n", "the sender's postal address ({{ postal_address }})"),
    ("Hello\n", "the opt-out link ({{ opt_out_url }}) and the sender's postal address"),
    # Hidden behind a condition that is false when the name is unknown: still refused.
    ("Hi\n{% if first_name %}{{ opt_out_url }}{% endif %}\n{{ postal_address }}\n",
     "the opt-out link ({{ opt_out_url }}) when the first name is unknown"),
    # A comment is not the link.
    ("Hi {# {{ opt_out_url }} #}\n{{ postal_address }}\n", "the opt-out link"),
])
def test_a_template_without_the_opt_out_link_or_postal_address_refuses_to_load(
        tmp_path: Path, text: str, missing: str) -> None:
    _tenant(tmp_path, text=text)
    message = _refusal(tmp_path)
    assert "north/templates/ack.en.txt" in message
    assert missing in message


def test_the_html_body_needs_them_too(tmp_path: Path) -> None:
    _tenant(tmp_path, html="<p>Hello {{ first_name }}</p><p>{{ postal_address }}</p>")
    message = _refusal(tmp_path)
    assert "ack.en.html" in message and "opt-out link" in message


@pytest.mark.parametrize(("text", "problem"), [
    (GOOD_TEXT + "{{ email }}\n", "uses email, which is not a documented field"),
    (GOOD_TEXT + "{{ contact.secret_notes }}\n", "uses contact"),
    (GOOD_TEXT + "{% for x in %}\n", "does not compile (line 7)"),
    (GOOD_TEXT + "{{ ''.__class__.__mro__ }}\n", "cannot render"),
    (GOOD_TEXT + "{{ signature.__class__ }}\n", "cannot render"),
])
def test_only_documented_fields_and_nothing_outside_the_sandbox(
        tmp_path: Path, text: str, problem: str) -> None:
    _tenant(tmp_path, text=text)
    message = _refusal(tmp_path)
    assert "ack.en.txt" in message and problem in message


@pytest.mark.parametrize(("mutate", "problem"), [
    (lambda f: (f / "ack.en.txt").unlink(), "ack.en.txt: missing"),
    (lambda f: (f / "ack.en.subject").write_text("a\n{% if 1 %}\nb\n{% endif %}"),
     "the subject must be one non-empty line"),
    (lambda f: (f / "Ack.EN.txt").write_text(GOOD_TEXT), "the name must be"),
    (lambda f: shutil.rmtree(f), "uses template 'ack', which is not in"),
])
def test_a_broken_template_folder_names_the_file(
        tmp_path: Path, mutate: object, problem: str) -> None:
    folder = _tenant(tmp_path)
    mutate(folder)  # type: ignore[operator]
    message = _refusal(tmp_path)
    assert problem in message and "north" in message


def test_the_postal_address_and_default_language_are_required(tmp_path: Path) -> None:
    _tenant(tmp_path, policy={"sender": {"signature": "x"}})
    assert "sender.postal_address is required" in _refusal(tmp_path)
    _tenant(tmp_path, policy={"default_language": "fr"})
    assert "has no 'fr' version" in _refusal(tmp_path)


@pytest.mark.parametrize("destinations", [
    {"crm": {"provider": "hubspot", "token": "pat-na1-SECRET-VALUE"}},
    {"mail": {"provider": "resend", "token": "re_SECRET-VALUE"}},
    {"crm": {"provider": "salesforce", "url": "https://x.my.salesforce.com",
             "oauth": {"client_id": "3MVG9", "client_secret": "SECRET-VALUE"}}},
    {"mail": {"provider": "smtp", "smtp_host": "smtp.example", "smtp_password": "SECRET-VALUE"}},
])
def test_a_secret_written_into_the_policy_refuses_to_load(
        tmp_path: Path, destinations: dict[str, object]) -> None:
    _tenant(tmp_path, policy={"destinations": destinations})
    message = _refusal(tmp_path)
    assert "north.json" in message and "never inline in the policy file" in message
    assert "SECRET-VALUE" not in message


def test_destinations_by_reference_load(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INBOXCRM_TENANT_SECRETS_DIR", "/run/secrets")
    _tenant(tmp_path, policy={"destinations": {
        "crm": {"provider": "salesforce", "url": "https://north.my.salesforce.com",
                "oauth": {"client_id": "3MVG9",
                          "client_secret": {"env": "INBOXCRM_TENANT_NORTH_SF_SECRET"}}},
        "mail": {"provider": "resend", "token": {"file": "/run/secrets/north/resend"}}}})
    north = load_policies(tmp_path)["north"]
    assert north.destinations.crm is not None and north.destinations.crm.oauth is not None
    assert north.destinations.mail is not None and north.destinations.mail.token is not None
    assert north.destinations.mail.token.file == "/run/secrets/north/resend"


# --- versions ------------------------------------------------------------------------------
def test_a_changed_word_is_a_new_rule_version(tmp_path: Path) -> None:
    folder = _tenant(tmp_path)
    first = load_policies(tmp_path)["north"]
    rule = first.followup_rules[0]
    again = load_policies(tmp_path)["north"]
    assert again.rule_version(again.followup_rules[0]) == first.rule_version(rule)
    (folder / "ack.en.txt").write_text(GOOD_TEXT.replace("thanks", "many thanks"),
                                       encoding="utf-8")
    changed = load_policies(tmp_path)["north"]
    assert changed.template_for(rule).version != first.template_for(rule).version
    assert changed.rule_version(rule) != first.rule_version(rule)
    assert 0 < changed.rule_version(rule) < 2**31
    # A stored version renders the same words whatever the folder says now.
    stored = from_sources(first.template_for(rule).sources())
    assert stored.ref == first.template_for(rule).ref


# --- rendering and language ----------------------------------------------------------------
def _fields(first_name: str = "Ada", company: str = "") -> TemplateFields:
    return TemplateFields(first_name=first_name, company=company, signature="Sig",
                          sender_name="North Sales", opt_out_url="https://r/u?a=1&b=2",
                          postal_address="1 Fjord Road")


def test_html_is_escaped_and_text_is_not() -> None:
    template = build("ack", {"en": LanguageSource(
        "Hi {{ first_name }}", "Hi {{ first_name }} {{ opt_out_url }} {{ postal_address }}",
        "<p>Hi {{ first_name }}</p><a href='{{ opt_out_url }}'>x</a>{{ postal_address }}")},
        "test")
    words = render(template, "en", _fields(first_name="<b>Ada</b>"))
    assert words.text.startswith("Hi <b>Ada</b> https://r/u?a=1&b=2")
    assert words.html is not None and "&lt;b&gt;Ada&lt;/b&gt;" in words.html
    assert "https://r/u?a=1&amp;b=2" in words.html


@pytest.mark.parametrize(("head", "wanted"), [
    (b"Content-Language: de-AT\r\n\r\n", ["de-at"]),
    (b"Accept-Language: fr;q=0.4, de-CH, en;q=0.8\r\n\r\n", ["de-ch", "en", "fr"]),
    (b"Content-Language: es\r\nAccept-Language: de\r\n\r\n", ["es", "de"]),
    (b"Subject: hi\r\n\r\n", []),
    (None, []),
])
def test_the_message_names_its_languages(head: bytes | None, wanted: list[str]) -> None:
    assert message_languages(head) == wanted
    # Extraction stores the same (migration 041): the send reads them, not the message.
    raw = b"From: Jane <jane@example.org>\r\nTo: sales@example.com\r\n" + (head or b"\r\n")
    policy = TenantPolicy(tenant="langs", mailboxes=["sales@example.com"],
                          domains=["example.com"])
    stored = extract_with_rules(raw, len(raw), policy, "standard").languages
    assert stored == wanted
    assert reply_languages(stored, None) == wanted
    assert reply_languages(None, raw) == wanted  # an item extracted before 041
    assert reply_languages([], raw) == []        # stored: the message names none


def test_the_language_falls_back_to_the_tenant_default() -> None:
    acme = load_policies(ROOT / "policies")["acme"]
    ack = acme.template_for(acme.followup_rules[0])
    assert ack.language_for(["de-at"], "en") == "de"
    assert ack.language_for(["fr", "de"], "en") == "de"
    assert ack.language_for(["fr"], "en") == "en"


# --- composing what is sent ----------------------------------------------------------------
def test_the_follow_up_carries_the_tenants_sender_link_and_address(tmp_path: Path) -> None:
    _tenant(tmp_path)
    north = load_policies(tmp_path)["north"]
    ack = north.template_for(north.followup_rules[0])
    contact = uuid.uuid4()
    followup = compose(north, ack, to="jane@example.com", contact_id=contact, name="Jane Doe",
                       company=None, languages=[], settings=_settings())
    link = followup.headers["List-Unsubscribe"].strip("<>")
    assert link.startswith("https://relay.example/v1/unsubscribe/u1.north.")
    assert link in followup.text and "1 Fjord Road" in followup.text
    assert followup.subject == "Thanks, Jane" and followup.text.startswith("Hello Jane,")
    assert (followup.sender, followup.reply_to) == ("North Sales <sales@north.test>",
                                                   "team@north.test")
    assert followup.headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    # The same inputs give the same bytes (a retry repeats the identical request).
    assert compose(north, ack, to="jane@example.com", contact_id=contact, name="Jane Doe",
                   company=None, languages=[], settings=_settings()) == followup


def test_without_an_unsubscribe_secret_nothing_is_sent(tmp_path: Path) -> None:
    _tenant(tmp_path)
    north = load_policies(tmp_path)["north"]
    with pytest.raises(FollowupRefused) as info:
        compose(north, north.template_for(north.followup_rules[0]), to="j@example.com",
                contact_id=uuid.uuid4(), name=None, company=None, languages=[],
                settings=Settings(unsubscribe_secret=None))
    assert info.value.reason == "unsubscribe_secret_missing"
    assert "INBOXCRM_UNSUBSCRIBE_SECRET" in str(info.value)


def test_a_tenant_without_its_own_from_uses_the_global_one(tmp_path: Path) -> None:
    _tenant(tmp_path, policy={"sender": {"postal_address": "2 Some Street, Town"}})
    north: TenantPolicy = load_policies(tmp_path)["north"]
    followup = compose(north, north.template_for(north.followup_rules[0]), to="j@example.com",
                       contact_id=uuid.uuid4(), name=None, company=None, languages=[],
                       settings=_settings(mail_from="Global <hello@global.test>"))
    assert (followup.sender, followup.reply_to) == ("Global <hello@global.test>", None)
    assert followup.text.startswith("Hello there,")


# --- inboxcrm template preview ------------------------------------------------------------
MESSAGE = (b"From: Jane Doe <jane.doe@initech.example>\r\nTo: sales@acme.test\r\n"
           b"Subject: Pricing for 20 seats\r\nMessage-ID: <p1@initech.example>\r\n"
           b"Date: Mon, 30 Nov 2026 10:00:00 +0000\r\nContent-Language: de\r\n\r\n"
           b"Hello, could you send me your pricing for 20 seats?\r\n\r\nBest regards,\r\n"
           b"Jane Doe\r\n")


def _preview(tmp_path: Path, *args: str, secret: str | None = "preview-secret-of-at-least-32-bytes"
             ) -> subprocess.CompletedProcess[str]:
    eml = tmp_path / "in.eml"
    eml.write_bytes(MESSAGE)
    # The local stack's rules: the demo tenant's sender is the fallback From only there.
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": "postgresql://nowhere.invalid/none",
           "INBOXCRM_PUBLIC_RELAY_URL": "https://relay.example", "INBOXCRM_ENV": "local"}
    if secret:
        env["INBOXCRM_UNSUBSCRIBE_SECRET"] = secret
    return subprocess.run([sys.executable, "-m", "inboxcrm.cli", "template", "preview",
                           *args, str(eml)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)


def test_preview_renders_what_would_be_sent_and_writes_nothing(tmp_path: Path) -> None:
    shown = _preview(tmp_path, "--tenant", "acme")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "From: Acme Sales <sales@acme.test>" in out
    assert "Reply-To: Acme Sales <sales@acme.test>" in out
    assert "To: jane.doe@initech.example" in out
    assert "Subject: Danke für Ihre Nachricht" in out  # Content-Language: de
    assert "List-Unsubscribe: <https://relay.example/v1/unsubscribe/u1.acme." in out
    assert "Acme Corp., 1 Demo Street" in out and "Guten Tag Jane," in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.eml"]

    as_json = json.loads(_preview(tmp_path, "--tenant", "globex", "--json").stdout)
    assert as_json["from"] == "Globex Customer Team <hello@globex.test>"
    assert as_json["reply_to"] == "Globex Sales <sales@globex.test>"
    assert as_json["language"] == "en" and as_json["html"].startswith("<p>Hi Jane,")
    assert as_json["route"] == "review"  # globex trusts only its MX's verdict


def test_preview_says_why_nothing_would_be_sent(tmp_path: Path) -> None:
    refused = _preview(tmp_path, "--tenant", "acme", secret=None)
    assert refused.returncode == 1 and "unsubscribe_secret_missing" in refused.stderr
    unknown = _preview(tmp_path, "--tenant", "nobody")
    assert unknown.returncode == 1 and "unknown tenant 'nobody'" in unknown.stderr


# --- render limits (issue 36) --------------------------------------------------------------
@pytest.mark.parametrize(("hostile", "problem"), [
    ("{% for a in range(10**9) %}x{% endfor %}", "{% for %} loop at line 7 is not allowed"),
    ("{% for a in 'xxxxxxxxxx' * 30 %}{% for b in 'y' * 300 %}{% endfor %}{% endfor %}",
     "loop"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "is not allowed"),
    ("{{ signature.format(signature) }}", "a call"),
    ("{% set a = 'x' * 9000 %}{{ a ~ a }}", "{% set %}"),
    ("{{ '' | center(10**7) }}", "the filter 'center' at line 7 is not allowed"),
    ("{{ 'a' * 10**8 }}", "over the render limit of 16384 characters"),
    ("{{ ('x' * 9000) ~ ('x' * 9000) }}", "over the render limit of 16384 characters"),
    ("{{ ('x' * 9000) + ('x' * 9000) }}", "over the render limit"),
    ("{{ 2 ** 100000 }}", "over the render limit of 256 bits"),
])
def test_a_hostile_template_is_refused_at_policy_load_without_running_away(
        tmp_path: Path, hostile: str, problem: str) -> None:
    """Loops, calls, macros and assignments refuse before anything renders; what an
    expression can still grow (repetition, joins, powers) is capped while it renders. Each
    refusal names the file and the limit, and costs next to nothing on the loop that loads
    the policy (the relay's and the workers')."""
    _tenant(tmp_path, text=GOOD_TEXT + hostile + "\n")
    message = _refusal(tmp_path)
    assert "ack.en.txt" in message and problem in message, message


def test_what_a_template_may_still_do_renders_as_before() -> None:
    source = LanguageSource(
        "Hi {{ first_name | default('there') | title }}",
        "{% if company %}At {{ company | trim }}{% else %}Hello{% endif %} "
        "{{ 'ab' ~ 'cd' }} {{ '-' * 3 }} {{ 6 * 7 }}\n{{ postal_address }} {{ opt_out_url }}\n")
    template = build("ack", {"en": source}, "test")
    fields = TemplateFields("ada", "Acme ", "", "Sender", "https://u.test/x", "1 Road")
    rendered = render(template, "en", fields)
    assert rendered.subject == "Hi Ada"
    assert rendered.text == "At Acme abcd --- 42\n1 Road https://u.test/x\n"
