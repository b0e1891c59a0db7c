"""Salesforce through simple-salesforce, over https (it speaks nothing else) with the
sandbox's self-signed CA trusted: upsert by External ID, read by External ID, the Task that
logs the email, and the errors the Salesforce adapter relies on, as the SDK raises them."""

from __future__ import annotations

import ssl
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from simple_salesforce.exceptions import (
    SalesforceExpiredSession,
    SalesforceMalformedRequest,
    SalesforceRefusedRequest,
    SalesforceResourceNotFound,
)

from tests.helpers.conformance import salesforce_client
from tests.helpers.sandbox_process import API_KEY, SandboxProcess

FIELD = "Inboxcrm_Contact_Id__c"
NOTE_FIELD = "Inboxcrm_Note_Id__c"


@pytest.fixture
def sf(tls_sandbox: SandboxProcess, certificate: tuple[Path, Path]) -> Any:
    return salesforce_client(tls_sandbox.url, API_KEY, certificate[0])


async def fault(tls_sandbox: SandboxProcess, certificate: tuple[Path, Path], **body: Any
                ) -> None:
    trusted = ssl.create_default_context(cafile=str(certificate[0]))
    async with httpx.AsyncClient(base_url=tls_sandbox.url, verify=trusted) as c:
        (await c.post("/_sandbox/faults", json=body)).raise_for_status()


async def test_upsert_by_external_id_creates_once_then_updates(sf: Any) -> None:
    external = str(uuid.uuid4())
    fields = {"Email": "ada@example.com", "LastName": "Lovelace", "FirstName": "Ada"}
    assert sf.Contact.upsert(f"{FIELD}/{external}", fields) == 201
    assert sf.Contact.upsert(f"{FIELD}/{external}", fields) in (200, 204)
    record = sf.Contact.get_by_custom_id(FIELD, external)
    assert record["attributes"]["type"] == "Contact" and record[FIELD] == external
    assert sf.Contact.get(record["Id"])["Email"] == "ada@example.com"


async def test_task_logs_the_email_on_the_contact_once(sf: Any) -> None:
    external = str(uuid.uuid4())
    sf.Contact.upsert(f"{FIELD}/{external}", {"Email": "lin@example.com", "LastName": "Lin"})
    contact = sf.Contact.get_by_custom_id(FIELD, external)["Id"]
    key = str(uuid.uuid4())
    task = {"WhoId": contact, "Subject": "Inbound email (inboxcrm)", "Description": "x",
            "Status": "Completed", "ActivityDate": "2026-11-29"}
    assert sf.Task.upsert(f"{NOTE_FIELD}/{key}", task) == 201
    assert sf.Task.upsert(f"{NOTE_FIELD}/{key}", task) in (200, 204)
    assert sf.Task.get_by_custom_id(NOTE_FIELD, key)["WhoId"] == contact


async def test_an_email_logged_as_a_task_shows_its_subject_on_the_contact(
        sf: Any, tls_sandbox: SandboxProcess, certificate: tuple[Path, Path]) -> None:
    """The conversation in the CRM on Salesforce (the adapter's `log_email`): a completed
    Task "Email: <subject>" on the Contact, upserted by our key; `/_sandbox/state` lists it
    under `activities` with the Contact it belongs to."""
    external = str(uuid.uuid4())
    sf.Contact.upsert(f"{FIELD}/{external}", {"Email": "kim@example.com", "LastName": "Kim"})
    contact = sf.Contact.get_by_custom_id(FIELD, external)["Id"]
    key = str(uuid.uuid4())
    task = {"WhoId": contact, "Subject": "Email: Pricing", "Description": "Hi, pricing?",
            "Status": "Completed", "ActivityDate": "2026-11-29"}
    assert sf.Task.upsert(f"{NOTE_FIELD}/{key}", task) == 201
    assert sf.Task.upsert(f"{NOTE_FIELD}/{key}", task) in (200, 204)
    read = sf.Task.get_by_custom_id(NOTE_FIELD, key)
    assert (read["Subject"], read["Description"]) == ("Email: Pricing", "Hi, pricing?")
    trusted = ssl.create_default_context(cafile=str(certificate[0]))
    async with httpx.AsyncClient(base_url=tls_sandbox.url, verify=trusted) as c:
        activities = (await c.get("/_sandbox/state")).json()["activities"]
    [logged] = [a for a in activities if a["key"] == {NOTE_FIELD: key}]
    assert (logged["type"], logged["subject"], logged["records"]) == (
        "task", "Email: Pricing", [contact])


