"""Later upserts of a record we did not create (issue 35): a salesperson's record, adopted or
the survivor of a merge, is never written over. Through the CRM step (attempt protocol,
ledger, `contacts.crm_origin`) against real sandbox processes: the person writes again with
another display name, company and spelling of the address; the record keeps the
salesperson's name, email and owner, and gets only the empty field the policy allows. Our own
record is still updated as before, with no read more. Read back through the official SDKs
(hubspot-api-client, simple-salesforce over https, pipedrive-python-lib as the conformance
suite uses it) from the destination side. The merges: HubSpot's and Salesforce's, and
Pipedrive's `PUT /v1/persons/{id}/merge`, followed to the survivor with no record created."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from pipedrive.client import Client as PipedriveClient
from temporalio.exceptions import ApplicationError

from inboxcrm.activities.crm import CrmActivities
from inboxcrm.adapters.base import CrmClient
from inboxcrm.adapters.hubspot import HubSpotCrm
from inboxcrm.adapters.pipedrive import PipedriveCrm
from inboxcrm.adapters.salesforce import SalesforceCrm
from inboxcrm.sandbox.pipedrive import CUSTOM_FIELD_KEY
from inboxcrm.schemas.models import OperationInput
from tests.helpers.conformance import hubspot_client, salesforce_client
from tests.helpers.outbox import PlannedItem, later_item, planned_item, step_env
from tests.helpers.sandbox_process import API_KEY, SandboxProcess, free_port, running
from tests.helpers.tls import self_signed_certificate

HS_PROPERTY = "inboxcrm_contact_id"
SF_FIELD = "Inboxcrm_Contact_Id__c"
SF_COMPANY = "Inboxcrm_Company__c"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
async def org(postgres_server_url: str, tmp_path_factory: pytest.TempPathFactory
              ) -> AsyncIterator[tuple[SandboxProcess, SandboxProcess]]:
    """Two sandbox processes on one database of its own: http for the adapters, https for
    simple-salesforce (it speaks only https)."""
    from inboxcrm.stack import postgres

    url = await postgres.create_database(postgres_server_url, "sandbox_later_upserts")
    certificate = self_signed_certificate(tmp_path_factory.mktemp("tls"))
    try:
        async for plain in running(SandboxProcess(url, free_port())):
            async for tls in running(SandboxProcess(url, free_port(), tls=certificate)):
                yield plain, tls
    finally:
        await postgres.drop_database(postgres_server_url, url)


@pytest.fixture
async def control(org: tuple[SandboxProcess, SandboxProcess]
                  ) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=org[0].url, timeout=10) as client:
        (await client.post("/_sandbox/reset")).raise_for_status()
        yield client


def _client(org: tuple[SandboxProcess, SandboxProcess], provider: str) -> CrmClient:
    url = org[0].url
    if provider == "hubspot":
        return HubSpotCrm(url, API_KEY, HS_PROPERTY, 10)
    if provider == "pipedrive":
        return PipedriveCrm(url, API_KEY, external_id_field=CUSTOM_FIELD_KEY)
    return SalesforceCrm(url, API_KEY)


async def _seed(control: httpx.AsyncClient, crm: str, record: dict[str, Any]) -> str:
    response = await control.post("/_sandbox/seed", json={"crm": crm, "contacts": [record]})
    response.raise_for_status()
    return str(response.json()["contacts"][0]["id"])


async def _step(org: tuple[SandboxProcess, SandboxProcess], provider: str,
                store: asyncpg.Pool, op: OperationInput) -> Any:
    crm = _client(org, provider)
    try:
        return await step_env().run(CrmActivities(store, crm, 300).upsert_contact_in_crm, op)
    finally:
        await crm.aclose()


async def _later(store: asyncpg.Pool, item: PlannedItem, *, name: str, company: str | None,
                 email: str | None = None) -> OperationInput:
    """The same person writes again: another display name and company (planning writes what
    the policy's `updatable_fields` allows onto our contact), another spelling of the
    address; a new item whose CRM upsert is queued."""
    await store.execute("UPDATE contacts SET name = $2, company = $3, email = $4 "
                        "WHERE contact_id = $1::uuid", item.contact_id, name, company,
                        email or item.email.upper())
    ref = await later_item(store, str(item.contact_id), "crm-upsert")
    return OperationInput(ref, f"{ref.workflow_id}:crm-upsert")


def _read_back(org: tuple[SandboxProcess, SandboxProcess], provider: str,
               record_id: str) -> dict[str, Any]:
    """The record as the official SDK reads it: name, company, email, owner, our ID."""
    plain, tls = org
    if provider == "hubspot":
        client = hubspot_client(plain.url, API_KEY)
        read = client.crm.contacts.basic_api.get_by_id(
            contact_id=record_id,
            properties=["firstname", "lastname", "company", "email", "hubspot_owner_id",
                        HS_PROPERTY])
        p = read.properties
        return {"first": p.get("firstname"), "last": p.get("lastname"),
                "company": p.get("company"), "email": p.get("email"),
                "owner": p.get("hubspot_owner_id"), "ours": p.get(HS_PROPERTY)}
    if provider == "salesforce":
        assert tls.tls is not None
        sf = salesforce_client(tls.url, API_KEY, tls.tls[0])
        r = sf.Contact.get(record_id)
        return {"first": r.get("FirstName"), "last": r.get("LastName"),
                "company": r.get(SF_COMPANY), "email": r.get("Email"),
                "owner": r.get("OwnerId"), "ours": r.get(SF_FIELD)}
    client = PipedriveClient(domain=plain.url)
    client.set_api_token(API_KEY)
    person = client.persons.get_person(int(record_id))["data"]
    return {"first": person["first_name"], "last": person["last_name"], "company": None,
            "email": person["email"][0]["value"], "owner": str(person["owner_id"]["id"]),
            "ours": person.get(CUSTOM_FIELD_KEY)}


async def _upserted(store: asyncpg.Pool, op: OperationInput) -> list[dict[str, Any]]:
    rows = await store.fetch("SELECT detail FROM audit_log WHERE workflow_id = $1 AND "
                             "action = 'crm_upserted'", op.item.workflow_id)
    return [r["detail"] if isinstance(r["detail"], dict) else json.loads(r["detail"])
            for r in rows]


async def _audit_of(store: asyncpg.Pool, contact_id: str, action: str
                    ) -> list[dict[str, Any]]:
    rows = await store.fetch("SELECT detail FROM audit_log WHERE contact_id = $1::uuid AND "
                             "action = $2 ORDER BY audit_id", contact_id, action)
    return [r["detail"] if isinstance(r["detail"], dict) else json.loads(r["detail"])
            for r in rows]


async def _origin(store: asyncpg.Pool, contact_id: str) -> tuple[str | None, str | None]:
    row = await store.fetchrow("SELECT crm_record_id, crm_origin FROM contacts WHERE "
                               "contact_id = $1::uuid", contact_id)
    assert row is not None
    return row["crm_record_id"], row["crm_origin"]


OWNERS = {"hubspot": "7001", "salesforce": "005SALES", "pipedrive": "4242"}


@pytest.mark.parametrize("provider", ["hubspot", "salesforce", "pipedrive"])
async def test_an_adopted_record_is_filled_never_written_over(
        org: tuple[SandboxProcess, SandboxProcess], control: httpx.AsyncClient,
        store: asyncpg.Pool, provider: str) -> None:
    item = await planned_item(store)
    owner = OWNERS[provider]
    seeded = await _seed(control, provider, {"email": item.email, "owner": owner,
                                             "firstname": "Sally", "lastname": "Seller"})
    first = await _step(org, provider, store, item.op("crm-upsert"))
    assert (first.status, first.destination_id) == ("completed", seeded)
    assert await _origin(store, item.contact_id) == (seeded, "adopted")

    later = await _later(store, item, name="Other Display", company="Globex Corp")
    result = await _step(org, provider, store, later)
    assert (result.status, result.destination_id) == ("completed", seeded)
    held = _read_back(org, provider, seeded)
    assert held["email"] == item.email and held["owner"] == owner
    assert held["ours"] == item.contact_id
    assert (held["first"], held["last"]) == ("Sally", "Seller")  # the salesperson's
    if provider != "pipedrive":  # a Pipedrive person's company is an organization
        assert held["company"] == "Globex Corp"  # empty, allowed: filled
    assert await _origin(store, item.contact_id) == (seeded, "adopted")
    [entry] = await _upserted(store, later)
    assert entry["fields_filled"] == ([] if provider == "pipedrive" else ["company"])

    # Once filled, the next one (another company again) changes nothing at all.
    again = await _later(store, item, name="Third Name", company="Initech")
    assert (await _step(org, provider, store, again)).destination_id == seeded
    assert _read_back(org, provider, seeded) == held


async def test_an_adopted_pipedrive_person_without_a_name_gets_ours(
        org: tuple[SandboxProcess, SandboxProcess], control: httpx.AsyncClient,
        store: asyncpg.Pool) -> None:
    """A person a salesperson saved with the address only: the name is empty (Pipedrive
    shows the address), so the first adoption fills it and a later one leaves it."""
    item = await planned_item(store)
    seeded = await _seed(control, "pipedrive", {"email": item.email, "owner": "4242"})
    assert (await _step(org, "pipedrive", store, item.op("crm-upsert"))).destination_id == \
        seeded
    later = await _later(store, item, name="Other Display", company=None)
    assert (await _step(org, "pipedrive", store, later)).destination_id == seeded
    held = _read_back(org, "pipedrive", seeded)
    assert (held["first"], held["last"], held["owner"]) == ("Fen", "Ce", "4242")


@pytest.mark.parametrize("provider", ["hubspot", "salesforce", "pipedrive"])
async def test_a_merge_survivor_keeps_its_email_name_and_owner(
        org: tuple[SandboxProcess, SandboxProcess], control: httpx.AsyncClient,
        store: asyncpg.Pool, provider: str) -> None:
    item = await planned_item(store)
    first = await _step(org, provider, store, item.op("crm-upsert"))
    ours = first.destination_id
    assert await _origin(store, item.contact_id) == (ours, "created")
    kept_email = f"kept.{uuid.uuid4().hex[:10]}@example.com"
    survivor = await _seed(control, provider, {"email": kept_email, "firstname": "Kim",
                                               "lastname": "Kept", "owner": OWNERS[provider]})
    if provider == "hubspot":
        merged = await control.post("/crm/v3/objects/contacts/merge", headers=AUTH, json={
            "primaryObjectId": survivor, "objectIdToMerge": ours})
    elif provider == "pipedrive":  # `{id}` is merged into `merge_with_id`, which survives
        merged = await control.put(f"/v1/persons/{ours}/merge",
                                   headers={"x-api-token": API_KEY},
                                   json={"merge_with_id": int(survivor)})
        assert (await control.get(f"/v1/persons/{ours}", headers={"x-api-token": API_KEY})
                ).status_code == 404
    else:
        merged = await control.post("/_sandbox/salesforce/merge", json={
            "masterRecordId": survivor, "recordToMergeIds": [ours]})
    assert merged.status_code == 200, merged.text

    followed = await _step(org, provider, store, await _later(store, item, name="Fen Ce",
                                                                  company=None))
    assert followed.destination_id == survivor
    assert await _origin(store, item.contact_id) == (survivor, "merged")
    later = await _later(store, item, name="Other Display", company="Globex Corp",
                         email=item.email)
    result = await _step(org, provider, store, later)
    assert (result.status, result.destination_id) == ("completed", survivor)
    held = _read_back(org, provider, survivor)
    assert held["email"] == kept_email  # the survivor's primary email, not ours
    assert (held["first"], held["last"], held["owner"]) == ("Kim", "Kept", OWNERS[provider])
    assert held["ours"] == item.contact_id
    if provider != "pipedrive":
        assert held["company"] == "Globex Corp"  # empty, allowed: filled
    assert await _origin(store, item.contact_id) == (survivor, "merged")
    [followed] = await _audit_of(store, item.contact_id, "crm_record_merged")
    assert (followed["old"], followed["survivor"]) == (ours, survivor)
    state = (await control.get("/_sandbox/state")).json()["contacts"]
    assert not [c for c in state if str(c["properties"].get("email", "")).lower()
                == item.email]  # no record created for our address


@pytest.mark.parametrize("provider", ["hubspot", "salesforce"])
async def test_a_record_we_created_is_still_updated_without_a_read(
        org: tuple[SandboxProcess, SandboxProcess], control: httpx.AsyncClient,
        store: asyncpg.Pool, provider: str) -> None:
    item = await planned_item(store)
    first = await _step(org, provider, store, item.op("crm-upsert"))
    ours = first.destination_id
    assert await _origin(store, item.contact_id) == (ours, "created")
    before = len((await control.get("/_sandbox/calls")).json()["calls"])
    later = await _later(store, item, name="New Name", company="Globex Corp",
                         email=item.email)
    result = await _step(org, provider, store, later)
    assert (result.status, result.destination_id) == ("completed", ours)
    calls = (await control.get("/_sandbox/calls")).json()["calls"][before:]
    held = _read_back(org, provider, ours)
    assert (held["first"], held["last"], held["company"]) == ("New", "Name", "Globex Corp")
    # As before this change: the merge read (and Salesforce's read by our External ID),
    # then the upsert by our ID; no read of the record's fields, no fill-only write.
    expected = {"hubspot": ["crm.search", "crm.upsert"],
                "salesforce": ["crm.search", "crm.search", "crm.upsert"]}[provider]
    assert [c["target"] for c in calls] == expected
    assert await _origin(store, item.contact_id) == (ours, "created")
    [entry] = await _upserted(store, later)
    assert (entry["crm_origin"], entry["fields_filled"]) == ("created", None)


async def test_an_adoption_reconciled_after_a_lost_answer_is_not_written_over(
        org: tuple[SandboxProcess, SandboxProcess], control: httpx.AsyncClient,
        store: asyncpg.Pool) -> None:
    """The adoption's write commits and its answer is lost (a real timeout after commit): the
    reconciliation finds the record by our ID but cannot tell our create from an adoption,
    so the origin is not known and later upserts fill only, as for an adopted record."""
    item = await planned_item(store)
    seeded = await _seed(control, "hubspot", {"email": item.email, "owner": "7001",
                                              "firstname": "Sally", "lastname": "Seller"})
    hang = (await control.get("/_sandbox/config")).json()["hang_seconds"]
    (await control.post("/_sandbox/config", json={"hang_seconds": 3})).raise_for_status()
    (await control.post("/_sandbox/faults", json={"target": "crm.update",
                                                  "mode": "timeout_after_commit"})
     ).raise_for_status()
    crm = HubSpotCrm(org[0].url, API_KEY, HS_PROPERTY, 1.0)
    try:
        with pytest.raises(ApplicationError):  # unknown outcome: the step is retried
            await step_env().run(CrmActivities(store, crm, 300).upsert_contact_in_crm,
                                 item.op("crm-upsert"))
    finally:
        await crm.aclose()
    again = await _step(org, "hubspot", store, item.op("crm-upsert"))
    assert (again.status, again.reconciled, again.destination_id) == (
        "completed", True, seeded)
    assert await _origin(store, item.contact_id) == (seeded, None)

    later = await _later(store, item, name="Other Display", company="Globex Corp")
    assert (await _step(org, "hubspot", store, later)).destination_id == seeded
    held = _read_back(org, "hubspot", seeded)
    assert (held["first"], held["last"], held["owner"]) == ("Sally", "Seller", "7001")
    assert held["email"] == item.email and held["company"] == "Globex Corp"
    assert held["ours"] == item.contact_id
    (await control.post("/_sandbox/config", json={"hang_seconds": hang})).raise_for_status()
