"""Pipedrive through pipedrive-python-lib (Pipedrive publishes no official Python client; this
is the community wrapper of API v1, requests-based, pinned in constraints.txt) against the
sandbox over HTTP: persons (search by email and by our custom field, create, read, update),
person fields, notes, and the errors the Pipedrive adapter relies on, as the client raises
them. Shapes checked against Pipedrive's API reference (developers.pipedrive.com/docs/api/v1,
Persons / PersonFields / Notes) and the official Node client's models (github.com/pipedrive/
client-nodejs docs/PersonsApi.md, NotesApi.md)."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from pipedrive import exceptions
from pipedrive.client import Client

from inboxcrm.adapters.base import ContactFields, MatchCandidates
from inboxcrm.adapters.pipedrive import PipedriveCrm
from tests.helpers.sandbox_process import API_KEY, SandboxProcess

FIELD_NAME = "inboxcrm contact ID"


@pytest.fixture(autouse=True)
async def indexed_at_once(sandbox: SandboxProcess) -> AsyncIterator[None]:
    """No search lag unless a test sets one (the sandbox process is shared: put it back)."""
    before = (await _control(sandbox, "GET", "/_sandbox/config"))["search_lag_seconds"]
    await _control(sandbox, "POST", "/_sandbox/config", json={"search_lag_seconds": 0})
    yield
    await _control(sandbox, "POST", "/_sandbox/config", json={"search_lag_seconds": before})


@pytest.fixture
def pd(sandbox: SandboxProcess) -> Client:
    client = Client(domain=sandbox.url)
    client.set_api_token(API_KEY)
    return client


def _key(pd: Client) -> str:
    fields = pd.persons.get_person_fields()
    assert fields["success"] is True
    [field] = [f for f in fields["data"] if f["name"] == FIELD_NAME]
    assert re.fullmatch(r"[0-9a-f]{40}", field["key"]) and field["field_type"] == "varchar"
    return str(field["key"])


async def _control(sandbox: SandboxProcess, method: str, path: str, **kwargs: Any) -> Any:
    async with httpx.AsyncClient(base_url=sandbox.url, timeout=10) as control:
        answer = await control.request(method, path, **kwargs)
        answer.raise_for_status()
        return answer.json()


def _search(pd: Client, term: str, fields: str) -> list[int]:
    found = pd.persons.search_persons(params={"term": term, "fields": fields,
                                              "exact_match": "true"})
    assert found["success"] is True
    assert found["additional_data"]["pagination"]["start"] == 0
    for entry in found["data"]["items"]:
        assert entry["item"]["type"] == "person" and isinstance(entry["result_score"], float)
    return [entry["item"]["id"] for entry in found["data"]["items"]]


async def test_persons_are_created_found_and_updated(pd: Client) -> None:
    key, ours = _key(pd), str(uuid.uuid4())
    created = pd.persons.create_person({
        "name": "Ada Lovelace", "email": [{"value": "ada@example.com", "primary": True,
                                           "label": "work"}], key: ours})
    assert created["success"] is True
    person = created["data"]
    assert isinstance(person["id"], int) and person[key] == ours
    assert person["email"][0] == {"label": "work", "value": "ada@example.com", "primary": True}
    assert person["owner_id"]["id"] == 1 and person["marketing_status"] == "subscribed"
    # Exact, case-insensitive search by email and by our custom field.
    assert _search(pd, "ADA@example.com", "email") == [person["id"]]
    assert _search(pd, ours, "custom_fields") == [person["id"]]
    assert _search(pd, "ada@example", "email") == []  # exact means exact
    updated = pd.persons.update_person(person["id"], {"last_name": "Byron"})
    assert updated["data"]["last_name"] == "Byron" and updated["data"]["name"] == "Ada Byron"
    assert pd.persons.get_person(person["id"])["data"][key] == ours
    # No upsert and no uniqueness: the same create again is a second person.
    again = pd.persons.create_person({"name": "Ada Lovelace", "email": ["ada@example.com"],
                                      key: ours})
    assert again["data"]["id"] != person["id"]
    assert sorted(_search(pd, ours, "custom_fields")) == sorted(
        [person["id"], again["data"]["id"]])


async def test_the_search_is_an_index_the_list_is_not(pd: Client,
                                                      sandbox: SandboxProcess) -> None:
    """A new person enters the search `search_lag_seconds` after its create; the list of
    persons (`GET /v1/persons?sort=add_time DESC`, what the adapter pages) has it at once,
    its `add_time` in the form the adapter reads."""
    await _control(sandbox, "POST", "/_sandbox/config", json={"search_lag_seconds": 60})
    key, ours = _key(pd), str(uuid.uuid4())
    person = pd.persons.create_person({"name": "New", "email": ["new@example.com"],
                                       key: ours})["data"]
    assert _search(pd, ours, "custom_fields") == [] and _search(
        pd, "new@example.com", "email") == []
    listed = pd.persons.get_all_persons(params={"sort": "add_time DESC", "limit": 5})
    assert listed["success"] is True and listed["data"][0]["id"] == person["id"]
    added = datetime.strptime(listed["data"][0]["add_time"], "%Y-%m-%d %H:%M:%S")
    assert abs(added.replace(tzinfo=UTC) - datetime.now(UTC)) < timedelta(minutes=1)
    assert listed["data"][0][key] == ours
    assert listed["additional_data"]["pagination"]["more_items_in_collection"] is False
    crm = PipedriveCrm(sandbox.url, API_KEY)
    try:  # the adapter finds it by our ID all the same: no second create
        found = await crm.upsert_contact(ours, ContactFields("new@example.com", "New"))
    finally:
        await crm.aclose()
    assert (found.record_id, found.created) == (str(person["id"]), False)


async def test_notes_are_logged_on_the_person(pd: Client) -> None:
    person = pd.persons.create_person({"name": "Lin", "email": ["lin@example.com"]})["data"]
    note = pd.notes.create_note({"content": "<p>hello</p>", "person_id": person["id"],
                                 "add_time": "2026-11-29 10:15:00"})
    assert note["success"] is True
    assert (note["data"]["person_id"], note["data"]["add_time"]) == (
        person["id"], "2026-11-29 10:15:00")
    listed = pd.notes.get_all_notes(params={"person_id": person["id"]})
    assert [n["id"] for n in listed["data"]] == [note["data"]["id"]]
    assert listed["data"][0]["content"] == "<p>hello</p>"


async def test_errors_are_the_clients_exceptions(pd: Client, sandbox: SandboxProcess) -> None:
    with pytest.raises(exceptions.NotFoundError) as missing:
        pd.persons.get_person(999999999)
    assert missing.value.response.json()["success"] is False
    with pytest.raises(exceptions.BadRequestError):
        pd.persons.create_person({"email": ["noname@example.com"]})  # name is required
    wrong = Client(domain=sandbox.url)
    wrong.set_api_token("not-the-token")
    with pytest.raises(exceptions.UnauthorizedError) as denied:
        wrong.persons.get_person_fields()
    assert denied.value.response.json()["errorCode"] == 401
    await _control(sandbox, "POST", "/_sandbox/faults",
                   json={"target": "crm.upsert", "mode": "rate_limit", "retry_after": 7})
    with pytest.raises(exceptions.TooManyRequestsError) as limited:
        pd.persons.create_person({"name": "X"})
    headers = limited.value.response.headers
    assert (headers["x-ratelimit-remaining"], headers["x-ratelimit-reset"]) == ("0", "7")
    await _control(sandbox, "POST", "/_sandbox/faults",
                   json={"target": "crm.search", "mode": "server_error"})
    with pytest.raises(exceptions.InternalServerError):
        pd.persons.get_person_fields()


async def test_the_token_in_the_header_and_the_seed_of_a_salespersons_person(
        sandbox: SandboxProcess) -> None:
    seeded = await _control(sandbox, "POST", "/_sandbox/seed", json={
        "crm": "pipedrive", "contacts": [{"email": "kim@example.com", "firstname": "Kim",
                                          "owner": "42", "opted_out": True}]})
    [record] = seeded["contacts"]
    state = await _control(sandbox, "GET", "/_sandbox/state")
    [held] = [c for c in state["contacts"] if c["id"] == record["id"]]
    assert (held["properties"]["owner_id"], held["properties"]["marketing_status"]) == (
        "42", "unsubscribed")
    async with httpx.AsyncClient(base_url=sandbox.url, timeout=10,
                                 headers={"x-api-token": API_KEY}) as client:
        person = (await client.get(f"/v1/persons/{record['id']}")).json()["data"]
    assert person["owner_id"]["id"] == 42 and person["name"] == "Kim"
    assert person["marketing_status"] == "unsubscribed"


async def test_the_adapter_matches_before_it_creates(sandbox: SandboxProcess) -> None:
    """Our adapter on the subset the client just checked: adopt one, review two, create."""
    crm = PipedriveCrm(sandbox.url, API_KEY)
    ours = str(uuid.uuid4())
    try:
        [one] = (await _control(sandbox, "POST", "/_sandbox/seed", json={
            "crm": "pipedrive", "contacts": [{"email": "one@example.com",
                                              "owner": "9"}]}))["contacts"]
        adopted = await crm.upsert_contact(ours, ContactFields("one@example.com", "One Person"))
        assert (adopted.record_id, adopted.adopted, adopted.marked) == (one["id"], True, True)
        again = await crm.upsert_contact(ours, ContactFields("one@example.com", "One Person"))
        assert (again.record_id, again.adopted) == (one["id"], False)
        two = (await _control(sandbox, "POST", "/_sandbox/seed", json={
            "crm": "pipedrive", "contacts": [{"email": "two@example.com"},
                                             {"email": "two@example.com"}]}))["contacts"]
        with pytest.raises(MatchCandidates) as many:
            await crm.upsert_contact(str(uuid.uuid4()), ContactFields("two@example.com"))
        assert sorted(many.value.record_ids) == sorted(c["id"] for c in two)
        new = await crm.upsert_contact(str(uuid.uuid4()), ContactFields("new@example.com"))
        assert new.created is True
        note = await crm.log_note("k-1", new.record_id, "text", datetime.now(UTC))
        assert await crm.log_note("k-1", new.record_id, "text", datetime.now(UTC)) == note
        assert await crm.find_note("k-1") == note
        assert (await crm.read_opt_out(one["id"])).opted_out is False
        await crm.write_opt_out("one@example.com", one["id"])
        assert (await crm.read_opt_out(one["id"])).opted_out is True
    finally:
        await crm.aclose()