async def test_errors_are_the_sdk_exceptions(sf: Any, tls_sandbox: SandboxProcess,
                                             certificate: tuple[Path, Path]) -> None:
    with pytest.raises(SalesforceResourceNotFound) as missing:
        sf.Contact.get_by_custom_id(FIELD, "nobody")
    assert missing.value.content[0]["errorCode"] == "NOT_FOUND"
    with pytest.raises(SalesforceMalformedRequest) as invalid:
        sf.Contact.upsert(f"{FIELD}/{uuid.uuid4()}", {"Email": "not-an-address",
                                                      "LastName": "X"})
    assert invalid.value.content[0]["errorCode"] == "INVALID_EMAIL_ADDRESS"
    await fault(tls_sandbox, certificate, target="crm.upsert", mode="unauthorized")
    with pytest.raises(SalesforceExpiredSession) as expired:
        sf.Contact.upsert(f"{FIELD}/{uuid.uuid4()}", {"LastName": "X"})
    assert expired.value.content[0]["errorCode"] == "INVALID_SESSION_ID"
    await fault(tls_sandbox, certificate, target="crm.upsert", mode="rate_limit")
    with pytest.raises(SalesforceRefusedRequest) as limited:
        sf.Contact.upsert(f"{FIELD}/{uuid.uuid4()}", {"LastName": "X"})
    assert limited.value.content[0]["errorCode"] == "REQUEST_LIMIT_EXCEEDED"


async def test_an_existing_contact_is_queried_and_adopted_by_id(
        sf: Any, tls_sandbox: SandboxProcess, certificate: tuple[Path, Path]) -> None:
    """Match before create as the adapter does it, through simple-salesforce: the duplicate
    rule refuses a second Contact, SOQL finds the salesperson's one, an update by Id writes
    our External ID onto it, a read by External ID finds it with its owner."""
    email = f"kim.{uuid.uuid4().hex[:8]}@example.com"
    trusted = ssl.create_default_context(cafile=str(certificate[0]))
    async with httpx.AsyncClient(base_url=tls_sandbox.url, verify=trusted) as c:
        seeded = (await c.post("/_sandbox/seed", json={"crm": "salesforce", "contacts": [
            {"email": email, "lastname": "Kim", "owner": "005A"}]})).json()["contacts"][0]["id"]
    external = str(uuid.uuid4())
    with pytest.raises(SalesforceMalformedRequest) as refused:
        sf.Contact.upsert(f"{FIELD}/{external}", {"Email": email, "LastName": "Kim"})
    [error] = refused.value.content
    assert error["errorCode"] == "DUPLICATES_DETECTED"
    records = error["duplicateResult"]["matchResults"][0]["matchRecords"]
    assert [r["record"]["Id"] for r in records] == [seeded]
    found = sf.query(f"SELECT Id, OwnerId, {FIELD} FROM Contact WHERE Email = '{email}'")
    assert found["totalSize"] == 1 and found["records"][0][FIELD] is None
    assert sf.Contact.update(seeded, {FIELD: external}) == 204
    adopted = sf.Contact.get_by_custom_id(FIELD, external)
    assert adopted["Id"] == seeded and adopted["OwnerId"] == "005A"


