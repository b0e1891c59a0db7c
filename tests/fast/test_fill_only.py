"""Which fields a later write puts on a record we did not create (issue 35): only those the
policy allows, that we have, and that the record holds empty; never the email or the owner.
The pure selection, and each adapter's `fill_contact` against a recorded HTTP exchange (what
it reads, what it sends)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from inboxcrm.adapters.base import ContactFields, Filled, fields_to_fill
from inboxcrm.adapters.hubspot import HubSpotCrm
from inboxcrm.adapters.pipedrive import PipedriveCrm
from inboxcrm.adapters.salesforce import SalesforceCrm

OURS = ContactFields(email="pat@example.com", name="Pat Other", company="Globex")
KEY = "a" * 40


def test_only_allowed_empty_fields_we_have_are_filled() -> None:
    both = ("name", "company")
    assert fields_to_fill(OURS, both, both) == {"name": "Pat Other", "company": "Globex"}
    assert fields_to_fill(OURS, ["company"], both) == {"company": "Globex"}  # policy
    assert fields_to_fill(OURS, both, ["name"]) == {"name": "Pat Other"}  # company set
    assert fields_to_fill(OURS, [], both) == {}
    assert fields_to_fill(ContactFields("pat@example.com", "  ", None), both, both) == {}


def test_the_email_is_never_a_field_to_fill() -> None:
    assert "email" not in fields_to_fill(OURS, ("name", "company", "email"),
                                         ("name", "company", "email"))


Handler = Callable[[httpx.Request], httpx.Response]


def _recording(crm: Any, answer: Handler) -> list[httpx.Request]:
    """Swap the adapter's HTTP client for one answering `answer`; the requests it got."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer(request)

    crm._client = httpx.AsyncClient(base_url="http://crm.test",
                                    transport=httpx.MockTransport(handle))
    return seen


def _sent(request: httpx.Request) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(request.content)
    return body


@pytest.mark.parametrize("held, allowed, sent, fields", [
    ({"firstname": "Sally", "lastname": "", "company": ""}, ("name", "company"),
     {"company": "Globex"}, ("company",)),
    ({"firstname": "", "lastname": "", "company": "Initech"}, ("name", "company"),
     {"firstname": "Pat", "lastname": "Other"}, ("name",)),
    ({"firstname": "", "lastname": "", "company": ""}, ("name",),
     {"firstname": "Pat", "lastname": "Other"}, ("name",)),
    ({"firstname": "Sally", "lastname": "Seller", "company": "Initech"}, ("name", "company"),
     None, ()),
])
async def test_hubspot_fills_only_empty_allowed_properties(
        held: dict[str, str], allowed: tuple[str, ...], sent: dict[str, str] | None,
        fields: tuple[str, ...]) -> None:
    crm = HubSpotCrm("http://crm.test", "t", "inboxcrm_contact_id", 5)

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"id": "101", "properties": {
                **held, "email": "sally@example.com", "hubspot_owner_id": "7001"}})
        return httpx.Response(200, json={"id": "101", "properties": {}})

    seen = _recording(crm, answer)
    assert await crm.fill_contact("101", OURS, allowed) == Filled("101", fields)
    assert seen[0].method == "GET" and seen[0].url.path == "/crm/v3/objects/contacts/101"
    patches = [r for r in seen if r.method == "PATCH"]
    if sent is None:
        assert patches == []
    else:
        [patch] = patches
        assert _sent(patch) == {"properties": sent}  # never email, owner or our ID
    await crm.aclose()


async def test_hubspot_a_record_gone_is_none_and_nothing_is_written() -> None:
    crm = HubSpotCrm("http://crm.test", "t", "inboxcrm_contact_id", 5)
    seen = _recording(crm, lambda r: httpx.Response(404, json={"status": "error",
                                                               "message": "not found"}))
    assert await crm.fill_contact("101", OURS, ("name", "company")) is None
    assert [r.method for r in seen] == ["GET"]
    await crm.aclose()


