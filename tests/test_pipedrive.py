"""Pipedrive, the CRM without upsert by external ID (issue 35): the CRM step of a real item,
through the attempt protocol and the ledger, against a real sandbox process on its Pipedrive
surface, with the client a tenant policy naming `pipedrive` gets (its block through the
registry, the API token by reference). A person a salesperson created is adopted, not
duplicated (our ID written, the owner untouched); two persons with the email go to review
with both as candidates; a create that times out after Pipedrive committed it is reconciled
by our ID (the search, and the newest persons while the index lags), never created twice;
a person merged into one carrying another contact's ID of ours is found by the note we
logged on it and goes to review, neither followed nor re-created.
Counted on the sandbox's side (`/_sandbox/state`, and the create calls in `/_sandbox/calls`)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from inboxcrm.activities.consent import ConsentActivities
from inboxcrm.activities.crm import CrmActivities
from inboxcrm.activities.send import SendActivities
from inboxcrm.adapters import pipedrive as pipedrive_adapter
from inboxcrm.adapters.base import CrmClient
from inboxcrm.adapters.factory import Destinations
from inboxcrm.adapters.registry import Secrets, crm_provider
from inboxcrm.adapters.resend import ResendMail
from inboxcrm.ingress.unsubscribe import record_unsubscribe
from inboxcrm.platform.config import Settings
from inboxcrm.sandbox.pipedrive import CUSTOM_FIELD_KEY
from inboxcrm.schemas.consent import ConsentSyncInput
from inboxcrm.schemas.destinations import TenantDestinations
from inboxcrm.schemas.models import OperationInput
from inboxcrm.schemas.outcomes import ErrorType
from tests.helpers.outbox import later_item, planned_item, step_env
from tests.helpers.sandbox_process import API_KEY, SandboxProcess, own_sandbox

KEY_VARIABLE = "PIPEDRIVE_TEST_TOKEN"


@pytest.fixture(scope="module")
async def company(postgres_server_url: str) -> AsyncIterator[SandboxProcess]:
    """A sandbox of its own (its own database: a Pipedrive company nobody else writes to)."""
    async for process in own_sandbox(postgres_server_url, "sandbox_pipedrive"):
        yield process


@pytest.fixture
async def control(company: SandboxProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=company.url, timeout=10) as client:
        (await client.post("/_sandbox/reset")).raise_for_status()
        before = (await client.get("/_sandbox/config")).json()["search_lag_seconds"]
        yield client
        await client.post("/_sandbox/config", json={"hang_seconds": 30,
                                                    "search_lag_seconds": before})


def _client(company: SandboxProcess, monkeypatch: pytest.MonkeyPatch,
            timeout: float = 10.0) -> CrmClient:
    """The client of a tenant whose policy names Pipedrive (`destinations.crm`)."""
    monkeypatch.setenv(KEY_VARIABLE, API_KEY)
    spec = TenantDestinations.model_validate({"crm": {
        "provider": "pipedrive", "url": company.url, "token": {"env": KEY_VARIABLE},
        "external_id_field": "inboxcrm contact ID"}}).crm
    assert spec is not None
    client: CrmClient = crm_provider("pipedrive").for_tenant(
        spec, Settings(http_timeout_seconds=timeout), Secrets("tenant 'acme' destinations.crm"))
    return client


async def _seed(control: httpx.AsyncClient, *persons: dict[str, Any]) -> list[str]:
    response = await control.post("/_sandbox/seed", json={"crm": "pipedrive",
                                                          "contacts": list(persons)})
    response.raise_for_status()
    return [c["id"] for c in response.json()["contacts"]]


async def _with_email(control: httpx.AsyncClient, email: str) -> list[dict[str, Any]]:
    contacts = (await control.get("/_sandbox/state")).json()["contacts"]
    return [c for c in contacts if str(c["properties"].get("email", "")).lower() == email]


async def _creates(control: httpx.AsyncClient) -> int:
    calls = (await control.get("/_sandbox/calls", params={"target": "crm.upsert"})).json()
    return len(calls["calls"])


async def _audit(store: asyncpg.Pool, workflow_id: str, action: str) -> list[dict[str, Any]]:
    rows = await store.fetch("SELECT detail FROM audit_log WHERE workflow_id = $1 AND "
                             "action = $2 ORDER BY audit_id", workflow_id, action)
    return [r["detail"] if isinstance(r["detail"], dict) else json.loads(r["detail"])
            for r in rows]


async def test_an_existing_person_is_adopted_not_duplicated(
        company: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    item = await planned_item(store)
    [seeded] = await _seed(control, {"email": item.email, "lastname": "Seeded", "owner": "77",
                                     "properties": {"label": "hot"}})
    crm = _client(company, monkeypatch)
    try:
        result = await step_env().run(CrmActivities(store, crm, 300).upsert_contact_in_crm,
                                      item.op("crm-upsert"))
        found = await crm.find_contact(item.contact_id)
    finally:
        await crm.aclose()
    assert result.status == "completed" and result.destination_id == seeded
    [held] = await _with_email(control, item.email)
    props = held["properties"]
    assert held["id"] == seeded and props[CUSTOM_FIELD_KEY] == item.contact_id
    assert (props["owner_id"], props["lastname"], props["label"]) == ("77", "Seeded", "hot")
    assert await _creates(control) == 0
    [adopted] = await _audit(store, item.item.workflow_id, "crm_record_adopted")
    assert adopted["crm"] == "pipedrive" and adopted["crm_record_id"] == seeded
    assert adopted["external_id_written"] is True
    assert found is not None and found.record_id == seeded  # by our ID from now on
    stored = await store.fetchval("SELECT crm_record_id FROM contacts "
                                  "WHERE contact_id = $1::uuid", item.contact_id)
    assert stored == seeded  # the mapping, kept in the integration store


async def test_two_persons_with_the_email_go_to_review(
        company: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    item = await planned_item(store)
    seeded = await _seed(control, {"email": item.email, "owner": "5"},
                         {"email": item.email, "owner": "6"})
    crm = _client(company, monkeypatch)
    try:
        result = await step_env().run(CrmActivities(store, crm, 300).upsert_contact_in_crm,
                                      item.op("crm-upsert"))
    finally:
        await crm.aclose()
    assert (result.status, result.reason) == ("review", "crm_candidates")
    [review] = await _audit(store, item.item.workflow_id, "crm_match_needs_review")
    assert sorted(review["candidates"]) == sorted(seeded) and review["crm"] == "pipedrive"
    held = await _with_email(control, item.email)
    assert sorted(c["id"] for c in held) == sorted(seeded)  # nothing created
    assert all(not c["properties"].get(CUSTOM_FIELD_KEY) for c in held)  # nothing adopted
    assert await _creates(control) == 0


async def _create_that_timed_out(control: httpx.AsyncClient, activities: CrmActivities,
                                 item: Any) -> dict[str, Any]:
    """Our create, committed by Pipedrive, its answer lost (held 3 s after the commit; the
    search index takes a minute to show the new person): an unknown outcome, the step is
    retried. The person it made."""
    (await control.post("/_sandbox/config", json={"hang_seconds": 3,
                                                  "search_lag_seconds": 60})
     ).raise_for_status()
    (await control.post("/_sandbox/faults", json={"target": "crm.upsert",
                                                  "mode": "timeout_after_commit"})
     ).raise_for_status()
    with pytest.raises(ApplicationError):
        await step_env().run(activities.upsert_contact_in_crm, item.op("crm-upsert"))
    [created] = await _with_email(control, item.email)
    return created


async def test_a_create_that_timed_out_after_commit_is_reconciled_not_repeated(
        company: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    item = await planned_item(store)
    crm = _client(company, monkeypatch, timeout=1.0)
    activities = CrmActivities(store, crm, 300)
    try:
        created = await _create_that_timed_out(control, activities, item)
        result = await step_env().run(activities.upsert_contact_in_crm, item.op("crm-upsert"))
    finally:
        await crm.aclose()
    assert (result.status, result.reconciled, result.destination_id) == (
        "completed", True, created["id"])
    [held] = await _with_email(control, item.email)  # exactly one person
    assert held["id"] == created["id"]
    assert held["properties"][CUSTOM_FIELD_KEY] == item.contact_id
    assert await _creates(control) == 1  # the one create that timed out, no second
    row = await store.fetchrow("SELECT status FROM operations WHERE op_key = $1",
                               item.op("crm-upsert").op_key)
    assert row is not None and row["status"] == "completed"


async def _others_added(control: httpx.AsyncClient, count: int) -> None:
    """The company's other users and integrations adding persons meanwhile: `count` through
    the API, and as many imported (seeded: their `add_time` a day back, IDs after ours)."""
    run = uuid.uuid4().hex[:8]
    for n in range(count):
        (await control.post("/v1/persons", params={"api_token": API_KEY}, json={
            "name": f"Other {n}", "email": [{"value": f"new-{run}-{n}@busy.example"}]})
         ).raise_for_status()
    await _seed(control, *({"email": f"old-{run}-{n}@busy.example", "lastname": "Imported"}
                           for n in range(count)))


@pytest.mark.parametrize("pages", [pipedrive_adapter.RECENT_PAGES, 2])
async def test_a_timed_out_create_behind_a_busy_companys_later_persons_is_not_repeated(
        company: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool,
        monkeypatch: pytest.MonkeyPatch, pages: int) -> None:
    """150 persons added after ours and 150 imported, 50 a page, the index not showing ours
    yet. With the window readable ours is found on the fourth page, past the newest 100 the
    lookup read before; with only 2 pages allowed, the lookup is an unknown outcome again
    (the step retries, then the item is held). Either way one person, no second create."""
    monkeypatch.setattr(pipedrive_adapter, "RECENT_PAGE", 50)
    monkeypatch.setattr(pipedrive_adapter, "RECENT_PAGES", pages)
    item = await planned_item(store)
    crm = _client(company, monkeypatch, timeout=1.0)
    activities = CrmActivities(store, crm, 300)
    try:
        created = await _create_that_timed_out(control, activities, item)
        await _others_added(control, 150)
        if pages > 2:
            result = await step_env().run(activities.upsert_contact_in_crm,
                                          item.op("crm-upsert"))
            assert (result.status, result.reconciled, result.destination_id) == (
                "completed", True, created["id"])
        else:
            with pytest.raises(ApplicationError) as raised:
                await step_env().run(activities.upsert_contact_in_crm, item.op("crm-upsert"))
            assert raised.value.type == ErrorType.UNKNOWN_OUTCOME
    finally:
        await crm.aclose()
    assert [c["id"] for c in await _with_email(control, item.email)] == [created["id"]]
    assert await _creates(control) == 1 + 150  # ours that timed out, the others', no second


async def test_two_items_of_one_contact_at_once_make_one_person(
        company: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two emails from one new person, their CRM steps at the same moment (make chaos met
    this: two persons with our ID, 100 ms apart): each looks up, finds none (the index
    lags), creates. Under the contact's create lock the second waits and finds the first's
    person. Several rounds, each a new person; counted at the sandbox."""
    (await control.post("/_sandbox/config", json={"search_lag_seconds": 60})
     ).raise_for_status()
    crm = _client(company, monkeypatch)
    activities = CrmActivities(store, crm, 300)
    rounds = 4
    try:
        for _ in range(rounds):
            first = await planned_item(store)
            second = await _later_item(store, first.contact_id, "crm-upsert")
            ops = [first.op("crm-upsert"),
                   OperationInput(second, f"{second.workflow_id}:crm-upsert")]
            results = await asyncio.gather(*(
                step_env().run(activities.upsert_contact_in_crm, op) for op in ops))
            assert [r.status for r in results] == ["completed", "completed"]
            held = await _with_email(control, first.email)
            assert len(held) == 1, [p["id"] for p in held]
            assert {r.destination_id for r in results} == {held[0]["id"]}
    finally:
        await crm.aclose()
    assert await _creates(control) == rounds


