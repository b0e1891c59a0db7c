"""Salesforce through an OAuth flow that renews its own token (docs/architecture.md §5): the
adapter fetches an access token with the client credentials flow from a real sandbox
process over HTTP, and when the session expires (the sandbox's clock moved past the org's
session timeout) the next call meets 401 INVALID_SESSION_ID, renews once and goes through:
an expiry never blocks an item. Counted on the destination side (`/_sandbox/state`,
`/_sandbox/calls`)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from inboxcrm.activities.crm import CrmActivities
from inboxcrm.adapters.base import AdapterError, ContactFields
from inboxcrm.adapters.errors import Category
from inboxcrm.adapters.salesforce import ClientCredentials, SalesforceCrm
from tests.helpers.outbox import planned_item, step_env
from tests.helpers.sandbox_process import API_KEY, SandboxProcess, own_sandbox

FIELD = "Inboxcrm_Contact_Id__c"
SESSION_SECONDS = 7200  # the sandbox's default session timeout, as Salesforce's


@pytest.fixture(scope="module")
async def org(postgres_server_url: str) -> AsyncIterator[SandboxProcess]:
    """A sandbox of its own (its own database: an org nobody else writes to)."""
    async for process in own_sandbox(postgres_server_url, "sandbox_oauth"):
        yield process


@pytest.fixture
async def control(org: SandboxProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=org.url, timeout=10) as client:
        (await client.post("/_sandbox/reset")).raise_for_status()
        yield client


def _crm(org: SandboxProcess, secret: str = API_KEY) -> tuple[SalesforceCrm, ClientCredentials]:
    oauth = ClientCredentials(f"{org.url}/services/oauth2/token", "inboxcrm-test-app", secret)
    return SalesforceCrm(org.url, None, oauth=oauth), oauth


async def _calls(control: httpx.AsyncClient, target: str) -> list[tuple[str, int]]:
    body = (await control.get("/_sandbox/calls", params={"target": target})).json()
    return [(c["outcome"], c["status_code"]) for c in body["calls"]]


async def _records(control: httpx.AsyncClient, external_id: str) -> list[dict[str, Any]]:
    contacts = (await control.get("/_sandbox/state")).json()["contacts"]
    return [c for c in contacts if c["properties"].get(FIELD) == external_id]


async def test_the_token_response_has_salesforce_shape(control: httpx.AsyncClient) -> None:
    answer = await control.post("/services/oauth2/token", data={
        "grant_type": "client_credentials", "client_id": "app", "client_secret": API_KEY})
    assert answer.status_code == 200
    body = answer.json()
    assert {"access_token", "signature", "instance_url", "id", "token_type",
            "issued_at"} <= set(body)
    assert body["token_type"] == "Bearer" and body["issued_at"].isdigit()
    assert body["access_token"].startswith("00D") and "!" in body["access_token"]
    wrong = await control.post("/services/oauth2/token", data={
        "grant_type": "client_credentials", "client_id": "app", "client_secret": "nope"})
    assert (wrong.status_code, wrong.json()["error"]) == (400, "invalid_client")
    grant = await control.post("/services/oauth2/token", data={"grant_type": "password"})
    assert (grant.status_code, grant.json()["error"]) == (400, "unsupported_grant_type")


async def test_an_expired_token_is_renewed_once_and_the_upsert_goes_through(
        org: SandboxProcess, control: httpx.AsyncClient) -> None:
    crm, oauth = _crm(org)
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    try:
        created = await crm.upsert_contact(first, ContactFields("ada@example.com", "Ada L"))
        assert created.created is True and oauth.fetched == 1

        # The org's session timeout passes: the token Salesforce gave is refused from now on.
        (await control.post("/_sandbox/clock",
                            json={"advance_seconds": SESSION_SECONDS + 60})).raise_for_status()
        again = await crm.upsert_contact(second, ContactFields("bob@example.com", "Bob M"))
        assert again.created is True
        assert oauth.fetched == 2  # renewed once, then the call was repeated

        # Concurrent calls meeting one expired session renew it once, not once each.
        (await control.post("/_sandbox/clock",
                            json={"advance_seconds": SESSION_SECONDS + 60})).raise_for_status()
        found = await asyncio.gather(*(crm.find_contact(first) for _ in range(5)))
        assert {f.record_id for f in found if f} == {created.record_id}
        assert oauth.fetched == 3
    finally:
        await crm.aclose()
    # Match before create reads first (by External ID, then by email): the expired session
    # is met by the first read of the second upsert, renewed, and the upsert goes through.
    assert await _calls(control, "crm.upsert") == [("ok", 201), ("ok", 201)]
    searches = await _calls(control, "crm.search")
    assert searches.count(("session_expired", 401)) == 6  # the second upsert, 5 finds
    # The first upsert: our ID on Contact, then on Lead (both 404), SOQL by email on Contact
    # and Lead (200); the second upsert's first read meets the expired session.
    assert searches[:5] == [("not_found", 404)] * 2 + [("ok", 200)] * 2 + [
        ("session_expired", 401)]
    assert await _calls(control, "crm.oauth") == [("ok", 200)] * 3
    assert len(await _records(control, first)) == 1 and len(await _records(control, second)) == 1


async def test_an_item_is_not_blocked_by_an_expired_session(
        org: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool) -> None:
    """The CRM step of a real item, through the attempt protocol and the ledger: the session
    expires between two items; the second completes on its first attempt."""
    crm, oauth = _crm(org)
    activities = CrmActivities(store, crm, 300)
    try:
        for _ in range(2):
            item = await planned_item(store)
            result = await step_env().run(activities.upsert_contact_in_crm,
                                          item.op("crm-upsert"))
            assert result.status == "completed" and not result.reconciled
            row = await store.fetchrow(
                "SELECT status, attempts FROM operations WHERE op_key = $1",
                item.op("crm-upsert").op_key)
            assert (row["status"], row["attempts"]) == ("completed", 1)
            assert len(await _records(control, item.contact_id)) == 1
            (await control.post("/_sandbox/clock",
                                json={"advance_seconds": SESSION_SECONDS + 60})
             ).raise_for_status()
    finally:
        await crm.aclose()
    assert oauth.fetched == 2
    # The expired session is met by match before create's first read, before any write.
    assert ("session_expired", 401) in await _calls(control, "crm.search")


async def test_wrong_app_credentials_block_without_calling_the_crm(
        org: SandboxProcess, control: httpx.AsyncClient) -> None:
    crm, _ = _crm(org, secret="not-the-secret")
    try:
        with pytest.raises(AdapterError) as info:
            await crm.upsert_contact(str(uuid.uuid4()), ContactFields("eve@example.com"))
    finally:
        await crm.aclose()
    assert info.value.classified.category is Category.PERMANENT
    assert info.value.classified.reason == "http_400:invalid_client"
    assert await _calls(control, "crm.upsert") == []