@pytest.mark.parametrize("record_id, held, sent", [
    ("0030000000001", {"FirstName": "Sally", "LastName": "Seller",
                       "Inboxcrm_Company__c": None}, {"Inboxcrm_Company__c": "Globex"}),
    ("0030000000001", {"FirstName": None, "LastName": "[unknown]",
                       "Inboxcrm_Company__c": "Initech"},
     {"FirstName": "Pat", "LastName": "Other"}),
    ("00Q000000000001", {"FirstName": "Sally", "LastName": "Seller", "Company": "[unknown]"},
     {"Company": "Globex"}),
    ("0030000000001", {"FirstName": None, "LastName": "Seller",
                       "Inboxcrm_Company__c": "Initech"}, None),
])
async def test_salesforce_fills_only_empty_allowed_fields(
        record_id: str, held: dict[str, Any], sent: dict[str, str] | None) -> None:
    crm = SalesforceCrm("http://crm.test", "t")

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"Id": record_id, **held,
                                             "Email": "sally@example.com",
                                             "OwnerId": "005SALES"})
        return httpx.Response(204)

    seen = _recording(crm, answer)
    filled = await crm.fill_contact(record_id, OURS, ("name", "company"))
    assert filled is not None and filled.record_id == record_id
    fields = seen[0].url.params["fields"].split(",")
    assert "Email" not in fields and "OwnerId" not in fields
    patches = [r for r in seen if r.method == "PATCH"]
    if sent is None:
        assert patches == [] and filled.fields == ()
    else:
        [patch] = patches
        assert _sent(patch) == sent
        assert patch.url.path.endswith(f"/{record_id}")
    await crm.aclose()


@pytest.mark.parametrize("held, sent", [
    ({"first_name": None, "last_name": None, "name": "pat@example.com"},
     {"first_name": "Pat", "last_name": "Other"}),
    ({"first_name": "Sally", "last_name": None, "name": "Sally"}, None),
    ({"first_name": None, "last_name": None, "name": "Sally Seller"}, None),
])
async def test_pipedrive_fills_an_empty_name_only(held: dict[str, Any],
                                                  sent: dict[str, str] | None) -> None:
    crm = PipedriveCrm("http://crm.test", "t", external_id_field=KEY)

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"success": True, "data": {
                "id": 7, "active_flag": True, **held, "owner_id": {"id": 4242}}})
        return httpx.Response(200, json={"success": True, "data": {"id": 7}})

    seen = _recording(crm, answer)
    filled = await crm.fill_contact("7", OURS, ("name", "company"))
    assert filled is not None and filled.record_id == "7"
    puts = [r for r in seen if r.method == "PUT"]
    if sent is None:
        assert puts == [] and filled.fields == ()
    else:
        [put] = puts
        assert _sent(put) == sent and filled.fields == ("name",)
    await crm.aclose()


# --- the first adoption fills by the same rule, with the policy's fields (`fields.fill`) ---
async def test_a_hubspot_adoption_fills_only_what_the_policy_allows() -> None:
    crm = HubSpotCrm("http://crm.test", "t", "inboxcrm_contact_id", 5)

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/batch/upsert"):
            return httpx.Response(409, json={"status": "error", "category": "CONFLICT",
                                             "message": "Contact already exists. Existing "
                                                        "ID: 101"})
        if request.method == "GET":
            return httpx.Response(200, json={"id": "101", "properties": {
                "firstname": "", "lastname": "", "company": "", "hubspot_owner_id": "7001"}})
        return httpx.Response(200, json={"id": "101", "properties": {}})

    seen = _recording(crm, answer)
    fields = ContactFields("pat@example.com", "Pat Other", "Globex", fill=("company",))
    record = await crm.upsert_contact("c-1", fields)
    assert (record.record_id, record.adopted, record.marked) == ("101", True, True)
    [patch] = [r for r in seen if r.method == "PATCH"]
    assert _sent(patch) == {"properties": {"inboxcrm_contact_id": "c-1", "company": "Globex"}}
    await crm.aclose()


@pytest.mark.parametrize("fill, sent", [
    (("name", "company"), {"Inboxcrm_Contact_Id__c": "c-1", "Inboxcrm_Company__c": "Globex"}),
    ((), {"Inboxcrm_Contact_Id__c": "c-1"}),
])
async def test_a_salesforce_adoption_fills_only_what_the_policy_allows(
        fill: tuple[str, ...], sent: dict[str, str]) -> None:
    crm = SalesforceCrm("http://crm.test", "t")
    seen = _recording(crm, lambda r: httpx.Response(204))
    record = {"Id": "0030000000001", "FirstName": None, "LastName": "Seller",
              "Inboxcrm_Company__c": None, "OwnerId": "005SALES"}
    fields = ContactFields("pat@example.com", "Pat Other", "Globex", fill=fill)
    await crm._mark("0030000000001", record, "c-1", fields)
    [patch] = seen
    assert _sent(patch) == sent  # the name is the salesperson's (LastName set)
    await crm.aclose()
