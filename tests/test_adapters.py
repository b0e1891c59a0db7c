"""Destination adapters over real transports: the Salesforce adapter against the sandbox's
Salesforce surface (real HTTP, the sandbox's own fault injection), the SMTP adapter against a
real aiosmtpd server on loopback, and both through the outbox with a real database.

Every failure is checked for its category, because the category decides what happens next:
transient → retried, permanent → blocked for a person, unknown → reconciled first, or held
(`ambiguous`) where the destination cannot be asked (SMTP).
"""

from __future__ import annotations

import asyncio
import dataclasses
import email
import email.policy
import json
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP as SMTPServer
from aiosmtpd.smtp import AuthResult, Envelope, LoginPassword, Session
from pydantic import SecretStr
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from inboxcrm.activities.crm import CrmActivities
from inboxcrm.activities.send import SendActivities
from inboxcrm.adapters.base import AdapterError, ContactFields, OutgoingEmail
from inboxcrm.adapters.errors import Category, ErrorType, to_application_error
from inboxcrm.adapters.factory import ConfigurationError, build_crm, build_mail
from inboxcrm.adapters.hubspot import HubSpotCrm
from inboxcrm.adapters.resend import ResendMail
from inboxcrm.adapters.salesforce import LAST_NAME_PLACEHOLDER, SalesforceCrm
from inboxcrm.adapters.smtp import SmtpMail
from inboxcrm.operator.hubspot_setup import SetupError, run_setup
from inboxcrm.platform.config import Settings
from inboxcrm.schemas.models import ItemRef, OperationInput
from inboxcrm.stack.processes import free_port
from inboxcrm.stack.stack import Stack
from tests.helpers.outbox import step_env
from tests.helpers.tls import self_signed_certificate

T, P, U = Category.TRANSIENT, Category.PERMANENT, Category.UNKNOWN
EXT_FIELD = "Inboxcrm_Contact_Id__c"
CLIENT_TIMEOUT = 1.0  # shorter than the stack sandbox's hang (6 s): timeouts really happen


def new_email(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:10]}@example.com"


