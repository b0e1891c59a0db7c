"""Postmark and Mailgun inbound sources: provider-shaped payloads (tests/fixtures/) over real
HTTP to the running test relay, then counted on the destination side. The first block are
offline checks of parsing, rebuilding and authentication."""

from __future__ import annotations

import base64
import email
import hashlib
import json
import secrets
import time
import uuid
from email import policy as email_policy
from pathlib import Path
from typing import Any

import httpx
import pytest

from inboxcrm.ingress.intake import BadRequest, Unauthenticated
from inboxcrm.ingress.sources.mailgun import (
    mailgun_delivery_id,
    mailgun_signature,
    parse_form,
    parse_mailgun,
    verify_mailgun,
)
from inboxcrm.ingress.sources.postmark import basic_auth_ok, parse_postmark
from inboxcrm.ingress.tenancy import Binding, Forbidden
from inboxcrm.platform import atrest
from inboxcrm.stack.credentials import generated_credentials
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, unique_email
from tests.helpers.at_rest import opened

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE_SENDER = "jane.doe@example.com"
MAX = 10 * 1024 * 1024
POSTMARK = Binding.shared("postmark")  # acme and rehearsal list it in their policies
MAILGUN = Binding.shared("mailgun")


def fixture(name: str, sender: str = FIXTURE_SENDER) -> dict[str, Any]:
    """A provider payload from tests/fixtures/, with the sender replaced everywhere."""
    text = (FIXTURES / name).read_text().replace(FIXTURE_SENDER, sender)
    return dict(json.loads(text))


def postmark(name: str = "postmark_inbound.json", sender: str = FIXTURE_SENDER,
             message_id: str | None = None) -> dict[str, Any]:
    payload = fixture(name, sender)
    payload["MessageID"] = message_id or str(uuid.uuid4())
    return payload


def mailgun(name: str = "mailgun_forward.json", sender: str = FIXTURE_SENDER,
            message_id: str | None = None) -> dict[str, str]:
    """A Mailgun forward() form with a fresh Message-Id (unsigned: see `signed`)."""
    form = {k: str(v) for k, v in fixture(name, sender).items()}
    message_id = message_id or f"<{uuid.uuid4().hex}@mail.example.com>"
    if "message-headers" in form:
        headers = [[n, message_id if n.lower() == "message-id" else v]
                   for n, v in json.loads(form["message-headers"])]
        form["message-headers"] = json.dumps(headers)
    if "body-mime" in form:
        head, sep, body = form["body-mime"].partition("\r\n\r\n")
        head = "\r\n".join(f"Message-ID: {message_id}" if line.lower().startswith("message-id:")
                           else line for line in head.split("\r\n"))
        form["body-mime"] = head + sep + body
    return form


def signed(form: dict[str, str], key: str, *, timestamp: float | None = None,
           token: str | None = None) -> dict[str, str]:
    """The form as Mailgun posts it: timestamp, a 50-character token, hex HMAC-SHA256."""
    ts = str(int(time.time() if timestamp is None else timestamp))
    token = token or secrets.token_hex(25)
    return {**form, "timestamp": ts, "token": token,
            "signature": mailgun_signature(key, ts, token)}


def mime_message(raw: bytes) -> email.message.EmailMessage:
    message = email.message_from_bytes(raw, policy=email_policy.default)
    assert isinstance(message, email.message.EmailMessage)
    return message


# ------------------------------------------------------------------ offline: parsing


