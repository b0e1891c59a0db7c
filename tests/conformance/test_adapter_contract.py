"""The protocol every registered provider's adapter keeps, on a real sandbox process: each
provider with a sandbox subset is built the way a tenant's policy builds it (its block
through the registry, the API key by reference), and shown, counted on the sandbox's side,
that a repeated write leaves one record, note or email and that its lookups find what was
written and nothing else. A new provider is checked here without this file changing; its
own module (`tests/conformance/test_<provider>.py`) adds what is particular to it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from inboxcrm.adapters.base import (
    ContactFields,
    CrmClient,
    CrmConsent,
    MailClient,
    OutgoingEmail,
)
from inboxcrm.adapters.registry import Provider, Secrets, providers
from inboxcrm.platform.config import Settings
from inboxcrm.schemas.destinations import TenantDestinations
from tests.helpers.sandbox_process import API_KEY, SandboxProcess

KEY_VARIABLE = "CONTRACT_SANDBOX_KEY"
CRM = [p for p in providers("crm").values() if p.sandbox]
MAIL = [p for p in providers("mail").values() if p.sandbox]


def _build(provider: Provider[Any, Any], url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The client a tenant policy naming this provider on the sandbox gets."""
    monkeypatch.setenv(KEY_VARIABLE, API_KEY)
    block = {"provider": provider.name, "url": url, "token": {"env": KEY_VARIABLE}}
    spec = getattr(TenantDestinations.model_validate({provider.kind: block}), provider.kind)
    return provider.for_tenant(spec, Settings(sandbox_url="http://unused.invalid"),
                               Secrets(f"contract {provider.name}"))


async def _state(sandbox: SandboxProcess) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=sandbox.url, timeout=10) as control:
        answer = await control.get("/_sandbox/state")
        answer.raise_for_status()
        state: dict[str, Any] = answer.json()
        return state


@pytest.fixture(params=CRM, ids=lambda p: p.name)
async def crm(request: pytest.FixtureRequest, sandbox: SandboxProcess,
              monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[CrmClient]:
    client: CrmClient = _build(request.param, sandbox.url, monkeypatch)
    yield client
    await client.aclose()


@pytest.fixture(params=MAIL, ids=lambda p: p.name)
async def mail(request: pytest.FixtureRequest, sandbox: SandboxProcess,
               monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[MailClient]:
    client: MailClient = _build(request.param, sandbox.url, monkeypatch)
    yield client
    await client.aclose()


def test_every_crm_and_mail_kind_has_a_provider_to_check() -> None:
    assert {p.name for p in CRM} >= {"hubspot", "salesforce"} and MAIL


async def test_a_repeated_upsert_and_note_leave_one_of_each(
        crm: CrmClient, sandbox: SandboxProcess) -> None:
    external_id, note_key = str(uuid.uuid4()), str(uuid.uuid4())
    email = f"contract-{uuid.uuid4().hex[:10]}@example.com"
    fields = ContactFields(email=email, name="Ada Lovelace", company="Analytical")
    first = await crm.upsert_contact(external_id, fields)
    again = await crm.upsert_contact(external_id, fields)
    assert again.record_id == first.record_id
    when = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    note = await crm.log_note(note_key, first.record_id, "Inbound email", when)
    assert await crm.log_note(note_key, first.record_id, "Inbound email", when) == note

    state = await _state(sandbox)
    records = [c for c in state["contacts"]
               if str(c["properties"].get("email", "")).lower() == email]
    assert len(records) == 1 and str(records[0]["id"]) == first.record_id
    assert len([n for n in state["notes"] if note_key in str(n)]) == 1

    found = await crm.find_contact(external_id)
    assert found is not None and found.record_id == first.record_id
    view = await crm.read_contact(first.record_id)
    assert view is not None and view.external_id == external_id
    assert await crm.find_note(note_key) == note
    assert await crm.find_contact(str(uuid.uuid4())) is None
    assert await crm.find_note(str(uuid.uuid4())) is None


async def test_an_opt_out_written_twice_reads_back_once(
        crm: CrmClient, sandbox: SandboxProcess) -> None:
    """A CRM with an opt-out field (`CrmConsent`, docs/consent.md): written by our write,
    read back by our read, repeatable; the record's other fields stay as they were."""
    if not isinstance(crm, CrmConsent):
        pytest.skip(f"{crm.name} has no CRM opt-out field (inboxcrm's list alone)")
    email = f"contract-{uuid.uuid4().hex[:10]}@example.com"
    record = await crm.upsert_contact(str(uuid.uuid4()), ContactFields(email=email,
                                                                      name="Ada Lovelace"))
    before = await crm.read_opt_out(record.record_id)
    assert (before.opted_out, before.field) == (False, crm.consent_field)
    for _ in range(2):
        written = await crm.write_opt_out(email, record.record_id)
        assert written.field == crm.consent_field and written.record_ids == (record.record_id,)
    assert (await crm.read_opt_out(record.record_id)).opted_out is True
    records = [c for c in (await _state(sandbox))["contacts"]
               if str(c["properties"].get("email", "")).lower() == email]
    assert len(records) == 1
    # A checkbox reads "true" (HubSpot, Salesforce); Pipedrive's marketing_status is an enum.
    assert records[0]["properties"][crm.consent_field] in ("true", "unsubscribed")
    assert records[0]["properties"].get("firstname") == "Ada"


async def test_a_repeated_send_leaves_one_email(mail: MailClient,
                                                sandbox: SandboxProcess) -> None:
    key = str(uuid.uuid4())
    message = OutgoingEmail(to=f"contract-{uuid.uuid4().hex[:10]}@example.com",
                            subject="Thanks", text="We got your message.",
                            sender="Sales <sales@acme.test>")
    first = await mail.send(key, message)
    assert (await mail.send(key, message)).message_id == first.message_id
    emails = [e for e in (await _state(sandbox))["emails"] if e["idempotency_key"] == key]
    assert len(emails) == 1
    read = await mail.read_sent(first.message_id)
    assert read is not None and read.message_id == first.message_id
