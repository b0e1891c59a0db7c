"""Adoption under faults (issue 35): a person a salesperson created in the CRM (no ID of
ours, an owner) writes in while the CRM misbehaves, on HubSpot, Salesforce and Pipedrive.
The faults are the sandbox's own (`/_sandbox/faults`): a 429 on the lookup (or, on HubSpot,
on the upsert whose 409 names the record), a 5xx on the write that marks the record ours,
and that write committed with its answer lost (`timeout_after_commit`). The CRM step of a
real item is run through the attempt protocol and the ledger, each attempt after a failure
as Temporal would retry it, against a sandbox process of its own; afterwards exactly one
record holds the email (counted at the sandbox), it carries our external ID, its owner is
untouched and the operation is completed. Each case checks that its fault was met."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from temporalio.exceptions import ApplicationError

from inboxcrm.activities.crm import CrmActivities
from inboxcrm.adapters.base import CrmClient
from inboxcrm.adapters.hubspot import HubSpotCrm
from inboxcrm.adapters.registry import Secrets, crm_provider
from inboxcrm.adapters.salesforce import SalesforceCrm
from inboxcrm.platform.config import Settings
from inboxcrm.sandbox.pipedrive import CUSTOM_FIELD_KEY
from inboxcrm.schemas.destinations import TenantDestinations
from tests.helpers.outbox import planned_item, step_env
from tests.helpers.sandbox_process import API_KEY, SandboxProcess, own_sandbox

PIPEDRIVE_KEY = "PIPEDRIVE_FAULTS_TEST_TOKEN"
OURS = {"hubspot": "inboxcrm_contact_id", "salesforce": "Inboxcrm_Contact_Id__c",
        "pipedrive": CUSTOM_FIELD_KEY}
OWNER = {"hubspot": ("hubspot_owner_id", "7001"), "salesforce": ("OwnerId", "005SALES"),
         "pipedrive": ("owner_id", "77")}
# The call each CRM's adoption makes first: HubSpot's upsert (its 409 names the record),
# the others' lookup by email.
FIRST = {"hubspot": "crm.upsert", "salesforce": "crm.search", "pipedrive": "crm.search"}
MAX_ATTEMPTS = 6


@pytest.fixture(scope="module")
async def org(postgres_server_url: str) -> AsyncIterator[SandboxProcess]:
    async for process in own_sandbox(postgres_server_url, "sandbox_adopt_faults"):
        yield process


@pytest.fixture
async def control(org: SandboxProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=org.url, timeout=10) as client:
        (await client.post("/_sandbox/reset")).raise_for_status()
        (await client.post("/_sandbox/config", json={"hang_seconds": 2})).raise_for_status()
        yield client
        await client.delete("/_sandbox/faults")
        await client.post("/_sandbox/config", json={"hang_seconds": 30})


def _client(org: SandboxProcess, provider: str, monkeypatch: pytest.MonkeyPatch) -> CrmClient:
    """The provider's client with a 1 s timeout (a held answer is an unknown outcome)."""
    if provider == "hubspot":
        return HubSpotCrm(org.url, API_KEY, OURS["hubspot"], 1.0)
    if provider == "salesforce":
        return SalesforceCrm(org.url, API_KEY, timeout=1.0)
    monkeypatch.setenv(PIPEDRIVE_KEY, API_KEY)
    spec = TenantDestinations.model_validate({"crm": {
        "provider": "pipedrive", "url": org.url, "token": {"env": PIPEDRIVE_KEY},
        "external_id_field": "inboxcrm contact ID"}}).crm
    assert spec is not None
    client: CrmClient = crm_provider("pipedrive").for_tenant(
        spec, Settings(http_timeout_seconds=1.0), Secrets("tenant 'acme' destinations.crm"))
    return client


async def _with_email(control: httpx.AsyncClient, email: str) -> list[dict[str, Any]]:
    contacts = (await control.get("/_sandbox/state")).json()["contacts"]
    return [c for c in contacts if str(c["properties"].get("email", "")).lower() == email]


CASES = [(provider, target, mode)
         for provider in ("hubspot", "salesforce", "pipedrive")
         for target, mode in ((FIRST[provider], "rate_limit"),
                              ("crm.update", "server_error"),
                              ("crm.update", "timeout_after_commit"))]


@pytest.mark.parametrize("provider, target, mode", CASES)
async def test_an_existing_record_is_adopted_once_under_faults(
        org: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool,
        monkeypatch: pytest.MonkeyPatch, provider: str, target: str, mode: str) -> None:
    item = await planned_item(store, max_attempts=MAX_ATTEMPTS)
    owner_field, owner = OWNER[provider]
    seeded = await control.post("/_sandbox/seed", json={"crm": provider, "contacts": [
        {"email": item.email, "lastname": "Seeded", "owner": owner}]})
    seeded.raise_for_status()
    [record] = [c["id"] for c in seeded.json()["contacts"]]
    (await control.post("/_sandbox/faults", json={"target": target, "mode": mode,
                                                  "retry_after": 0})).raise_for_status()
    crm = _client(org, provider, monkeypatch)
    activities = CrmActivities(store, crm, 300)
    failures, result = 0, None
    try:
        for _ in range(MAX_ATTEMPTS):
            try:
                result = await step_env().run(activities.upsert_contact_in_crm,
                                              item.op("crm-upsert"))
                break
            except ApplicationError:
                failures += 1  # retried, as the step's RetryPolicy would
    finally:
        await crm.aclose()
    assert result is not None and result.status == "completed", result
    assert result.destination_id == record
    assert failures >= 1  # the fault was met by an attempt...
    calls = (await control.get("/_sandbox/calls", params={"target": target})).json()["calls"]
    assert mode in [c["outcome"] for c in calls]  # ...at the call it was meant for
    [held] = await _with_email(control, item.email)  # exactly one record
    assert held["id"] == record
    assert held["properties"][OURS[provider]] == item.contact_id
    assert str(held["properties"][owner_field]) == owner and \
        held["properties"]["lastname"] == "Seeded"
    row = await store.fetchrow("SELECT o.status, c.crm_record_id FROM operations o JOIN "
                               "contacts c ON c.contact_id = $2::uuid WHERE o.op_key = $1",
                               item.op("crm-upsert").op_key, item.contact_id)
    assert row is not None and (row["status"], row["crm_record_id"]) == ("completed", record)
    if mode == "timeout_after_commit":
        assert result.reconciled is True  # found by our ID, not written again