def test_postmark_rebuild_keeps_headers_bodies_and_attachments() -> None:
    payload = postmark(message_id="pm-offline-1")
    payload["Headers"].append({"Name": "Auto-Submitted", "Value": "auto-replied"})
    payload["Headers"].append({"Name": "Precedence", "Value": "bulk"})

    delivery = parse_postmark(payload, POSTMARK, MAX)

    assert (delivery.tenant, delivery.source, delivery.mailbox, delivery.delivery_id) == (
        "acme", "postmark", "sales@acme.test", "pm-offline-1")
    assert delivery.workflow_id == "inbound/acme/postmark/sales@acme.test/pm-offline-1"
    assert parse_postmark(payload, POSTMARK, MAX).raw == delivery.raw  # deterministic rebuild
    message = mime_message(delivery.raw)
    assert message["From"] == "Jane Doe <jane.doe@example.com>"
    assert message["To"] == "Acme Sales <sales@acme.test>"
    assert message["Subject"] == "Pricing for 20 seats"
    assert message["Date"] == "Sun, 29 Nov 2026 10:00:00 +0000"
    assert message["Message-ID"] == "<CAEPk3R+4Zr7pricing@mail.example.com>"
    assert message["Auto-Submitted"] == "auto-replied"
    assert message["Precedence"] == "bulk"
    assert message["Return-Path"] == "<jane.doe@example.com>"
    assert message.get_all("MIME-Version") == ["1.0"]
    text = message.get_body(("plain",))
    html = message.get_body(("html",))
    assert text is not None and "pricing for 20 seats" in text.get_content()
    assert html is not None and "<p>Hi, could you send me" in html.get_content()
    [attachment] = list(message.iter_attachments())
    assert attachment.get_filename() == "requirements.txt"
    assert attachment.get_content() == "This is attachment contents, base-64 encoded."


def test_postmark_raw_email_is_stored_as_posted() -> None:
    payload = postmark("postmark_inbound_raw_email.json", message_id="pm-raw-1")
    delivery = parse_postmark(payload, POSTMARK, MAX)
    assert delivery.raw == payload["RawEmail"].encode()


def test_postmark_header_values_cannot_inject_headers_and_names_are_encoded() -> None:
    payload = postmark(message_id="pm-offline-2")
    payload["Subject"] = "Pricing\r\nBcc: victim@example.net"
    payload["FromFull"]["Name"] = "Jöhn Dœ, Sales"
    payload["Headers"].append({"Name": "X-Note", "Value": "über\nX-Evil: 1"})

    message = mime_message(parse_postmark(payload, POSTMARK, MAX).raw)

    assert message["Bcc"] is None and message["X-Evil"] is None
    assert message["Subject"] == "Pricing Bcc: victim@example.net"
    assert message["From"].addresses[0].display_name == "Jöhn Dœ, Sales"
    assert message["From"].addresses[0].addr_spec == "jane.doe@example.com"
    assert message["X-Note"] == "über X-Evil: 1"


def test_postmark_mailbox_resolution() -> None:
    plus = postmark(message_id="pm-offline-3")
    plus["ToFull"] = [{"Email": "sales+7af3@acme.test", "Name": "", "MailboxHash": "7af3"}]
    plus["OriginalRecipient"] = "sales+7af3@acme.test"
    assert parse_postmark(plus, POSTMARK, MAX).mailbox == "sales@acme.test"
    assert parse_postmark(plus, POSTMARK, MAX).tenant == "acme"

    foreign = postmark(message_id="pm-offline-4")
    foreign["ToFull"] = [{"Email": "someone@else.test", "Name": "", "MailboxHash": ""}]
    foreign["OriginalRecipient"] = "someone@else.test"
    with pytest.raises(BadRequest, match="unknown mailbox"):
        parse_postmark(foreign, POSTMARK, MAX)
    # globex does not accept the shared Postmark credential: its envelope recipient is a 403.
    globex = postmark(message_id="pm-offline-5")
    globex["OriginalRecipient"] = "hello@globex.test"
    with pytest.raises(Forbidden):
        parse_postmark(globex, POSTMARK, MAX)


