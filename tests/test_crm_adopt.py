"""Match before create (issue 35): a person who already exists in the CRM, created there by a
salesperson (no external ID of ours, an owner, a field they set), writes in. The CRM step of a
real item, through the attempt protocol and the ledger, against a real sandbox process, for
HubSpot and for Salesforce under each duplicate rule (none / alert / block): afterwards exactly
one record holds the email, it carries our external ID, its owner and the salesperson's field
are untouched. Two Salesforce Contacts with the email: the step answers `review` with both as
candidates and nothing is created. Counted on the destination side (`/_sandbox/state`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from inboxcrm.activities.crm import CrmActivities
from inboxcrm.adapters.base import ContactFields, CrmClient, CrmRecord
from inboxcrm.adapters.hubspot import HubSpotCrm
from inboxcrm.adapters.salesforce import SalesforceCrm
from tests.helpers.outbox import planned_item, step_env
from tests.helpers.sandbox_process import API_KEY, SandboxProcess, own_sandbox

SF_FIELD = "Inboxcrm_Contact_Id__c"
HS_PROPERTY = "inboxcrm_contact_id"


@pytest.fixture(scope="module")
async def org(postgres_server_url: str) -> AsyncIterator[SandboxProcess]:
    """A sandbox of its own (its own database: an account nobody else writes to)."""
    async for process in own_sandbox(postgres_server_url, "sandbox_adopt"):
        yield process


@pytest.fixture
async def control(org: SandboxProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=org.url, timeout=10) as client:
        (await client.post("/_sandbox/reset")).raise_for_status()
        yield client
        await client.post("/_sandbox/config", json={"salesforce_duplicate_rule": "alert"})


async def _seed(control: httpx.AsyncClient, crm: str, *contacts: dict[str, Any]) -> list[str]:
    response = await control.post("/_sandbox/seed", json={"crm": crm,
                                                          "contacts": list(contacts)})
    response.raise_for_status()
    return [c["id"] for c in response.json()["contacts"]]


async def _with_email(control: httpx.AsyncClient, email: str) -> list[dict[str, Any]]:
    contacts = (await control.get("/_sandbox/state")).json()["contacts"]
    return [c for c in contacts if str(c["properties"].get("email", "")).lower() == email]


async def _audit(store: asyncpg.Pool, workflow_id: str, action: str) -> list[dict[str, Any]]:
    rows = await store.fetch("SELECT detail FROM audit_log WHERE workflow_id = $1 AND "
                             "action = $2 ORDER BY audit_id", workflow_id, action)
    return [r["detail"] if isinstance(r["detail"], dict) else json.loads(r["detail"])
            for r in rows]


def _client(org: SandboxProcess, provider: str) -> CrmClient:
    if provider == "hubspot":
        return HubSpotCrm(org.url, API_KEY, HS_PROPERTY, 10)
    return SalesforceCrm(org.url, API_KEY)


CASES = [("hubspot", None), ("salesforce", "none"), ("salesforce", "alert"),
         ("salesforce", "block")]


@pytest.mark.parametrize("provider, rule", CASES)
async def test_an_existing_record_is_adopted_not_duplicated(
        org: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool,
        provider: str, rule: str | None) -> None:
    if rule is not None:
        (await control.post("/_sandbox/config", json={"salesforce_duplicate_rule": rule})
         ).raise_for_status()
    item = await planned_item(store)
    owner, owner_field = ("7001", "hubspot_owner_id") if provider == "hubspot" else (
        "005SALES", "OwnerId")
    field = {"lifecyclestage": "customer"} if provider == "hubspot" else {"Title": "CTO"}
    [seeded] = await _seed(control, provider, {"email": item.email, "lastname": "Seeded",
                                               "owner": owner, "properties": field})
    crm = _client(org, provider)
    activities = CrmActivities(store, crm, 300)
    try:
        result = await step_env().run(activities.upsert_contact_in_crm, item.op("crm-upsert"))
    finally:
        await crm.aclose()
    assert result.status == "completed" and result.destination_id == seeded
    [held] = await _with_email(control, item.email)
    props = held["properties"]
    assert held["id"] == seeded
    ours = HS_PROPERTY if provider == "hubspot" else SF_FIELD
    assert props[ours] == item.contact_id
    assert props[owner_field] == owner and props["lastname"] == "Seeded"
    kept = "lifecyclestage" if provider == "hubspot" else "jobtitle"
    assert props[kept] == ("customer" if provider == "hubspot" else "CTO")
    [adopted] = await _audit(store, item.item.workflow_id, "crm_record_adopted")
    assert adopted["crm_record_id"] == seeded and adopted["external_id_written"] is True
    # A later lookup by our ID finds the adopted record (no 409, no email search needed).
    crm = _client(org, provider)
    try:
        found = await crm.find_contact(item.contact_id)
    finally:
        await crm.aclose()
    assert found is not None and found.record_id == seeded


async def test_two_salesforce_contacts_with_the_email_go_to_review(
        org: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool) -> None:
    item = await planned_item(store)
    seeded = await _seed(control, "salesforce", {"email": item.email, "owner": "005A"},
                         {"email": item.email, "owner": "005B"})
    crm = _client(org, "salesforce")
    activities = CrmActivities(store, crm, 300)
    try:
        result = await step_env().run(activities.upsert_contact_in_crm, item.op("crm-upsert"))
    finally:
        await crm.aclose()
    assert (result.status, result.reason) == ("review", "crm_candidates")
    [review] = await _audit(store, item.item.workflow_id, "crm_match_needs_review")
    assert review["candidates"] == seeded
    held = await _with_email(control, item.email)
    assert sorted(c["id"] for c in held) == sorted(seeded)  # nothing created
    assert all(SF_FIELD not in c["properties"] for c in held)  # nothing adopted
    row = await store.fetchrow("SELECT status, last_error FROM operations WHERE op_key = $1",
                               item.op("crm-upsert").op_key)
    assert row is not None
    assert (row["status"], row["last_error"]) == ("waiting", "crm_candidates")


# --- Salesforce Leads ------------------------------------------------------------------------
async def _seed_leads(control: httpx.AsyncClient, *leads: dict[str, Any]) -> list[str]:
    response = await control.post("/_sandbox/seed", json={"crm": "salesforce",
                                                          "leads": list(leads)})
    response.raise_for_status()
    return [lead["id"] for lead in response.json()["leads"]]


async def _leads_with_email(control: httpx.AsyncClient, email: str) -> list[dict[str, Any]]:
    leads = (await control.get("/_sandbox/state")).json()["leads"]
    return [lead for lead in leads if str(lead["properties"].get("email", "")).lower() == email]


async def _upsert_step(org: SandboxProcess, store: asyncpg.Pool, item: Any,
                       new_prospects: str = "contact") -> Any:
    crm = SalesforceCrm(org.url, API_KEY, new_prospects=new_prospects)  # type: ignore[arg-type]
    try:
        return await step_env().run(CrmActivities(store, crm, 300).upsert_contact_in_crm,
                                    item.op("crm-upsert"))
    finally:
        await crm.aclose()


@pytest.mark.parametrize("new_prospects", ["contact", "lead"])
async def test_a_seeded_lead_is_adopted_whatever_the_policy(
        org: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool,
        new_prospects: str) -> None:
    """Inbound sales mail from a person a salesperson keeps as a Lead: that Lead becomes
    ours (our External ID on it, owner and the salesperson's fields untouched) and no
    Contact is created, whether the policy makes new prospects Contacts or Leads."""
    item = await planned_item(store)
    [seeded] = await _seed_leads(control, {"email": item.email, "lastname": "Seeded",
                                           "owner": "005SALES",
                                           "properties": {"Company": "Initrode",
                                                          "Title": "CTO"}})
    result = await _upsert_step(org, store, item, new_prospects)
    assert (result.status, result.destination_id) == ("completed", seeded)
    [lead] = await _leads_with_email(control, item.email)
    props = lead["properties"]
    assert lead["id"] == seeded and props[SF_FIELD] == item.contact_id
    assert (props["OwnerId"], props["lastname"], props["Company"], props["jobtitle"]) == (
        "005SALES", "Seeded", "Initrode", "CTO")
    assert await _with_email(control, item.email) == []  # no new Contact
    [adopted] = await _audit(store, item.item.workflow_id, "crm_record_adopted")
    assert adopted["crm_record_id"] == seeded
    crm = SalesforceCrm(org.url, API_KEY)
    try:
        assert (await crm.find_contact(item.contact_id)) == CrmRecord(record_id=seeded)
    finally:
        await crm.aclose()


@pytest.mark.parametrize("new_prospects", ["contact", "lead"])
async def test_a_new_prospect_becomes_what_the_policy_says(
        org: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool,
        new_prospects: str) -> None:
    item = await planned_item(store)
    result = await _upsert_step(org, store, item, new_prospects)
    assert result.status == "completed"
    leads = await _leads_with_email(control, item.email)
    contacts = await _with_email(control, item.email)
    made, other = (leads, contacts) if new_prospects == "lead" else (contacts, leads)
    assert len(made) == 1 and other == []
    assert made[0]["id"] == result.destination_id
    assert made[0]["properties"][SF_FIELD] == item.contact_id
    if new_prospects == "lead":
        assert made[0]["id"].startswith("00Q") and made[0]["properties"]["Company"]


async def test_a_converted_lead_is_followed_to_its_contact(
        org: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool) -> None:
    """A Lead a salesperson converted: its Contact is the person's record. Our first item
    adopts that Contact (not the converted Lead, not a new record); our own Lead, converted
    later, is followed to its Contact, which then carries our ID. Nothing is created."""
    item = await planned_item(store)
    [seeded] = await _seed_leads(control, {"email": item.email, "lastname": "Conv",
                                           "owner": "005C"})
    converted = (await control.post(f"/_sandbox/salesforce/leads/{seeded}/convert")).json()
    result = await _upsert_step(org, store, item, "lead")
    assert (result.status, result.destination_id) == ("completed", converted["contact_id"])
    [contact] = await _with_email(control, item.email)
    assert contact["id"] == converted["contact_id"]
    assert contact["properties"][SF_FIELD] == item.contact_id
    assert contact["properties"]["OwnerId"] == "005C"
    [lead] = await _leads_with_email(control, item.email)
    assert lead["id"] == seeded and SF_FIELD not in lead["properties"]

    second = await planned_item(store)  # ours as a Lead, then converted by a salesperson
    first = await _upsert_step(org, store, second, "lead")
    assert first.destination_id.startswith("00Q")
    made = (await control.post(f"/_sandbox/salesforce/leads/{first.destination_id}/convert")
            ).json()
    crm = SalesforceCrm(org.url, API_KEY, new_prospects="lead")
    try:
        found = await crm.find_contact(second.contact_id)
        again = await crm.upsert_contact(second.contact_id, ContactFields(second.email, "Fen Ce"))
    finally:
        await crm.aclose()
    assert found is not None and found.record_id == made["contact_id"]
    assert again.record_id == made["contact_id"]
    [followed] = await _with_email(control, second.email)
    assert followed["id"] == made["contact_id"]
    assert followed["properties"][SF_FIELD] == second.contact_id
    assert len(await _leads_with_email(control, second.email)) == 1


async def test_a_lead_and_a_contact_with_the_email_go_to_review(
        org: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool) -> None:
    item = await planned_item(store)
    [contact] = await _seed(control, "salesforce", {"email": item.email, "owner": "005A"})
    [lead] = await _seed_leads(control, {"email": item.email, "owner": "005B"})
    result = await _upsert_step(org, store, item)
    assert (result.status, result.reason) == ("review", "crm_candidates")
    [review] = await _audit(store, item.item.workflow_id, "crm_match_needs_review")
    assert sorted(review["candidates"]) == sorted([contact, lead])
    [held] = await _with_email(control, item.email)
    [kept] = await _leads_with_email(control, item.email)
    assert SF_FIELD not in held["properties"] and SF_FIELD not in kept["properties"]