# --- consent: Pipedrive's marketing_status, both ways (docs/consent.md) -------------------


async def test_a_marketing_status_unsubscribed_stops_the_send_step(
        company: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    item = await planned_item(store)
    [seeded] = await _seed(control, {"email": item.email, "lastname": "Seeded"})
    crm = _client(company, monkeypatch)
    mail = ResendMail(company.url, API_KEY, "Acme Sales <sales@acme.test>", 10)
    try:
        upserted = await step_env().run(CrmActivities(store, crm, 300).upsert_contact_in_crm,
                                        item.op("crm-upsert"))
        assert upserted.destination_id == seeded
        # The salesperson marks the person unsubscribed in Pipedrive after we adopted it.
        (await control.put(f"/v1/persons/{seeded}", params={"api_token": API_KEY},
                           json={"marketing_status": "unsubscribed"})).raise_for_status()
        send = SendActivities(store, Destinations.fixed(crm=crm, mail=mail), 300)
        result = await step_env().run(send.submit_followup_email, item.op("send"))
    finally:
        await crm.aclose()
        await mail.aclose()
    assert (result.status, result.reason) == ("cancelled", "crm_opt_out")
    assert (await control.get("/_sandbox/state")).json()["emails"] == []
    [checked] = await _audit(store, item.item.workflow_id, "eligibility_checked")
    assert checked["crm_field"] == "marketing_status"
    assert checked["consent"]["crm_opted_out"] is True


async def test_an_inboxcrm_opt_out_is_written_to_marketing_status_once(
        company: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    tenant = f"pipedrive{uuid.uuid4().hex[:8]}"
    item = await planned_item(store, tenant=tenant)
    [seeded] = await _seed(control, {"email": item.email, "lastname": "Seeded"})
    await store.execute("UPDATE contacts SET crm_record_id = $1 WHERE contact_id = $2::uuid",
                        seeded, item.contact_id)
    outcome = await record_unsubscribe(store, tenant, uuid.UUID(item.contact_id))
    assert outcome is not None and outcome["changed"]
    (await control.post("/_sandbox/faults", json={"target": "crm.consent",
                                                  "mode": "server_error"})).raise_for_status()
    crm = _client(company, monkeypatch)
    sync = ConsentActivities(store, Destinations.fixed(crm=crm))
    try:
        first = await ActivityEnvironment().run(sync.sync_consent_writes,
                                                ConsentSyncInput(tenant=tenant))
        assert (first.written, first.failed) == (0, 1)
        await store.execute("UPDATE crm_consent_writes SET next_attempt_at = now() "
                            "WHERE tenant = $1", tenant)
        second = await ActivityEnvironment().run(sync.sync_consent_writes,
                                                 ConsentSyncInput(tenant=tenant))
        assert second.written == 1
    finally:
        await crm.aclose()
    [held] = await _with_email(control, item.email)
    assert held["properties"]["marketing_status"] == "unsubscribed"
    calls = (await control.get("/_sandbox/calls", params={"target": "crm.consent"})).json()
    assert [c["status_code"] for c in calls["calls"]] == [500, 200]



async def _later_item(store: asyncpg.Pool, contact_id: str, *actions: str) -> Any:
    """An item of the contact as match_and_plan leaves it: its event, its CRM operations."""
    return await later_item(store, contact_id, *actions)


async def test_a_merge_into_a_person_carrying_another_contacts_id_goes_to_review(
        company: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Contact A's person merged into contact B's (both ours): Pipedrive keeps B's ID on the
    survivor and answers A's old ID 404 naming no survivor, but it moved A's notes (ours
    among them) to the survivor. The note we logged names it: A is neither re-pointed at
    B's person nor re-created; the upsert goes to review (`crm_merged_into_other_contact`,
    the survivor the candidate), nothing written."""
    from inboxcrm.activities.crm import MERGED_INTO_OTHER_REASON
    from inboxcrm.schemas.models import OperationInput
    from inboxcrm.store import review

    a, b = await planned_item(store), await planned_item(store)
    crm = _client(company, monkeypatch)
    activities = CrmActivities(store, crm, 300)
    try:
        made = [await step_env().run(activities.upsert_contact_in_crm, i.op("crm-upsert"))
                for i in (a, b)]
        person_a, person_b = (str(m.destination_id) for m in made)
        first = await _later_item(store, a.contact_id, "crm-note")
        note = await step_env().run(activities.log_email_on_contact,
                                    OperationInput(first, f"{first.workflow_id}:crm-note"))
        assert note.status == "completed", note
        merged = await control.put(f"/v1/persons/{person_a}/merge",
                                   headers={"x-api-token": API_KEY},
                                   json={"merge_with_id": int(person_b)})
        assert merged.status_code == 200, merged.text
        assert (await control.get(f"/v1/persons/{person_a}",
                                  headers={"x-api-token": API_KEY})).status_code == 404
        before = (await control.get("/_sandbox/state")).json()["contacts"]
        later = await _later_item(store, a.contact_id, "crm-upsert")
        again = await step_env().run(activities.upsert_contact_in_crm,
                                     OperationInput(later, f"{later.workflow_id}:crm-upsert"))
    finally:
        await crm.aclose()
    assert (again.status, again.reason) == ("review", MERGED_INTO_OTHER_REASON)
    persons = (await control.get("/_sandbox/state")).json()["contacts"]
    assert len(persons) == len(before)                                # nothing created
    [survivor] = [p for p in persons if p["id"] == person_b]
    assert survivor["properties"][CUSTOM_FIELD_KEY] == b.contact_id   # B's ID kept
    assert not [p for p in persons if p["properties"].get(CUSTOM_FIELD_KEY) == a.contact_id]
    assert await store.fetchval("SELECT crm_record_id FROM contacts WHERE contact_id = "
                                "$1::uuid", a.contact_id) == person_a  # not re-pointed
    async with store.acquire() as conn:
        crm_name, candidates = await review.crm_candidates(conn, workflow_id=later.workflow_id)
    assert (crm_name, candidates) == ("pipedrive", [person_b])
    [card] = await _audit(store, later.workflow_id, "crm_match_needs_review")
    assert (card["old"], card["other_contact_id"]) == (person_a, b.contact_id)