def test_mailgun_forms_urlencoded_and_multipart() -> None:
    form = mailgun(message_id="<mg-offline-1@mail.example.com>")
    form["attachment-count"] = "1"
    request = httpx.Request("POST", "http://relay/", data=form, files={
        "attachment-1": ("quote ü.pdf", b"%PDF-1.4\r\n\x00\x01binary\n", "application/pdf")})
    parsed = parse_form(request.headers["content-type"], request.read())
    delivery = parse_mailgun(parsed, MAILGUN, MAX)

    assert delivery.delivery_id == "mg-offline-1@mail.example.com"
    message = mime_message(delivery.raw)
    assert message["X-Mailgun-Incoming"] == "Yes"
    assert message["Subject"] == "Pricing for 20 seats"
    [attachment] = list(message.iter_attachments())
    assert attachment.get_filename() == "quote ü.pdf"
    assert attachment.get_content() == b"%PDF-1.4\r\n\x00\x01binary\n"

    plain = httpx.Request("POST", "http://relay/", data=mailgun(
        message_id="<mg-offline-1@mail.example.com>"))
    same = parse_mailgun(parse_form(plain.headers["content-type"], plain.read()), MAILGUN, MAX)
    assert same.delivery_id == delivery.delivery_id
    with pytest.raises(BadRequest, match="form"):
        parse_form("application/json", b"{}")


def test_mailgun_delivery_id_fallbacks() -> None:
    assert mailgun_delivery_id("<abc@x.example>", b"") == "abc@x.example"
    odd = mailgun_delivery_id("<has space@x.example>", b"")
    assert odd == "mid-sha256-" + hashlib.sha256(b"has space@x.example").hexdigest()
    assert mailgun_delivery_id(None, b"raw") == "sha256-" + hashlib.sha256(b"raw").hexdigest()


def test_basic_auth_and_mailgun_signature_checks() -> None:
    good = "Basic " + base64.b64encode(b"u:p@ss").decode()
    assert basic_auth_ok(good, "u", "p@ss")
    assert not basic_auth_ok(good, "u", "other")
    assert not basic_auth_ok(good, None, None)
    assert not basic_auth_ok("Basic !!!", "u", "p@ss")
    assert not basic_auth_ok("Bearer x", "u", "p@ss")

    now = 1_800_000_000
    form = parse_form("application/x-www-form-urlencoded", httpx.Request(
        "POST", "http://x/", data=signed({}, "k", timestamp=now, token="t" * 50)).read())
    assert verify_mailgun(form, "k", 300, now=now + 299) == ("t" * 50, now)
    for key, at in (("other", now), ("k", now + 301), ("k", now - 301), (None, now)):
        with pytest.raises(Unauthenticated):
            verify_mailgun(form, key, 300, now=at)