def _field(description: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((f for f in description["fields"] if f["name"] == name), None)


async def test_describe_names_the_external_id_field_and_its_uniqueness(
        sf: Any, tls_sandbox: SandboxProcess, certificate: tuple[Path, Path]) -> None:
    """`crm check` reads `externalId` and `unique` from `…/sobjects/{Contact|Lead}/describe`,
    as simple-salesforce's `describe()` asks for it; the sandbox's `crm_fields` turns the
    field non-unique or removes it."""
    for sobject in (sf.Contact, sf.Lead):
        described = sobject.describe()
        assert described["keyPrefix"] in ("003", "00Q") and described["queryable"] is True
        ours = _field(described, FIELD)
        assert ours is not None and (ours["externalId"], ours["unique"]) == (True, True)
        assert ours["custom"] is True and ours["type"] == "string"
        email = _field(described, "Email")
        assert email is not None and (email["externalId"], email["unique"]) == (False, False)
    assert _field(sf.Task.describe(), NOTE_FIELD)["unique"] is True  # type: ignore[index]
    trusted = ssl.create_default_context(cafile=str(certificate[0]))
    async with httpx.AsyncClient(base_url=tls_sandbox.url, verify=trusted) as c:
        (await c.post("/_sandbox/config", json={"crm_fields": {FIELD: "not_unique",
                                                               NOTE_FIELD: "missing"}})
         ).raise_for_status()
        try:
            flipped = _field(sf.Contact.describe(), FIELD)
            assert flipped is not None and (flipped["externalId"], flipped["unique"]) == (
                True, False)
            assert _field(sf.Task.describe(), NOTE_FIELD) is None
        finally:
            await c.post("/_sandbox/config", json={"crm_fields": {}})


async def test_leads_upsert_query_convert_as_the_sdk_sees_them(
        sf: Any, tls_sandbox: SandboxProcess, certificate: tuple[Path, Path]) -> None:
    """Leads through simple-salesforce: a seeded Lead (owner, opt-out) found by SOQL, marked
    by an update by Id, read by our External ID; a Lead needs a Company; once converted it
    names its Contact (`IsConverted`, `ConvertedContactId`) and refuses updates."""
    email = f"lee.{uuid.uuid4().hex[:8]}@example.com"
    trusted = ssl.create_default_context(cafile=str(certificate[0]))
    async with httpx.AsyncClient(base_url=tls_sandbox.url, verify=trusted) as c:
        seeded = (await c.post("/_sandbox/seed", json={"crm": "salesforce", "leads": [
            {"email": email, "lastname": "Lee", "owner": "005L", "opted_out": True}]})
                  ).json()["leads"][0]["id"]
        assert seeded.startswith("00Q")
        found = sf.query(f"SELECT Id, OwnerId, HasOptedOutOfEmail, IsConverted, {FIELD} "
                         f"FROM Lead WHERE Email = '{email}'")
        [record] = found["records"]
        assert record["attributes"]["type"] == "Lead" and record["Id"] == seeded
        assert (record["OwnerId"], record["HasOptedOutOfEmail"], record["IsConverted"],
                record[FIELD]) == ("005L", True, False, None)
        external = str(uuid.uuid4())
        assert sf.Lead.update(seeded, {FIELD: external}) == 204
        lead = sf.Lead.get_by_custom_id(FIELD, external)
        assert lead["Id"] == seeded and lead["OwnerId"] == "005L"
        with pytest.raises(SalesforceMalformedRequest) as no_company:
            sf.Lead.upsert(f"{FIELD}/{uuid.uuid4()}", {"LastName": "X", "Email": email})
        assert no_company.value.content[0]["errorCode"] == "REQUIRED_FIELD_MISSING"
        assert sf.Lead.upsert(f"{FIELD}/{uuid.uuid4()}",
                              {"LastName": "X", "Company": "Y"}) == 201
        converted = (await c.post(f"/_sandbox/salesforce/leads/{seeded}/convert")).json()
        after = sf.Lead.get(seeded)
        assert after["IsConverted"] is True
        assert after["ConvertedContactId"] == converted["contact_id"]
        contact = sf.Contact.get(converted["contact_id"])
        assert contact["Email"] == email and contact["OwnerId"] == "005L"
        with pytest.raises(SalesforceMalformedRequest) as refused:
            sf.Lead.update(seeded, {"FirstName": "Lee"})
        assert refused.value.content[0]["errorCode"] == "CANNOT_UPDATE_CONVERTED_LEAD"
        state = (await c.get("/_sandbox/state")).json()
        [listed] = [lead for lead in state["leads"] if lead["id"] == seeded]
        assert listed["properties"]["OwnerId"] == "005L" and listed["IsConverted"] is True


async def test_a_merged_contact_is_deleted_and_names_its_master(
        sf: Any, tls_sandbox: SandboxProcess, certificate: tuple[Path, Path]) -> None:
    """A merge as a salesperson makes it (`POST /_sandbox/salesforce/merge`): the loser is
    gone from reads (404 `ENTITY_IS_DELETED`) and from `query`, and `queryAll` (the SDK's
    `query_all(include_deleted=True)`) shows it deleted with its `MasterRecordId`."""
    external = str(uuid.uuid4())
    loser = sf.Contact.upsert(f"{FIELD}/{external}", {
        "Email": f"lost.{external[:8]}@example.com", "LastName": "Lost"})
    assert loser == 201
    loser_id = sf.Contact.get_by_custom_id(FIELD, external)["Id"]
    trusted = ssl.create_default_context(cafile=str(certificate[0]))
    async with httpx.AsyncClient(base_url=tls_sandbox.url, verify=trusted) as c:
        master = (await c.post("/_sandbox/seed", json={"crm": "salesforce", "contacts": [
            {"email": f"master.{external[:8]}@example.com", "lastname": "Master"}]})
                  ).json()["contacts"][0]["id"]
        merged = await c.post("/_sandbox/salesforce/merge", json={
            "masterRecordId": master, "recordToMergeIds": [loser_id]})
        assert merged.status_code == 200, merged.text
    with pytest.raises(SalesforceResourceNotFound) as deleted:
        sf.Contact.get(loser_id)
    assert deleted.value.content[0]["errorCode"] == "ENTITY_IS_DELETED"
    query = f"SELECT Id, IsDeleted, MasterRecordId FROM Contact WHERE Id = '{loser_id}'"
    found = sf.query_all(query, include_deleted=True)
    assert found["totalSize"] == 1
    assert found["records"][0]["IsDeleted"] is True
    assert found["records"][0]["MasterRecordId"] == master
    live = sf.query_all(query.replace(loser_id, master), include_deleted=True)
    assert live["records"][0]["IsDeleted"] is False
    assert live["records"][0]["MasterRecordId"] is None
    assert sf.query(f"SELECT Id FROM Contact WHERE {FIELD} = '{external}'")["totalSize"] == 0


async def test_a_merged_lead_is_deleted_and_names_its_master(
        sf: Any, tls_sandbox: SandboxProcess, certificate: tuple[Path, Path]) -> None:
    """Leads merge as Contacts do: the merged Lead reads 404 `ENTITY_IS_DELETED`, leaves
    `query`, and `queryAll` shows it deleted with the master Lead as `MasterRecordId`; the
    same read tells a converted Lead's Contact (`IsConverted`, `ConvertedContactId`). A
    converted Lead cannot be merged."""
    external = str(uuid.uuid4())
    assert sf.Lead.upsert(f"{FIELD}/{external}", {
        "Email": f"lostlead.{external[:8]}@example.com", "LastName": "Lost",
        "Company": "Acme"}) == 201
    loser = sf.Lead.get_by_custom_id(FIELD, external)["Id"]
    trusted = ssl.create_default_context(cafile=str(certificate[0]))
    async with httpx.AsyncClient(base_url=tls_sandbox.url, verify=trusted) as c:
        master, other = [lead["id"] for lead in (await c.post("/_sandbox/seed", json={
            "crm": "salesforce", "leads": [
                {"email": f"masterlead.{external[:8]}@example.com", "lastname": "Master"},
                {"email": f"convlead.{external[:8]}@example.com", "lastname": "Conv"}]})
        ).json()["leads"]]
        merged = await c.post("/_sandbox/salesforce/merge", json={
            "masterRecordId": master, "recordToMergeIds": [loser]})
        assert merged.status_code == 200, merged.text
        contact = (await c.post(f"/_sandbox/salesforce/leads/{other}/convert")
                   ).json()["contact_id"]
        refused = await c.post("/_sandbox/salesforce/merge", json={
            "masterRecordId": master, "recordToMergeIds": [other]})
        assert refused.status_code == 400
        assert refused.json()[0]["errorCode"] == "INVALID_OPERATION"
    with pytest.raises(SalesforceResourceNotFound) as deleted:
        sf.Lead.get(loser)
    assert deleted.value.content[0]["errorCode"] == "ENTITY_IS_DELETED"
    query = f"SELECT Id, IsDeleted, MasterRecordId FROM Lead WHERE Id = '{loser}'"
    [gone] = sf.query_all(query, include_deleted=True)["records"]
    assert (gone["attributes"]["type"], gone["IsDeleted"], gone["MasterRecordId"]) == (
        "Lead", True, master)
    live = sf.query_all(query.replace(loser, master), include_deleted=True)["records"]
    assert (live[0]["IsDeleted"], live[0]["MasterRecordId"]) == (False, None)
    state = sf.query_all("SELECT Id, IsDeleted, MasterRecordId, IsConverted, "
                         f"ConvertedContactId FROM Lead WHERE Id = '{other}'",
                         include_deleted=True)["records"][0]
    assert (state["IsDeleted"], state["IsConverted"], state["ConvertedContactId"]) == (
        False, True, contact)
    assert sf.query(f"SELECT Id FROM Lead WHERE {FIELD} = '{external}'")["totalSize"] == 0
