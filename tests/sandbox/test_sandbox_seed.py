"""The CRM as it already is: records seeded as a salesperson creates them, Salesforce's
duplicate-rule modes, and the calls an adapter finds and adopts an existing record with."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

UPSERT = "/crm/v3/objects/contacts/batch/upsert"
CONTACTS = "/crm/v3/objects/contacts"
ID_PROP = "inboxcrm_contact_id"
SF = "/services/data/v62.0"
FIELD = "Inboxcrm_Contact_Id__c"
ALLOW_SAVE = {"Sforce-Duplicate-Rule-Header": "allowSave=true"}


async def seed(anon: httpx.AsyncClient, crm: str, *contacts: dict[str, Any]) -> list[str]:
    response = await anon.post("/_sandbox/seed", json={"crm": crm, "contacts": list(contacts)})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["leads"] == []
    assert [c["email"] for c in body["contacts"]] == [c["email"] for c in contacts]
    return [c["id"] for c in body["contacts"]]


async def contacts_with(anon: httpx.AsyncClient, email: str) -> list[dict[str, Any]]:
    state = (await anon.get("/_sandbox/state")).json()
    return [c for c in state["contacts"] if c["properties"].get("email") == email]


async def rule(anon: httpx.AsyncClient, mode: str) -> None:
    response = await anon.post("/_sandbox/config", json={"salesforce_duplicate_rule": mode})
    assert response.json()["salesforce_duplicate_rule"] == mode


async def sf_upsert(client: httpx.AsyncClient, external: str, email: str,
                    headers: dict[str, str] | None = None) -> httpx.Response:
    return await client.patch(f"{SF}/sobjects/Contact/{FIELD}/{external}",
                              json={"Email": email, "LastName": "Ours"}, headers=headers)


async def test_seeded_hubspot_contact_has_owner_fields_and_no_id_of_ours(client, anon) -> None:
    [record_id] = await seed(anon, "hubspot", {
        "email": "ada@example.com", "firstname": "Ada", "lastname": "Lovelace",
        "owner": "7001", "opted_out": True, "properties": {"lifecyclestage": "customer"}})
    [held] = await contacts_with(anon, "ada@example.com")
    assert held["id"] == record_id
    assert held["properties"] == {"email": "ada@example.com", "firstname": "Ada",
                                  "lastname": "Lovelace", "hubspot_owner_id": "7001",
                                  "hs_email_optout": "true", "lifecyclestage": "customer"}
    # HubSpot keeps email unique: the upsert by our ID meets the 409 that names it.
    conflict = await client.post(UPSERT, json={"inputs": [
        {"idProperty": ID_PROP, "id": "c-1", "properties": {"email": "ADA@example.com"}}]})
    assert conflict.status_code == 409 and record_id in conflict.json()["message"]
    # A second seeded contact with that email is refused, as HubSpot refuses it.
    again = await anon.post("/_sandbox/seed", json={"crm": "hubspot",
                                                    "contacts": [{"email": "ada@example.com"}]})
    assert again.status_code == 409
    assert len(await contacts_with(anon, "ada@example.com")) == 1


async def test_hubspot_update_by_id_writes_our_unique_property(client, anon) -> None:
    [record_id] = await seed(anon, "hubspot", {"email": "bo@example.com", "owner": "7002"})
    await client.post(UPSERT, json={"inputs": [
        {"idProperty": ID_PROP, "id": "c-bo", "properties": {"email": "bo@example.com"}}]})
    patched = await client.patch(f"{CONTACTS}/{record_id}",
                                 json={"properties": {ID_PROP: "c-bo", "firstname": "Bo"}})
    assert patched.status_code == 200, patched.text
    assert patched.json()["properties"]["hubspot_owner_id"] == "7002"
    found = await client.get(f"{CONTACTS}/c-bo", params={"idProperty": ID_PROP})
    assert found.status_code == 200 and found.json()["id"] == record_id
    # The unique ID, once written, is the record's: another value cannot replace it.
    moved = await client.patch(f"{CONTACTS}/{record_id}", json={"properties": {ID_PROP: "x"}})
    assert moved.status_code == 400
    assert (await client.patch(f"{CONTACTS}/999999", json={"properties": {}})).status_code == 404
    # Now upserts by our ID update the adopted record; still one record with the email.
    again = await client.post(UPSERT, json={"inputs": [
        {"idProperty": ID_PROP, "id": "c-bo", "properties": {"email": "bo@example.com"}}]})
    assert again.json()["results"][0]["id"] == record_id
    assert len(await contacts_with(anon, "bo@example.com")) == 1


async def test_two_seeded_salesforce_contacts_may_share_an_email(anon) -> None:
    ids = await seed(anon, "salesforce", {"email": "cy@example.com", "owner": "005A"},
                     {"email": "cy@example.com", "owner": "005B", "lastname": "Cy"})
    held = await contacts_with(anon, "cy@example.com")
    assert [c["id"] for c in held] == ids
    assert [c["properties"]["OwnerId"] for c in held] == ["005A", "005B"]
    assert all(c["properties"]["HasOptedOutOfEmail"] == "false" for c in held)


async def test_alert_refuses_with_the_matches_unless_allow_save(client, anon) -> None:
    [record_id] = await seed(anon, "salesforce", {"email": "di@example.com", "owner": "005A"})
    refused = await sf_upsert(client, "ours-1", "di@example.com")
    assert refused.status_code == 400
    [error] = refused.json()
    assert error["errorCode"] == "DUPLICATES_DETECTED"
    result = error["duplicateResult"]
    assert result["allowSave"] is True
    [match] = result["matchResults"]
    assert [m["record"]["Id"] for m in match["matchRecords"]] == [record_id]
    assert "Email" not in match["matchRecords"][0]["record"]
    detailed = await sf_upsert(client, "ours-1", "di@example.com", headers={
        "Sforce-Duplicate-Rule-Header": "includeRecordDetails=true"})
    record = detailed.json()[0]["duplicateResult"]["matchResults"][0]["matchRecords"][0]
    assert record["record"]["Email"] == "di@example.com"
    assert len(await contacts_with(anon, "di@example.com")) == 1
    saved = await sf_upsert(client, "ours-1", "di@example.com", headers=ALLOW_SAVE)
    assert saved.status_code == 201
    assert len(await contacts_with(anon, "di@example.com")) == 2


@pytest.mark.parametrize("mode, creates", [("none", True), ("block", False)])
async def test_none_creates_the_duplicate_and_block_never(client, anon, mode: str,
                                                          creates: bool) -> None:
    await seed(anon, "salesforce", {"email": "ed@example.com"})
    await rule(anon, mode)
    for headers in (None, ALLOW_SAVE):
        response = await sf_upsert(client, f"ours-{mode}", "ed@example.com", headers)
        if creates:
            assert response.status_code in (200, 201)
        else:
            assert response.status_code == 400
            [error] = response.json()
            assert error["errorCode"] == "DUPLICATES_DETECTED"
            assert error["duplicateResult"]["allowSave"] is False
    assert len(await contacts_with(anon, "ed@example.com")) == (2 if creates else 1)


async def test_soql_finds_by_email_and_update_by_id_adopts(client, anon) -> None:
    ids = await seed(anon, "salesforce", {"email": "Fay@Example.com", "owner": "005A",
                                          "lastname": "Fay", "properties": {"Title": "CTO"}})
    # Our field is known to the org once an upsert went through it.
    await sf_upsert(client, "someone-else", "other@example.com")
    query = "SELECT Id, Email, FirstName, OwnerId FROM Contact WHERE Email = 'fay@example.com'"
    found = (await client.get(f"{SF}/query", params={"q": query})).json()
    assert found["totalSize"] == 1 and found["done"] is True
    [record] = found["records"]
    assert record["Id"] == ids[0] and record["FirstName"] is None
    assert record["OwnerId"] == "005A"
    patched = await client.patch(f"{SF}/sobjects/Contact/{ids[0]}",
                                 json={FIELD: "ours-fay", "FirstName": "Fay"})
    assert patched.status_code == 204, patched.text
    by_ours = (await client.get(f"{SF}/sobjects/Contact/{FIELD}/ours-fay")).json()
    assert by_ours["Id"] == ids[0] and by_ours["OwnerId"] == "005A"
    # The upsert by our ID now updates the adopted Contact: no duplicate rule is met.
    again = await sf_upsert(client, "ours-fay", "fay@example.com")
    assert again.status_code == 200 and again.json()["id"] == ids[0]
    [held] = await contacts_with(anon, "fay@example.com")
    assert held["properties"]["jobtitle"] == "CTO"
    assert held["properties"]["OwnerId"] == "005A"


@pytest.mark.parametrize("query, code", [
    ("SELECT Id FROM Contact WHERE Email = 'o''brien@example.com'", "MALFORMED_QUERY"),
    ("SELECT Id, Nope FROM Contact WHERE Email = 'x@example.com'", "INVALID_FIELD"),
    ("DELETE FROM Contact", "MALFORMED_QUERY"),
])
async def test_soql_errors_are_salesforces(client, query: str, code: str) -> None:
    response = await client.get(f"{SF}/query", params={"q": query})
    assert response.status_code == 400 and response.json()[0]["errorCode"] == code


async def test_soql_escapes_quotes_and_backslashes(client, anon) -> None:
    email = "o'brien@example.com"
    [record_id] = await seed(anon, "salesforce", {"email": email})
    escaped = email.replace("\\", "\\\\").replace("'", "\\'")
    query = f"SELECT Id FROM Contact WHERE Email = '{escaped}'"
    found = (await client.get(f"{SF}/query", params={"q": query})).json()
    assert [r["Id"] for r in found["records"]] == [record_id]


async def test_seed_of_what_is_not_modelled_is_refused(anon) -> None:
    response = await anon.post("/_sandbox/seed", json={"crm": "hubspot",
                                                       "leads": [{"email": "l@example.com"}]})
    assert response.status_code == 422
    bad = await anon.post("/_sandbox/seed", json={"crm": "hubspot",
                                                  "contacts": [{"email": "not-an-address"}]})
    assert bad.status_code == 422