def test_generated_credentials_once_per_data_dir(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("INBOXCRM_POSTMARK_USER", "INBOXCRM_POSTMARK_PASSWORD",
                 "INBOXCRM_MAILGUN_SIGNING_KEY", "INBOXCRM_UNSUBSCRIBE_SECRET"):
        monkeypatch.delenv(name, raising=False)
    first = generated_credentials(tmp_path)
    assert generated_credentials(tmp_path) == first
    assert all(first.values())
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv("INBOXCRM_MAILGUN_SIGNING_KEY", "from-env")
    assert generated_credentials(tmp_path)["INBOXCRM_MAILGUN_SIGNING_KEY"] == "from-env"


# ------------------------------------------------------------------ over HTTP: Postmark

UNSET: Any = object()


async def post_postmark(env: StackClient, stack: Stack, payload: Any = None, *,
                        auth: Any = UNSET, content: bytes | None = None,
                        params: dict[str, str] | None = None) -> httpx.Response:
    if auth is UNSET:
        auth = (stack.env["INBOXCRM_POSTMARK_USER"], stack.env["INBOXCRM_POSTMARK_PASSWORD"])
    body = content if content is not None else json.dumps(payload).encode()
    return await env.http.post(f"{stack.relay_url}/v1/inbound/postmark", content=body,
                               headers={"content-type": "application/json"},
                               auth=auth, params=params)


async def events(env: StackClient) -> int:
    return await env.count("SELECT count(*) FROM inbound_events")


def test_stack_env_exports_the_source_credentials(stack: Stack) -> None:
    exported = stack.stack_env()
    for name in ("INBOXCRM_POSTMARK_USER", "INBOXCRM_POSTMARK_PASSWORD",
                 "INBOXCRM_MAILGUN_SIGNING_KEY"):
        assert exported[name] and exported[name] == stack.env[name]
    assert stack.env["INBOXCRM_UNSUBSCRIBE_SECRET"]


async def test_postmark_accepted_then_duplicate(env: StackClient, stack: Stack) -> None:
    email = unique_email("pm")
    payload = postmark(sender=email)

    response = await post_postmark(env, stack, payload)

    assert response.status_code == 200, response.text
    workflow_id = f"inbound/acme/postmark/sales@acme.test/{payload['MessageID']}"
    assert response.json() == {"status": "accepted", "workflow_id": workflow_id,
                               "state": "received"}
    assert await env.wait_state(workflow_id, "completed") == ("completed", "followup_sent")
    assert await env.contacts_for(email) == 1
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1

    again = await post_postmark(env, stack, payload)
    assert again.status_code == 200
    assert again.json() == {"status": "duplicate", "workflow_id": workflow_id,
                            "state": "completed"}
    assert await env.count("SELECT count(*) FROM inbound_events WHERE delivery_id = $1",
                           payload["MessageID"]) == 1
    assert len(await env.emails_to(email)) == 1
    # Postmark's own event is kept as posted, once, next to the MIME rebuilt from it (sealed
    # at rest: the sender's address is not in the stored bytes).
    kept = await env.db.fetch(
        "SELECT p.content_type, p.body, event_id::text AS row FROM provider_events p"
        " JOIN inbound_events e USING (event_id) WHERE e.workflow_id = $1", workflow_id)
    assert email.encode() not in bytes(kept[0]["body"])
    assert [(r["content_type"], opened(stack, r["body"], row=r["row"],
                                       column=atrest.PROVIDER_EVENT))
            for r in kept] == [("application/json", json.dumps(payload).encode())]


async def test_postmark_raw_email_variant_completes(env: StackClient, stack: Stack) -> None:
    email = unique_email("pmraw")
    payload = postmark("postmark_inbound_raw_email.json", sender=email)

    response = await post_postmark(env, stack, payload)

    assert response.status_code == 200, response.text
    assert (await env.wait_state(response.json()["workflow_id"], "completed"))[0] == "completed"
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1


async def test_postmark_bad_auth_is_rejected_and_nothing_is_stored(
    env: StackClient, stack: Stack,
) -> None:
    email = unique_email("pmforged")
    payload = postmark(sender=email)
    user, password = stack.env["INBOXCRM_POSTMARK_USER"], stack.env["INBOXCRM_POSTMARK_PASSWORD"]
    before = await events(env)

    cases = [
        await post_postmark(env, stack, payload, auth=(user, password + "x")),
        await post_postmark(env, stack, payload, auth=("someone", password)),
        await post_postmark(env, stack, payload, auth=None),
        await env.http.post(f"{stack.relay_url}/v1/inbound/postmark", json=payload,
                            headers={"authorization": "Basic not-base64!"}),
        await env.http.post(f"{stack.relay_url}/v1/inbound/postmark", json=payload,
                            headers={"authorization": f"Bearer {password}"}),
    ]

    assert [r.status_code for r in cases] == [401] * 5
    assert all(r.json()["status"] == "error" for r in cases)
    assert cases[0].headers["www-authenticate"].startswith("Basic")
    assert await events(env) == before
    assert await env.contacts_for(email) == 0


async def test_postmark_malformed_unknown_mailbox_and_oversized(
    env: StackClient, stack: Stack,
) -> None:
    before = await events(env)
    no_id = postmark()
    del no_id["MessageID"]
    bad_headers = postmark()
    bad_headers["Headers"] = {"Name": "X"}
    bad_attachment = postmark()
    bad_attachment["Attachments"][0]["Content"] = "***"
    foreign = postmark()
    foreign["ToFull"] = [{"Email": "someone@else.test", "Name": "", "MailboxHash": ""}]
    foreign["OriginalRecipient"] = "someone@else.test"

    not_json = await post_postmark(env, stack, content=b"{not json")
    missing_id = await post_postmark(env, stack, no_id)
    headers_type = await post_postmark(env, stack, bad_headers)
    attachment = await post_postmark(env, stack, bad_attachment)
    unknown_mailbox = await post_postmark(env, stack, foreign)
    oversized = await post_postmark(env, stack, content=b"x" * (MAX + 10))

    for response, word in ((not_json, "JSON"), (missing_id, "MessageID"),
                           (headers_type, "Headers"), (attachment, "Attachments[0]"),
                           (unknown_mailbox, "mailbox")):
        assert response.status_code == 422, response.text
        assert word in response.json()["message"]
    assert oversized.status_code == 413
    assert await events(env) == before


async def test_postmark_auto_reply_is_ignored(env: StackClient, stack: Stack) -> None:
    email = unique_email("pmaway")
    payload = postmark("postmark_auto_reply.json", sender=email)

    response = await post_postmark(env, stack, payload)

    assert response.status_code == 200, response.text
    assert (await env.wait_state(response.json()["workflow_id"], "ignored"))[0] == "ignored"
    assert await env.contacts_for(email) == 0
    assert await env.crm_records_for(email) == []
    assert await env.emails_to(email) == []


# ------------------------------------------------------------------ over HTTP: Mailgun


async def post_mailgun(env: StackClient, stack: Stack, form: dict[str, str], *,
                       path: str = "/v1/inbound/mailgun",
                       files: dict[str, Any] | None = None,
                       params: dict[str, str] | None = None) -> httpx.Response:
    return await env.http.post(f"{stack.relay_url}{path}", data=form, files=files,
                               params=params)


async def test_mailgun_accepted_redelivery_duplicate_and_replay_rejected(
    env: StackClient, stack: Stack,
) -> None:
    key = stack.env["INBOXCRM_MAILGUN_SIGNING_KEY"]
    email = unique_email("mg")
    message_id = f"{uuid.uuid4().hex}@mail.example.com"
    form = mailgun(sender=email, message_id=f"<{message_id}>")
    first = signed(form, key)

    response = await post_mailgun(env, stack, first)

    assert response.status_code == 200, response.text
    workflow_id = f"inbound/acme/mailgun/sales@acme.test/{message_id}"
    assert response.json()["workflow_id"] == workflow_id
    assert response.json()["status"] == "accepted"
    assert await env.wait_state(workflow_id, "completed") == ("completed", "followup_sent")
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1

    # Mailgun's retry of the same message: new timestamp and token, same Message-Id.
    redelivered = await post_mailgun(env, stack, signed(form, key))
    assert redelivered.status_code == 200, redelivered.text
    assert redelivered.json() == {"status": "duplicate", "workflow_id": workflow_id,
                                  "state": "completed"}
    # The very same signed request again: a replayed token.
    replayed = await post_mailgun(env, stack, first)
    assert replayed.status_code == 401
    assert await env.count("SELECT count(*) FROM inbound_events WHERE delivery_id = $1",
                           message_id) == 1
    assert len(await env.emails_to(email)) == 1
    # Mailgun's own event, the form's fields as JSON: the first delivery's, signature and all.
    kept = await env.db.fetch(
        "SELECT p.content_type, p.body, event_id::text AS row FROM provider_events p"
        " JOIN inbound_events e USING (event_id) WHERE e.workflow_id = $1", workflow_id)
    assert [r["content_type"] for r in kept] == ["application/vnd.inboxcrm.mailgun-form+json"]
    event = json.loads(opened(stack, kept[0]["body"], row=kept[0]["row"],
                              column=atrest.PROVIDER_EVENT))
    assert event["fields"]["signature"] == [first["signature"]]
    assert event["fields"]["token"] == [first["token"]]
    assert event["fields"]["body-plain"] == [form["body-plain"]]


async def test_mailgun_bad_signatures_are_rejected_and_nothing_is_stored(
    env: StackClient, stack: Stack,
) -> None:
    key = stack.env["INBOXCRM_MAILGUN_SIGNING_KEY"]
    email = unique_email("mgforged")
    form = mailgun(sender=email)
    before = await events(env)
    unsigned = {k: v for k, v in signed(form, key).items() if k != "signature"}
    tampered = signed(form, key)
    tampered["signature"] = tampered["signature"][:-1] + (
        "0" if tampered["signature"][-1] != "0" else "1")

    cases = [
        await post_mailgun(env, stack, signed(form, key, timestamp=time.time() - 3600)),
        await post_mailgun(env, stack, signed(form, key, timestamp=time.time() + 3600)),
        await post_mailgun(env, stack, signed(form, "not-the-signing-key")),
        await post_mailgun(env, stack, unsigned),
        await post_mailgun(env, stack, tampered),
        await post_mailgun(env, stack, form),  # the fixture's own (foreign) signature
    ]

    assert [r.status_code for r in cases] == [401] * 6
    assert all(r.json()["status"] == "error" for r in cases)
    assert await events(env) == before
    assert await env.contacts_for(email) == 0


async def test_mailgun_malformed_and_unknown_mailbox(env: StackClient, stack: Stack) -> None:
    key = stack.env["INBOXCRM_MAILGUN_SIGNING_KEY"]
    before = await events(env)
    garbage_headers = {**mailgun(), "message-headers": "[[\"From\""}
    no_source = {k: v for k, v in mailgun().items() if k != "message-headers"}
    foreign = mailgun()
    foreign["recipient"] = "someone@else.test"
    foreign["message-headers"] = foreign["message-headers"].replace(
        "sales@acme.test", "someone@else.test")

    headers = await post_mailgun(env, stack, signed(garbage_headers, key))
    missing = await post_mailgun(env, stack, signed(no_source, key))
    mailbox = await post_mailgun(env, stack, signed(foreign, key))
    as_json = await env.http.post(f"{stack.relay_url}/v1/inbound/mailgun",
                                  json=signed(mailgun(), key))

    for response, word in ((headers, "message-headers"), (missing, "message-headers"),
                           (mailbox, "mailbox"), (as_json, "form")):
        assert response.status_code == 422, response.text
        assert word in response.json()["message"]
    assert await events(env) == before


async def test_mailgun_raw_mime_variant_completes(env: StackClient, stack: Stack) -> None:
    key = stack.env["INBOXCRM_MAILGUN_SIGNING_KEY"]
    email = unique_email("mgmime")
    message_id = f"{uuid.uuid4().hex}@mail.example.com"
    form = signed(mailgun("mailgun_forward_mime.json", sender=email,
                          message_id=f"<{message_id}>"), key)

    # multipart/form-data (httpx needs a file part for that; the relay ignores it), as
    # Mailgun posts to a route URL ending in "mime"
    response = await post_mailgun(env, stack, form, path="/v1/inbound/mailgun/mime",
                                  files={"unused": ("", b"", "application/octet-stream")})

    assert response.status_code == 200, response.text
    workflow_id = f"inbound/acme/mailgun/sales@acme.test/{message_id}"
    assert response.json()["workflow_id"] == workflow_id
    assert (await env.wait_state(workflow_id, "completed"))[0] == "completed"
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1
    stored = await env.db.fetchrow("SELECT raw, event_id::text AS row FROM inbound_events "
                                   "WHERE workflow_id = $1", workflow_id)
    assert stored is not None
    assert opened(stack, stored["raw"], row=stored["row"]) == form["body-mime"].encode()


async def test_mailgun_without_message_id_dedupes_by_content_hash(
    env: StackClient, stack: Stack,
) -> None:
    key = stack.env["INBOXCRM_MAILGUN_SIGNING_KEY"]
    email = unique_email("mgnoid")
    form = mailgun(sender=email)
    form["message-headers"] = json.dumps(
        [p for p in json.loads(form["message-headers"]) if p[0].lower() != "message-id"])
    form["attachment-count"] = "1"
    attachment = {"attachment-1": ("notes.txt", b"20 seats, annual", "text/plain")}

    first = await post_mailgun(env, stack, signed(form, key), files=attachment)
    second = await post_mailgun(env, stack, signed(form, key), files=attachment)

    assert first.status_code == 200, first.text
    assert [first.json()["status"], second.json()["status"]] == ["accepted", "duplicate"]
    assert first.json()["workflow_id"] == second.json()["workflow_id"]
    assert first.json()["workflow_id"].startswith("inbound/acme/mailgun/sales@acme.test/sha256-")
    await env.wait_state(first.json()["workflow_id"], "completed")
    assert len(await env.emails_to(email)) == 1