# --- sandbox plumbing ----------------------------------------------------------------------
@pytest.fixture
async def sandbox(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    """A client for the stack's sandbox; faults are cleared before and after each test."""
    async with httpx.AsyncClient(base_url=stack.sandbox_url, timeout=10) as client:
        await client.delete("/_sandbox/faults")
        yield client
        await client.delete("/_sandbox/faults")


async def inject(client: httpx.AsyncClient, target: str, mode: str, **extra: Any) -> None:
    response = await client.post("/_sandbox/faults", json={"target": target, "mode": mode,
                                                            **extra})
    response.raise_for_status()


async def records_for(client: httpx.AsyncClient, email_address: str) -> list[dict[str, Any]]:
    state = (await client.get("/_sandbox/state")).json()
    return [c for c in state["contacts"]
            if str(c["properties"].get("email", "")).lower() == email_address.lower()]


@pytest.fixture
async def sf(stack: Stack) -> AsyncIterator[SalesforceCrm]:
    crm = SalesforceCrm(stack.sandbox_url, "sandbox-token", timeout=CLIENT_TIMEOUT)
    yield crm
    await crm.aclose()


async def failure(coro: Any) -> AdapterError:
    with pytest.raises(AdapterError) as caught:
        await coro
    return caught.value


# --- Salesforce: the happy paths ----------------------------------------------------------
async def test_salesforce_creates_then_updates_the_same_record(
    sf: SalesforceCrm, sandbox: httpx.AsyncClient,
) -> None:
    contact_id, address = str(uuid.uuid4()), new_email("sf-create")

    created = await sf.upsert_contact(contact_id, ContactFields(address, "Ada", "Analytical"))
    again = await sf.upsert_contact(contact_id, ContactFields(address, "Ada Lovelace", None))

    assert created.created is True and again.created is False
    assert again.record_id == created.record_id
    found = await sf.find_contact(contact_id)
    assert found is not None and found.record_id == created.record_id
    [record] = await records_for(sandbox, address)  # one record, whatever was repeated
    props = record["properties"]
    assert record["id"] == created.record_id
    assert props[EXT_FIELD] == contact_id
    assert (props["firstname"], props["lastname"]) == ("Ada", "Lovelace")
    assert props["Inboxcrm_Company__c"] == "Analytical"  # kept: the update sent no company


async def test_salesforce_last_name_placeholder_and_read_back(
    sf: SalesforceCrm, sandbox: httpx.AsyncClient, stack: Stack,
) -> None:
    contact_id, address = str(uuid.uuid4()), new_email("sf-noname")
    record = await sf.upsert_contact(contact_id, ContactFields(address))

    response = await sandbox.get(f"/services/data/v62.0/sobjects/Contact/{record.record_id}")
    assert response.status_code == 200
    body = response.json()
    assert body["LastName"] == LAST_NAME_PLACEHOLDER and body["Email"] == address
    assert body["attributes"]["type"] == "Contact"


async def test_salesforce_204_update_reads_the_id_back(
    sandbox: httpx.AsyncClient, stack: Stack,
) -> None:
    """Before API v46.0 an update answers 204 without a body: the Id is read back."""
    crm = SalesforceCrm(stack.sandbox_url, None, api_version="45.0", timeout=CLIENT_TIMEOUT)
    contact_id, address = str(uuid.uuid4()), new_email("sf-204")
    try:
        created = await crm.upsert_contact(contact_id, ContactFields(address, "Grace Hopper"))
        raw = await sandbox.patch(f"/services/data/v45.0/sobjects/Contact/{EXT_FIELD}/"
                                  f"{contact_id}", json={"Title": "Rear Admiral"})
        assert raw.status_code == 204 and raw.content == b""
        updated = await crm.upsert_contact(contact_id, ContactFields(address, "Grace Hopper"))
    finally:
        await crm.aclose()
    assert created.created is True
    assert (updated.record_id, updated.created) == (created.record_id, False)
    assert len(await records_for(sandbox, address)) == 1


async def test_salesforce_find_missing_is_none(sf: SalesforceCrm) -> None:
    assert await sf.find_contact(str(uuid.uuid4())) is None


# --- Salesforce: answers that must stop the item ----------------------------------------------
async def test_salesforce_multiple_matches_is_permanent_and_picks_none(
    sandbox: httpx.AsyncClient, stack: Stack,
) -> None:
    """300: a non-unique external ID field matches two records. Blocked, never one picked."""
    shared, emails = f"legacy-{uuid.uuid4().hex[:8]}", [new_email("sf-dup1"), new_email("sf-dup2")]
    for address in emails:
        seeded = await sandbox.patch(
            f"/services/data/v62.0/sobjects/Contact/{EXT_FIELD}/{uuid.uuid4()}",
            json={"Email": address, "LastName": "Dup", "Legacy_Ref__c": shared})
        assert seeded.status_code == 201, seeded.text
    crm = SalesforceCrm(stack.sandbox_url, None, external_id_field="Legacy_Ref__c",
                        timeout=CLIENT_TIMEOUT)
    try:
        upsert = await failure(crm.upsert_contact(shared, ContactFields(new_email("sf-dup3"),
                                                                        "New Person")))
        find = await failure(crm.find_contact(shared))
    finally:
        await crm.aclose()
    for error in (upsert, find):
        assert error.classified.category is P
        assert error.classified.reason == "http_300:MULTIPLE_MATCHES"
    application = to_application_error(upsert.classified, max_retry_after=300)
    assert (application.type, application.non_retryable) == (ErrorType.PERMANENT.value, True)
    state = (await sandbox.get("/_sandbox/state")).json()["contacts"]
    assert sum(1 for c in state if c["properties"].get("Legacy_Ref__c") == shared) == 2


@pytest.mark.parametrize(("adapter_kwargs", "fields", "reason"), [
    ({"company_field": "Bogus"}, ContactFields("x@example.com", "A B", "Co"),
     "http_400:INVALID_FIELD"),
    ({}, ContactFields("not-an-address", "A B"), "http_400:INVALID_EMAIL_ADDRESS"),
    ({"external_id_field": "Email"}, ContactFields("y@example.com", "A B"),
     "http_404:NOT_FOUND"),
], ids=["unknown_field", "invalid_email", "not_an_external_id_field"])
async def test_salesforce_error_arrays_block_with_their_error_code(
    stack: Stack, adapter_kwargs: dict[str, str], fields: ContactFields, reason: str,
) -> None:
    crm = SalesforceCrm(stack.sandbox_url, None, timeout=CLIENT_TIMEOUT, **adapter_kwargs)
    try:
        error = await failure(crm.upsert_contact(str(uuid.uuid4()), fields))
    finally:
        await crm.aclose()
    assert (error.classified.category, error.classified.reason) == (P, reason)


async def test_salesforce_duplicate_email_is_blocked(
    sf: SalesforceCrm, sandbox: httpx.AsyncClient,
) -> None:
    address = new_email("sf-sameemail")
    await sf.upsert_contact(str(uuid.uuid4()), ContactFields(address, "First Owner"))
    error = await failure(sf.upsert_contact(str(uuid.uuid4()), ContactFields(address, "Other")))
    assert (error.classified.category, error.classified.reason) == (
        P, "http_400:DUPLICATES_DETECTED")
    assert len(await records_for(sandbox, address)) == 1


# --- Salesforce: every sandbox fault mode, through the shared fault injection --------------
FAULTS = [
    # (mode, category, reason, retry_after)
    ("unauthorized", P, "http_401:INVALID_SESSION_ID", None),
    ("rate_limit", T, "http_403:REQUEST_LIMIT_EXCEEDED", 60.0),
    ("invalid_field", P, "http_400:FIELD_CUSTOM_VALIDATION_EXCEPTION", None),
    ("server_error", T, "http_500:UNKNOWN_EXCEPTION", None),
    ("timeout_before_commit", U, "ReadTimeout", None),
    ("timeout_after_commit", U, "ReadTimeout", None),
]


@pytest.mark.parametrize(("mode", "category", "reason", "retry_after"), FAULTS,
                         ids=[f[0] for f in FAULTS])
async def test_salesforce_upsert_fault_modes(
    sf: SalesforceCrm, sandbox: httpx.AsyncClient, mode: str, category: Category,
    reason: str, retry_after: float | None,
) -> None:
    contact_id, address = str(uuid.uuid4()), new_email(f"sf-{mode}")
    await inject(sandbox, "crm.upsert", mode, retry_after=7)

    error = await failure(sf.upsert_contact(contact_id, ContactFields(address, "Fault Case")))

    assert (error.classified.category, error.classified.reason) == (category, reason)
    assert error.classified.retry_after == retry_after  # Salesforce sends no Retry-After
    committed = mode == "timeout_after_commit"
    # Reconciliation by external ID (a record read, no index lag) tells the two timeouts apart.
    found = await sf.find_contact(contact_id)
    assert (found is not None) is committed
    assert len(await records_for(sandbox, address)) == (1 if committed else 0)
    # The fault was consumed: the same call now succeeds, and never makes a second record.
    record = await sf.upsert_contact(contact_id, ContactFields(address, "Fault Case"))
    assert record.created is not committed
    assert len(await records_for(sandbox, address)) == 1


async def test_salesforce_request_limit_waits_long() -> None:
    """403 REQUEST_LIMIT_EXCEEDED: transient, retried after 60 s (capped by settings)."""
    from inboxcrm.adapters.errors import classify_status

    classified = classify_status(403, None, "http_403:REQUEST_LIMIT_EXCEEDED")
    error = to_application_error(classified, max_retry_after=300)
    assert (error.type, error.non_retryable) == (ErrorType.TRANSIENT.value, False)
    assert error.next_retry_delay == timedelta(seconds=60)
    other_403 = classify_status(403, None, "http_403:INSUFFICIENT_ACCESS")
    assert other_403.category is P  # a real permission problem still blocks


@pytest.mark.parametrize(("mode", "category"), [("rate_limit", T), ("unauthorized", P),
                                                 ("server_error", T)])
async def test_salesforce_find_obeys_search_faults(
    sf: SalesforceCrm, sandbox: httpx.AsyncClient, mode: str, category: Category,
) -> None:
    await inject(sandbox, "crm.search", mode)
    error = await failure(sf.find_contact(str(uuid.uuid4())))
    assert error.classified.category is category


# --- Salesforce: the inbound email as a Task on the Contact ---------------------------------
async def test_salesforce_note_is_logged_once_per_key(
    sf: SalesforceCrm, sandbox: httpx.AsyncClient,
) -> None:
    record = await sf.upsert_contact(str(uuid.uuid4()),
                                     ContactFields(new_email("sf-note"), "Note Taker"))
    key = str(uuid.uuid4())
    assert await sf.find_note(key) is None

    when = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
    first = await sf.log_note(key, record.record_id, "Inbound email received via standard.", when)
    again = await sf.log_note(key, record.record_id, "Inbound email received via standard.", when)

    assert first == again == await sf.find_note(key)
    notes = [n for n in (await sandbox.get("/_sandbox/state")).json().get("notes", [])
             if key in n["properties"].values()]
    assert len(notes) == 1 and notes[0]["associations"]["contacts"] == [record.record_id]


async def test_salesforce_note_failures(sf: SalesforceCrm, sandbox: httpx.AsyncClient) -> None:
    missing_contact = await failure(
        sf.log_note(str(uuid.uuid4()), "999999999", "x", datetime.now(UTC)))
    assert (missing_contact.classified.category, missing_contact.classified.reason) == (
        P, "http_400:INVALID_CROSS_REFERENCE_KEY")
    await inject(sandbox, "crm.note", "rate_limit")
    limited = await failure(sf.log_note(str(uuid.uuid4()), "999999999", "x", datetime.now(UTC)))
    assert (limited.classified.category, limited.classified.retry_after) == (T, 60.0)


# --- HubSpot: the rate-limit windows and multi-status answers ------------------------------
async def test_hubspot_rate_limit_reason_names_the_policy(
    stack: Stack, sandbox: httpx.AsyncClient,
) -> None:
    crm = HubSpotCrm(stack.sandbox_url, None, "inboxcrm_contact_id", CLIENT_TIMEOUT)
    await inject(sandbox, "crm.upsert", "rate_limit", retry_after=3)
    try:
        error = await failure(crm.upsert_contact(str(uuid.uuid4()),
                                                 ContactFields(new_email("hs-429"))))
    finally:
        await crm.aclose()
    assert error.classified.category is T
    assert error.classified.reason == "http_429:SECONDLY"
    assert error.classified.retry_after == 3.0  # the provider's header wins


def _hubspot_with(handler: Any) -> HubSpotCrm:
    crm = HubSpotCrm("http://hubspot.test", "t", "inboxcrm_contact_id", 5)
    crm._client = httpx.AsyncClient(base_url="http://hubspot.test",
                                    transport=httpx.MockTransport(handler))
    return crm


@pytest.mark.parametrize(("policy", "delay"), [("SECONDLY", 1.0), ("TEN_SECONDLY_ROLLING", 10.0)])
async def test_hubspot_rate_limit_without_retry_after_gets_the_window(
    policy: str, delay: float,
) -> None:
    crm = _hubspot_with(lambda request: httpx.Response(429, json={
        "status": "error", "errorType": "RATE_LIMIT", "policyName": policy}))
    error = await failure(crm.upsert_contact("c-1", ContactFields("a@example.com")))
    await crm.aclose()
    assert (error.classified.category, error.classified.retry_after) == (T, delay)
    assert to_application_error(error.classified, max_retry_after=300).next_retry_delay == \
        timedelta(seconds=delay)


@pytest.mark.parametrize(("error", "expected"), [
    ({"status": "error", "category": "VALIDATION_ERROR", "message": "bad email"},
     (P, "http_207:VALIDATION_ERROR", None)),
    ({"status": "error", "category": "RATE_LIMITS", "message": "slow down"},
     (T, "http_207:RATE_LIMITS", 1.0)),
    ({"status": "error", "category": "SOMETHING_NEW", "message": "?"},
     (U, "http_207:SOMETHING_NEW", None)),  # unknown: reconcile by ID before any retry
])
async def test_hubspot_multi_status_is_classified_by_its_error(
    error: dict[str, str], expected: tuple[Category, str, float | None],
) -> None:
    crm = _hubspot_with(lambda request: httpx.Response(207, json={
        "status": "COMPLETE", "results": [], "numErrors": 1, "errors": [error]}))
    failed = await failure(crm.upsert_contact("c-1", ContactFields("a@example.com")))
    await crm.aclose()
    classified = failed.classified
    assert (classified.category, classified.reason, classified.retry_after) == expected


async def test_hubspot_multi_status_conflict_adopts_the_owner() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "PATCH":
            return httpx.Response(200, json={"id": "4242", "properties": {}})
        return httpx.Response(207, json={
            "status": "COMPLETE", "results": [], "numErrors": 1, "errors": [{
                "status": "error", "category": "CONFLICT",
                "message": "Contact already exists. Existing ID: 4242"}]})

    crm = _hubspot_with(answer)
    record = await crm.upsert_contact("c-1", ContactFields("a@example.com"))
    await crm.aclose()
    assert (record.record_id, record.adopted, record.marked) == ("4242", True, True)
    # Our external ID, and nothing else, is written onto the adopted contact.
    patch = seen[-1]
    assert (patch.method, patch.url.path) == ("PATCH", "/crm/v3/objects/contacts/4242")
    assert json.loads(patch.content) == {"properties": {"inboxcrm_contact_id": "c-1"}}


# --- HubSpot setup: the unique property, idempotently ----------------------------------------
@dataclass
class FakeHubSpot:
    exists: bool = False
    unique: bool = True
    status: int | None = None  # force an answer to the POST
    requests: list[httpx.Request] | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests = (self.requests or []) + [request]
        if request.method == "POST":
            if self.status is not None:
                return httpx.Response(self.status, json={"category": "INVALID_AUTHENTICATION"})
            if self.exists:
                return httpx.Response(409, json={"category": "OBJECT_ALREADY_EXISTS"})
            self.exists = True
            return httpx.Response(201, json={"name": "inboxcrm_contact_id"})
        return httpx.Response(200, json={"name": "inboxcrm_contact_id", "type": "string",
                                         "hasUniqueValue": self.unique})


async def test_hubspot_setup_creates_the_unique_property_once() -> None:
    fake = FakeHubSpot()
    transport = httpx.MockTransport(fake)
    first = await run_setup("http://hubspot.test", "tok", "inboxcrm_contact_id",
                            transport=transport)
    second = await run_setup("http://hubspot.test", "tok", "inboxcrm_contact_id",
                             transport=transport)
    assert (first.status, second.status) == ("created", "exists")
    assert fake.requests is not None
    post = fake.requests[0]
    body = json.loads(post.content)
    assert post.url.path == "/crm/v3/properties/contacts"
    assert post.headers["authorization"] == "Bearer tok"
    assert body["hasUniqueValue"] is True
    assert (body["type"], body["fieldType"], body["groupName"]) == (
        "string", "text", "contactinformation")


async def test_hubspot_setup_refuses_a_non_unique_existing_property() -> None:
    transport = httpx.MockTransport(FakeHubSpot(exists=True, unique=False))
    with pytest.raises(SetupError, match="not unique"):
        await run_setup("http://hubspot.test", "tok", "inboxcrm_contact_id",
                        transport=transport)


async def test_hubspot_setup_explains_a_refused_token() -> None:
    transport = httpx.MockTransport(FakeHubSpot(status=401))
    with pytest.raises(SetupError, match="crm.schemas.contacts.write"):
        await run_setup("http://hubspot.test", "tok", "inboxcrm_contact_id",
                        transport=transport)


# --- SMTP: a real server on loopback ---------------------------------------------------------
class Recorder:
    """aiosmtpd handler: records what it got; `rcpt_reply` / `data_reply` script answers.
    `data_reply="drop"` closes the connection after the message data (no final reply);
    `data_reply="hang"` never answers within the client's timeout."""

    def __init__(self) -> None:
        self.messages: list[Envelope] = []
        self.rcpt_reply = "250 OK"
        self.data_reply = "250 2.0.0 queued"

    async def handle_RCPT(self, server: SMTPServer, session: Session, envelope: Envelope,
                          address: str, rcpt_options: list[str]) -> str:
        if self.rcpt_reply == "drop":
            assert server.transport is not None
            server.transport.abort()
            return "250 OK"
        if self.rcpt_reply.startswith("250"):
            envelope.rcpt_tos.append(address)
        return self.rcpt_reply

    async def handle_DATA(self, server: SMTPServer, session: Session,
                          envelope: Envelope) -> str:
        self.messages.append(envelope)
        if self.data_reply == "drop":
            assert server.transport is not None
            server.transport.abort()
        elif self.data_reply == "hang":
            await asyncio.sleep(3)
        return "250 2.0.0 queued" if self.data_reply in ("drop", "hang") else self.data_reply


@dataclass
class SmtpServer:
    recorder: Recorder
    port: int


@pytest.fixture
def smtp_server() -> Iterator[SmtpServer]:
    recorder = Recorder()
    port = free_port()
    controller = Controller(recorder, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield SmtpServer(recorder, port)
    finally:
        controller.stop()


def smtp_mail(port: int, **kwargs: Any) -> SmtpMail:
    return SmtpMail("127.0.0.1", port, sender="Acme Sales <sales@acme.test>", security="none",
                    timeout=kwargs.pop("timeout", 2.0), local_hostname="worker.test", **kwargs)


def followup(to: str) -> OutgoingEmail:
    return OutgoingEmail(to=to, subject="Thanks for your message", text="Hello Ada,\n\nthanks.\n",
                         headers={"Auto-Submitted": "auto-replied",
                                  "List-Unsubscribe": "<https://relay.test/v1/unsubscribe/t>",
                                  "Message-ID": "<ignored@elsewhere>"})


async def test_smtp_delivers_with_deterministic_message_id_and_headers(
    smtp_server: SmtpServer,
) -> None:
    mail = smtp_mail(smtp_server.port)
    intent = str(uuid.uuid4())

    sent = await mail.send(intent, followup("ada@example.com"))

    assert sent.message_id == f"<{intent}@acme.test>"
    [envelope] = smtp_server.recorder.messages
    assert envelope.mail_from == "sales@acme.test"
    assert envelope.rcpt_tos == ["ada@example.com"]
    assert isinstance(envelope.content, bytes)
    message = email.message_from_bytes(envelope.content, policy=email.policy.default)
    assert message["Message-ID"] == f"<{intent}@acme.test>"  # ours, not the caller's
    assert message["Auto-Submitted"] == "auto-replied"
    assert message["List-Unsubscribe"] == "<https://relay.test/v1/unsubscribe/t>"
    assert message["From"] == "Acme Sales <sales@acme.test>"
    assert message.get_content().startswith("Hello Ada")
    assert mail.reconcilable is False
    # The same intent always gets the same Message-ID (receivers and people can match it).
    again = await mail.send(intent, followup("ada@example.com"))
    assert again.message_id == sent.message_id


@pytest.mark.parametrize(("where", "reply", "category"), [
    ("rcpt", "421 4.3.0 service shutting down", T),
    ("rcpt", "450 4.2.1 mailbox busy", T),
    ("data", "451 4.3.0 local error, try later", T),
    ("data", "421 4.7.0 too busy", T),
    ("rcpt", "550 5.1.1 no such user", P),
    ("data", "554 5.7.1 rejected as spam", P),
])
async def test_smtp_reply_codes(
    smtp_server: SmtpServer, where: str, reply: str, category: Category,
) -> None:
    if where == "rcpt":
        smtp_server.recorder.rcpt_reply = reply
    else:
        smtp_server.recorder.data_reply = reply
    error = await failure(smtp_mail(smtp_server.port).send(str(uuid.uuid4()),
                                                           followup("ada@example.com")))
    code = reply.split()[0]
    assert (error.classified.category, error.classified.reason) == (category, f"smtp_{code}")


async def test_smtp_connection_dropped_after_data_is_unknown_and_held(
    smtp_server: SmtpServer,
) -> None:
    smtp_server.recorder.data_reply = "drop"
    mail = smtp_mail(smtp_server.port)
    error = await failure(mail.send(str(uuid.uuid4()), followup("ada@example.com")))

    assert (error.classified.category, error.classified.reason) == (U, "smtp_disconnected")
    assert len(smtp_server.recorder.messages) == 1  # the server did get the data
    held = to_application_error(error.classified, max_retry_after=300,
                                reconcilable=mail.reconcilable)
    assert (held.type, held.non_retryable) == (ErrorType.AMBIGUOUS.value, True)


async def test_smtp_no_final_reply_before_timeout_is_unknown(smtp_server: SmtpServer) -> None:
    smtp_server.recorder.data_reply = "hang"
    error = await failure(smtp_mail(smtp_server.port, timeout=0.5).send(
        str(uuid.uuid4()), followup("ada@example.com")))
    assert (error.classified.category, error.classified.reason) == (U, "smtp_timeout")


async def test_smtp_hands_nothing_over_without_time_left_on_the_lease(
    smtp_server: SmtpServer,
) -> None:
    """Too little of the send lease left for DATA: nothing is handed over (transient), so an
    attempt that lost its lease cannot deliver after an opt-out recorded once it expired."""
    message = dataclasses.replace(followup("ada@example.com"),
                                  deliver_by=time.monotonic() + 0.5)
    error = await failure(smtp_mail(smtp_server.port, timeout=30).send(str(uuid.uuid4()),
                                                                       message))
    assert (error.classified.category, error.classified.reason) == (T, "smtp_lease_too_short")
    assert smtp_server.recorder.messages == []


async def test_smtp_delivery_ends_inside_the_lease_even_with_a_long_timeout(
    smtp_server: SmtpServer,
) -> None:
    """The server takes the data and then stalls; the client's command timeout (30 s) is far
    longer than the lease: the attempt still ends (unknown) before the lease does."""
    smtp_server.recorder.data_reply = "hang"
    deliver_by = time.monotonic() + 5
    message = dataclasses.replace(followup("ada@example.com"), deliver_by=deliver_by)

    error = await failure(smtp_mail(smtp_server.port, timeout=30).send(str(uuid.uuid4()),
                                                                       message))

    assert time.monotonic() < deliver_by
    assert (error.classified.category, error.classified.reason) == (U, "smtp_timeout")


async def test_smtp_failures_before_data_are_transient(smtp_server: SmtpServer) -> None:
    """Nothing before DATA can deliver a message: a drop there is safe to retry."""
    smtp_server.recorder.rcpt_reply = "drop"
    error = await failure(smtp_mail(smtp_server.port).send(str(uuid.uuid4()),
                                                           followup("ada@example.com")))
    assert (error.classified.category, error.classified.reason) == (T, "smtp_disconnected")
    assert smtp_server.recorder.messages == []


async def test_smtp_connection_refused_is_transient() -> None:
    error = await failure(smtp_mail(free_port()).send(str(uuid.uuid4()),
                                                      followup("ada@example.com")))
    assert (error.classified.category, error.classified.reason) == (T, "connection_refused")


async def test_smtp_refuses_header_injection() -> None:
    message = OutgoingEmail(to="ada@example.com", subject="Hi", text="x",
                            headers={"X-Note": "a\r\nBcc: victim@example.com"})
    error = await failure(smtp_mail(free_port()).send(str(uuid.uuid4()), message))
    assert (error.classified.category, error.classified.reason) == (P, "invalid_message")


# --- SMTP with STARTTLS and AUTH ---------------------------------------------------------------
class Authenticator:
    def __call__(self, server: SMTPServer, session: Session, envelope: Envelope,
                 mechanism: str, auth_data: Any) -> AuthResult:
        ok = isinstance(auth_data, LoginPassword) and auth_data.password == b"right"
        return AuthResult(success=ok, handled=False)  # aiosmtpd answers 235 / 535


@pytest.mark.parametrize(("password", "category"), [("right", None), ("wrong", P)])
async def test_smtp_starttls_and_auth(tmp_path: Path, password: str,
                                      category: Category | None) -> None:
    cert, key = self_signed_certificate(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    recorder, port = Recorder(), free_port()
    controller = Controller(recorder, hostname="127.0.0.1", port=port,
                            server_hostname="127.0.0.1", tls_context=server_tls,
                            require_starttls=True, auth_required=True,
                            authenticator=Authenticator())
    controller.start()
    client_tls = ssl.create_default_context(cafile=str(cert))
    mail = SmtpMail("127.0.0.1", port, sender="sales@acme.test", security="starttls",
                    username="worker", password=password, timeout=3, tls_context=client_tls)
    try:
        if category is None:
            await mail.send(str(uuid.uuid4()), followup("ada@example.com"))
            assert len(recorder.messages) == 1
        else:
            error = await failure(mail.send(str(uuid.uuid4()), followup("ada@example.com")))
            assert (error.classified.category, error.classified.reason) == (P, "smtp_535")
            assert recorder.messages == []
    finally:
        controller.stop()


# --- through the outbox, with the real database ----------------------------------------------
@dataclass
class Seeded:
    op: OperationInput
    contact_id: str
    intent_id: str
    email: str


async def seed(db: asyncpg.Pool, action: str) -> Seeded:
    """An event, a contact, a follow-up intent and one operation row, as match_and_plan
    would leave them (own tenant and workflow prefix: other tests' scopes never see them)."""
    workflow_id = f"adapters-test/{uuid.uuid4()}"
    address = new_email("outbox")
    async with db.acquire() as conn, conn.transaction():
        event_id = await conn.fetchval(
            "INSERT INTO inbound_events (tenant, source, mailbox, delivery_id, workflow_id, "
            "content_sha256, size_bytes, state) VALUES ('acme', 'test', "
            "'sales@acme.test', $1, $1, '0', 0, 'matching') RETURNING event_id", workflow_id)
        contact_id = await conn.fetchval(
            "INSERT INTO contacts (tenant, canonical_email, email, name, company) VALUES "
            "('acme', $1, $1, 'Ada Lovelace', 'Analytical') RETURNING contact_id",
            address)
        intent_id = await conn.fetchval(
            "INSERT INTO followup_intents (event_id, tenant, contact_id, rule_id, rule_version,"
            " template_id) VALUES ($1, 'acme', $2, 'ack', 1, 'ack-v1') "
            "RETURNING intent_id", event_id, contact_id)
        ref = str(contact_id) if action == "crm-upsert" else str(intent_id)
        op_key = f"{workflow_id}:{action}"
        await conn.execute(
            "INSERT INTO operations (op_key, workflow_id, event_id, action, max_attempts, "
            "external_ref) VALUES ($1, $2, $3, $4, 6, $5)",
            op_key, workflow_id, event_id, action, ref)
    op = OperationInput(ItemRef(str(event_id), workflow_id, "acme"), op_key)
    return Seeded(op, str(contact_id), str(intent_id), address)


async def operation_row(db: asyncpg.Pool, op_key: str) -> asyncpg.Record:
    row = await db.fetchrow("SELECT status, attempts, last_error_category, last_error, "
                            "destination_id FROM operations WHERE op_key = $1", op_key)
    assert row is not None
    return row


async def test_outbox_holds_an_unconfirmed_smtp_send_and_never_repeats_it(
    db: asyncpg.Pool, smtp_server: SmtpServer, app_settings: Settings,
) -> None:
    seeded = await seed(db, "send")
    smtp_server.recorder.data_reply = "drop"
    send = SendActivities(db, smtp_mail(smtp_server.port), 300, app_settings)
    activity_env = step_env()

    with pytest.raises(ApplicationError) as first:
        await activity_env.run(send.submit_followup_email, seeded.op)
    assert (first.value.type, first.value.non_retryable) == (ErrorType.AMBIGUOUS.value, True)
    row = await operation_row(db, seeded.op.op_key)
    assert (row["status"], row["last_error_category"], row["last_error"]) == (
        "ambiguous", "unknown", "smtp_disconnected")
    assert len(smtp_server.recorder.messages) == 1

    # Another attempt (a Temporal retry) cannot ask SMTP what happened: it stays held and
    # sends nothing. Only a person who checked can say `retry` (tests/test_fencing.py).
    smtp_server.recorder.data_reply = "250 OK"
    with pytest.raises(ApplicationError) as second:
        await activity_env.run(send.submit_followup_email, seeded.op)
    assert second.value.type == ErrorType.AMBIGUOUS.value
    assert len(smtp_server.recorder.messages) == 1
    assert (await operation_row(db, seeded.op.op_key))["status"] == "ambiguous"


async def test_outbox_sends_over_smtp_and_records_the_message_id(
    db: asyncpg.Pool, smtp_server: SmtpServer, app_settings: Settings,
) -> None:
    seeded = await seed(db, "send")
    send = SendActivities(db, smtp_mail(smtp_server.port), 300, app_settings)

    result = await step_env().run(send.submit_followup_email, seeded.op)

    assert result.status == "completed"
    assert result.destination_id == f"<{seeded.intent_id}@acme.test>"
    intent = await db.fetchrow("SELECT status, provider_message_id FROM followup_intents "
                               "WHERE intent_id = $1::uuid", seeded.intent_id)
    assert intent is not None and tuple(intent) == ("sent", result.destination_id)
    [envelope] = smtp_server.recorder.messages
    assert envelope.rcpt_tos == [seeded.email]


async def test_outbox_reconciles_a_salesforce_timeout_after_commit(
    db: asyncpg.Pool, sandbox: httpx.AsyncClient, stack: Stack,
) -> None:
    seeded = await seed(db, "crm-upsert")
    crm = SalesforceCrm(stack.sandbox_url, None, timeout=CLIENT_TIMEOUT)
    activities = CrmActivities(db, crm, 300)
    activity_env = ActivityEnvironment()
    await inject(sandbox, "crm.upsert", "timeout_after_commit")
    try:
        with pytest.raises(ApplicationError) as first:
            await activity_env.run(activities.upsert_contact_in_crm, seeded.op)
        assert first.value.type == ErrorType.UNKNOWN_OUTCOME.value  # retried, reconciled
        before = len((await sandbox.get("/_sandbox/calls",
                                        params={"target": "crm.upsert"})).json()["calls"])

        result = await activity_env.run(activities.upsert_contact_in_crm, seeded.op)
    finally:
        await crm.aclose()

    [record] = await records_for(sandbox, seeded.email)
    assert (result.status, result.reconciled, result.destination_id) == (
        "completed", True, record["id"])
    after = len((await sandbox.get("/_sandbox/calls",
                                   params={"target": "crm.upsert"})).json()["calls"])
    assert after == before  # found by external ID: not upserted again
    stored = await db.fetchval("SELECT crm_record_id FROM contacts WHERE contact_id = $1::uuid",
                               seeded.contact_id)
    assert stored == record["id"]
    assert record["properties"][EXT_FIELD] == seeded.contact_id


async def test_outbox_blocks_on_a_salesforce_expired_session(
    db: asyncpg.Pool, sandbox: httpx.AsyncClient, stack: Stack,
) -> None:
    seeded = await seed(db, "crm-upsert")
    crm = SalesforceCrm(stack.sandbox_url, None, timeout=CLIENT_TIMEOUT)
    await inject(sandbox, "crm.upsert", "unauthorized")
    try:
        with pytest.raises(ApplicationError) as caught:
            await ActivityEnvironment().run(CrmActivities(db, crm, 300).upsert_contact_in_crm,
                                            seeded.op)
    finally:
        await crm.aclose()
    assert (caught.value.type, caught.value.non_retryable) == (ErrorType.PERMANENT.value, True)
    row = await operation_row(db, seeded.op.op_key)
    assert (row["status"], row["last_error"]) == ("blocked", "http_401:INVALID_SESSION_ID")


# --- the factory ---------------------------------------------------------------------------------
def settings(**values: Any) -> Settings:
    return Settings(**values)


def test_factory_defaults_to_the_sandbox() -> None:
    s = settings(sandbox_url="http://sandbox.test")
    assert isinstance(build_crm(s), HubSpotCrm)
    assert isinstance(build_mail(s), ResendMail)


def test_factory_builds_salesforce_and_smtp() -> None:
    s = settings(crm_provider="salesforce", salesforce_instance_url="https://acme.my.sf.test",
                 salesforce_token=SecretStr("tok"), mail_provider="smtp",
                 smtp_host="smtp.test", smtp_password=SecretStr("pw"))
    crm, mail = build_crm(s), build_mail(s)
    assert isinstance(crm, SalesforceCrm) and crm.name == "salesforce"
    assert isinstance(mail, SmtpMail) and mail.reconcilable is False


@pytest.mark.parametrize("values", [
    {"crm_provider": "salesforce"},                   # no instance URL
    {"crm_provider": "hubspot"},                      # no token
    {"mail_provider": "smtp"},                        # no host
    {"mail_provider": "resend"},                      # no token
])
def test_factory_refuses_incomplete_settings(values: dict[str, str]) -> None:
    build = build_crm if "crm_provider" in values else build_mail
    with pytest.raises(ConfigurationError):
        build(settings(**values))


async def test_hubspot_setup_creates_the_note_property_in_its_own_group() -> None:
    seen: list[tuple[str, str, dict]] = []  # type: ignore[type-arg]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, json.loads(request.content or b"{}")))
        return httpx.Response(201, json={"name": "x"})

    from inboxcrm.operator.hubspot_setup import run_note_setup

    result = await run_note_setup("http://hubspot.test", "tok",
                                  transport=httpx.MockTransport(handler))
    assert result.status == "created"
    assert [(m, p) for m, p, _ in seen] == [("POST", "/crm/v3/properties/notes/groups"),
                                           ("POST", "/crm/v3/properties/notes")]
    prop = seen[1][2]
    assert (prop["name"], prop["groupName"], prop["hasUniqueValue"]) == (
        "inboxcrm_note_id", "inboxcrm", True)
