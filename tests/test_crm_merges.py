"""Changes of address and merges (issue 35, docs/architecture.md §5), on real components.

- HubSpot, end to end on the stack: mail from A makes our record; a salesperson merges it
  into another contact (`POST /crm/v3/objects/contacts/merge`); the next mail from A is
  logged on the survivor, no record is created, the contact's stored record is the survivor
  and the audit says `crm_record_merged`.
- Salesforce, through the CRM steps against a sandbox process of its own: our Contact merged
  into another (the loser deleted, `MasterRecordId` the master) is followed by the note (its
  Task refused on the deleted record) and by the upsert; one Contact, no new one. Our Lead
  merged into a salesperson's Lead is followed the same way; an adopted Lead they converted
  is followed to its Contact (`ConvertedContactId`), never written as a converted Lead.
- `inboxcrm contact link`: two addresses of one person, then mail from each: one contact row,
  one CRM record at the sandbox, both notes on it; two contacts that both have CRM records
  are refused with what to do.
Counted on the destination side (`/_sandbox/state`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from inboxcrm.activities.crm import CrmActivities, note_key
from inboxcrm.adapters.salesforce import SalesforceCrm
from inboxcrm.schemas.models import ItemRef, OperationInput
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.cli import as_reviewer, cli
from tests.helpers.outbox import later_item, planned_item, step_env
from tests.helpers.sandbox_process import API_KEY, SandboxProcess, own_sandbox

TERMINAL = {"completed", "ignored", "suppressed", "rejected", "failed", "shadowed"}
SF_FIELD = "Inboxcrm_Contact_Id__c"


def _detail(raw: Any) -> dict[str, Any]:
    return raw if isinstance(raw, dict) else dict(json.loads(raw))


async def _audit(pool: asyncpg.Pool, action: str, contact_id: str) -> list[dict[str, Any]]:
    rows = await pool.fetch("SELECT detail FROM audit_log WHERE action = $1 AND "
                            "contact_id = $2::uuid ORDER BY audit_id", action, contact_id)
    return [_detail(r["detail"]) for r in rows]


async def _state(http: httpx.AsyncClient, url: str) -> dict[str, Any]:
    response = await http.get(f"{url}/_sandbox/state")
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def _activities_of(state: dict[str, Any], workflow_id: str, action: str) -> list[dict[str, Any]]:
    key = note_key(f"{workflow_id}:{action}")
    return [a for a in state["activities"] if key in a["key"].values()]


# --- HubSpot, end to end ------------------------------------------------------------------


async def test_a_hubspot_merge_is_followed_to_the_survivor(env: StackClient,
                                                           stack: Stack) -> None:
    sandbox = stack.sandbox_url
    a, b = unique_email("merged"), unique_email("survivor")
    seeded = await env.http.post(f"{sandbox}/_sandbox/seed", json={
        "crm": "hubspot", "contacts": [{"email": b, "lastname": "Kept", "owner": "7001"}]})
    seeded.raise_for_status()
    [survivor] = [c["id"] for c in seeded.json()["contacts"]]

    first = await env.deliver(message_from(a))
    assert (await env.wait_state(first, TERMINAL, timeout=120))[0] == "completed"
    contact_id, ours = await env.db.fetchrow(
        "SELECT contact_id::text, crm_record_id FROM contacts WHERE canonical_email = $1", a)
    assert ours and ours != survivor

    merged = await env.http.post(f"{sandbox}/crm/v3/objects/contacts/merge",
                                 json={"primaryObjectId": survivor, "objectIdToMerge": ours})
    assert merged.status_code == 200, merged.text
    old = await env.http.get(f"{sandbox}/crm/v3/objects/contacts/{ours}")
    assert old.json()["id"] == survivor  # the old ID answers with the survivor
    assert ours in old.json()["properties"]["hs_merged_object_ids"].split(";")
    records_before = len((await _state(env.http, sandbox))["contacts"])

    second = await env.deliver(message_from(a, subject="One more question"))
    assert await env.wait_state(second, TERMINAL, timeout=120) != ("failed", None)
    state = await _state(env.http, sandbox)
    assert len(state["contacts"]) == records_before  # no record created
    assert await env.crm_records_for(a) == []  # A lives on as the survivor's second email
    [kept] = [c for c in state["contacts"] if c["id"] == survivor]
    assert kept["properties"]["inboxcrm_contact_id"] == contact_id
    assert kept["properties"]["hubspot_owner_id"] == "7001"
    [note] = _activities_of(state, second, "crm-note")
    assert note["records"] == [survivor]
    assert await env.db.fetchval("SELECT crm_record_id FROM contacts WHERE contact_id = "
                                 "$1::uuid", contact_id) == survivor
    [followed] = await _audit(env.db, "crm_record_merged", contact_id)
    assert followed["old"] == ours and followed["survivor"] == survivor
    assert followed["crm"] == "hubspot" and followed["external_id_written"] is True


# --- Salesforce, the CRM steps ------------------------------------------------------------


@pytest.fixture(scope="module")
async def org(postgres_server_url: str) -> AsyncIterator[SandboxProcess]:
    async for process in own_sandbox(postgres_server_url, "sandbox_merges"):
        yield process


async def _next_item(pool: asyncpg.Pool, contact_id: str, tenant: str = "acme") -> ItemRef:
    """A later item of the same contact, as match_and_plan leaves it: its event linked to the
    contact, its CRM upsert and note queued."""
    return await later_item(pool, contact_id, "crm-upsert", "crm-note", tenant=tenant)


async def test_a_salesforce_merge_is_followed_by_the_note_and_the_upsert(
        org: SandboxProcess, store: asyncpg.Pool) -> None:
    async with httpx.AsyncClient(base_url=org.url, timeout=10) as control:
        (await control.post("/_sandbox/reset")).raise_for_status()
        item = await planned_item(store)
        crm = SalesforceCrm(org.url, API_KEY)
        activities = CrmActivities(store, crm, 300)
        try:
            first = await step_env().run(activities.upsert_contact_in_crm,
                                         item.op("crm-upsert"))
            assert first.status == "completed" and first.destination_id
            ours = first.destination_id
            seeded = await control.post("/_sandbox/seed", json={"crm": "salesforce", "contacts": [
                {"email": unique_email("master"), "lastname": "Master", "owner": "005SALES"}]})
            [master] = [c["id"] for c in seeded.json()["contacts"]]
            merged = await control.post("/_sandbox/salesforce/merge", json={
                "masterRecordId": master, "recordToMergeIds": [ours]})
            assert merged.status_code == 200, merged.text
            gone = await control.get(f"/services/data/v62.0/sobjects/Contact/{ours}",
                                     headers={"Authorization": f"Bearer {API_KEY}"})
            assert gone.status_code == 404 and gone.json()[0]["errorCode"] == "ENTITY_IS_DELETED"
            contacts_before = len((await control.get("/_sandbox/state")).json()["contacts"])

            later = await _next_item(store, item.contact_id)
            # The note first: its Task on the deleted Contact is refused, the merge followed.
            note = await step_env().run(activities.log_email_on_contact,
                                        OperationInput(later, f"{later.workflow_id}:crm-note"))
            assert note.status == "completed", note
            upsert = await step_env().run(
                activities.upsert_contact_in_crm,
                OperationInput(later, f"{later.workflow_id}:crm-upsert"))
            assert upsert.status == "completed" and upsert.destination_id == master
        finally:
            await crm.aclose()
        state = (await control.get("/_sandbox/state")).json()
    assert len(state["contacts"]) == contacts_before  # no Contact created
    [kept] = [c for c in state["contacts"] if c["id"] == master]
    assert kept["properties"][SF_FIELD] == item.contact_id
    assert kept["properties"]["OwnerId"] == "005SALES"
    [task] = _activities_of(state, later.workflow_id, "crm-note")
    assert task["records"] == [master]
    assert await store.fetchval("SELECT crm_record_id FROM contacts WHERE contact_id = "
                                "$1::uuid", item.contact_id) == master
    [followed] = await _audit(store, "crm_record_merged", item.contact_id)  # once, not twice
    assert (followed["old"], followed["survivor"], followed["crm"]) == (
        ours, master, "salesforce")


async def _lead_step(org: SandboxProcess, store: asyncpg.Pool, op: OperationInput,
                     action: str = "upsert") -> Any:
    crm = SalesforceCrm(org.url, API_KEY, new_prospects="lead")
    activities = CrmActivities(store, crm, 300)
    step = (activities.upsert_contact_in_crm if action == "upsert"
            else activities.log_email_on_contact)
    try:
        return await step_env().run(step, op)
    finally:
        await crm.aclose()


async def test_a_salesforce_lead_merge_is_followed_to_the_master_lead(
        org: SandboxProcess, store: asyncpg.Pool) -> None:
    """Our Lead (a new prospect under `new_prospects: lead`) merged by a salesperson into a
    Lead of theirs: the merged Lead is deleted (`MasterRecordId`), the next item's note and
    upsert reach the master, no Lead or Contact is created, the master gets our ID and keeps
    its owner."""
    async with httpx.AsyncClient(base_url=org.url, timeout=10) as control:
        (await control.post("/_sandbox/reset")).raise_for_status()
        item = await planned_item(store)
        first = await _lead_step(org, store, item.op("crm-upsert"))
        assert first.status == "completed" and first.destination_id.startswith("00Q")
        ours = first.destination_id
        seeded = await control.post("/_sandbox/seed", json={"crm": "salesforce", "leads": [
            {"email": unique_email("leadmaster"), "lastname": "Master", "owner": "005LEADS",
             "properties": {"Company": "Initech"}}]})
        [master] = [lead["id"] for lead in seeded.json()["leads"]]
        merged = await control.post("/_sandbox/salesforce/merge", json={
            "masterRecordId": master, "recordToMergeIds": [ours]})
        assert merged.status_code == 200, merged.text
        before = (await control.get("/_sandbox/state")).json()

        later = await _next_item(store, item.contact_id)
        note = await _lead_step(org, store, OperationInput(later, f"{later.workflow_id}:crm-note"),
                                "note")
        assert note.status == "completed", note
        upsert = await _lead_step(org, store,
                                  OperationInput(later, f"{later.workflow_id}:crm-upsert"))
        assert (upsert.status, upsert.destination_id) == ("completed", master)
        state = (await control.get("/_sandbox/state")).json()
    assert len(state["leads"]) == len(before["leads"])  # no Lead created
    assert len(state["contacts"]) == len(before["contacts"])  # no Contact either
    [kept] = [lead for lead in state["leads"] if lead["id"] == master]
    assert kept["properties"][SF_FIELD] == item.contact_id
    assert kept["properties"]["OwnerId"] == "005LEADS"
    assert not any(lead["id"] == ours for lead in state["leads"])
    [task] = _activities_of(state, later.workflow_id, "crm-note")
    assert task["records"] == [master]
    assert await store.fetchval("SELECT crm_record_id FROM contacts WHERE contact_id = "
                                "$1::uuid", item.contact_id) == master
    [followed] = await _audit(store, "crm_record_merged", item.contact_id)
    assert (followed["old"], followed["survivor"], followed["external_id_written"]) == (
        ours, master, True)


async def test_an_adopted_lead_converted_later_is_followed_to_its_contact(
        org: SandboxProcess, store: asyncpg.Pool) -> None:
    """A salesperson's Lead we adopted, then converted by them: the next upsert is not a
    write to the converted Lead (Salesforce refuses that) but follows it to its Contact,
    which gets our ID, keeps its owner and name; nothing is created."""
    async with httpx.AsyncClient(base_url=org.url, timeout=10) as control:
        (await control.post("/_sandbox/reset")).raise_for_status()
        item = await planned_item(store)
        [lead] = [r["id"] for r in (await control.post("/_sandbox/seed", json={
            "crm": "salesforce", "leads": [{"email": item.email, "lastname": "Kept",
                                            "owner": "005CONV",
                                            "properties": {"Company": "[unknown]"}}]})
        ).json()["leads"]]
        first = await _lead_step(org, store, item.op("crm-upsert"))
        assert (first.status, first.destination_id) == ("completed", lead)
        contact = (await control.post(f"/_sandbox/salesforce/leads/{lead}/convert")
                   ).json()["contact_id"]
        before = (await control.get("/_sandbox/state")).json()

        later = await _next_item(store, item.contact_id)
        upsert = await _lead_step(org, store,
                                  OperationInput(later, f"{later.workflow_id}:crm-upsert"))
        assert (upsert.status, upsert.destination_id) == ("completed", contact), upsert
        note = await _lead_step(org, store, OperationInput(later, f"{later.workflow_id}:crm-note"),
                                "note")
        assert note.status == "completed", note
        state = (await control.get("/_sandbox/state")).json()
    assert len(state["contacts"]) == len(before["contacts"])
    assert len(state["leads"]) == len(before["leads"])
    [held] = [c for c in state["contacts"] if c["id"] == contact]
    assert held["properties"][SF_FIELD] == item.contact_id
    assert (held["properties"]["OwnerId"], held["properties"]["lastname"]) == ("005CONV", "Kept")
    [task] = _activities_of(state, later.workflow_id, "crm-note")
    assert task["records"] == [contact]
    [followed] = await _audit(store, "crm_record_merged", item.contact_id)
    assert (followed["old"], followed["survivor"]) == (lead, contact)


# --- contact link ---------------------------------------------------------------------------


async def test_contact_link_makes_two_addresses_one_contact_and_one_record(
        env: StackClient, stack: Stack) -> None:
    a, b = unique_email("before"), unique_email("after")
    refused = cli(stack, "contact", "link", "--tenant", "acme", a, b)
    assert refused.returncode == 1 and "neither address has a contact" in refused.stderr

    first = await env.deliver(message_from(a))
    assert (await env.wait_state(first, TERMINAL, timeout=120))[0] == "completed"
    linked = cli(stack, "contact", "link", "--tenant", "acme", a, b, "--reviewer", "rita",
                 "--note", "changed jobs", "--json")
    assert linked.returncode == 0, linked.stderr
    answer = json.loads(linked.stdout)
    assert answer["changed"] is True and answer["joined_contact_id"] is None
    again = cli(stack, "contact", "link", "--tenant", "acme", b, a, "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["changed"] is False

    second = await env.deliver(message_from(b, subject="From my new address"))
    assert await env.wait_state(second, TERMINAL, timeout=120) != ("failed", None)
    assert await env.count("SELECT count(*) FROM contacts WHERE tenant = 'acme' AND "
                           "canonical_email = ANY($1::text[])", [a, b]) == 1
    assert await env.db.fetchval("SELECT contact_id::text FROM inbound_events WHERE "
                                 "workflow_id = $1", second) == answer["contact_id"]
    assert len(await env.crm_records_for(a)) == 1 and await env.crm_records_for(b) == []
    state = await _state(env.http, stack.sandbox_url)
    [record] = await env.crm_records_for(a)
    for workflow_id in (first, second):
        [note] = _activities_of(state, workflow_id, "crm-note")
        assert note["records"] == [record["id"]]
    [entry] = await _audit(env.db, "contact_linked", answer["contact_id"])
    assert entry["note"] == "changed jobs"
    # The actor is who authenticated (the stack's operator token); the typed name a label.
    assert entry["typed_reviewer"] == "rita"
    assert await env.db.fetchval(
        "SELECT actor FROM audit_log WHERE action = 'contact_linked' AND contact_id = $1::uuid",
        answer["contact_id"]) == "operator"


async def test_contact_link_refuses_two_contacts_with_records_of_their_own(
        env: StackClient, stack: Stack) -> None:
    a, b = unique_email("one"), unique_email("two")
    for address in (a, b):
        workflow_id = await env.deliver(message_from(address))
        assert (await env.wait_state(workflow_id, TERMINAL, timeout=120))[0] == "completed"
    refused = cli(stack, "contact", "link", "--tenant", "acme", a, b)
    assert refused.returncode == 1
    assert "merge the two records in the CRM first" in refused.stderr
    assert await env.count("SELECT count(*) FROM contact_addresses WHERE canonical_email = "
                           "ANY($1::text[])", [a, b]) == 0


async def test_contact_link_refuses_a_reviewer_of_another_tenant(
        env: StackClient, stack: Stack) -> None:
    a, b = unique_email("othertenant"), unique_email("othertenant2")
    workflow_id = await env.deliver(message_from(a))
    assert (await env.wait_state(workflow_id, TERMINAL, timeout=120))[0] == "completed"
    added = cli(stack, "reviewer", "add", f"gil-{a.split('@')[0][-6:]}", "--tenant", "globex",
                "--json")
    assert added.returncode == 0, added.stderr
    token = json.loads(added.stdout)["token"]
    refused = as_reviewer(stack, token, "contact", "link", "--tenant", "acme", a, b)
    assert refused.returncode == 1 and "not a reviewer of tenant 'acme'" in refused.stderr
    assert await env.count("SELECT count(*) FROM contact_addresses WHERE canonical_email = "
                           "ANY($1::text[])", [a, b]) == 0


async def test_contact_link_refuses_an_opted_out_address_with_one_that_is_not(
        env: StackClient, stack: Stack) -> None:
    a, b = unique_email("kept"), unique_email("optedout")
    workflow_id = await env.deliver(message_from(a))
    assert (await env.wait_state(workflow_id, TERMINAL, timeout=120))[0] == "completed"
    await env.db.execute("INSERT INTO suppressions (tenant, canonical_email, reason, source) "
                         "VALUES ('acme', $1, 'unsubscribe', 'test')", b)
    refused = cli(stack, "contact", "link", "--tenant", "acme", a, b)
    assert refused.returncode == 1 and "record the same opt-out for both" in refused.stderr
    assert await env.count("SELECT count(*) FROM contact_addresses WHERE canonical_email = "
                           "ANY($1::text[])", [a, b]) == 0


async def test_contact_link_joins_a_contact_without_a_record_to_the_one_with(
        env: StackClient, stack: Stack) -> None:
    a, b = unique_email("withrecord"), unique_email("norecord")
    workflow_id = await env.deliver(message_from(a))
    assert (await env.wait_state(workflow_id, TERMINAL, timeout=120))[0] == "completed"
    # B's own contact, never written to the CRM (as one whose item waits in review).
    other = await env.db.fetchval("INSERT INTO contacts (tenant, canonical_email, email) "
                                  "VALUES ('acme', $1, $1) RETURNING contact_id::text", b)
    linked = cli(stack, "contact", "link", "--tenant", "acme", b, a, "--json")
    assert linked.returncode == 0, linked.stderr
    answer = json.loads(linked.stdout)
    kept = await env.db.fetchval("SELECT contact_id::text FROM contacts WHERE "
                                 "canonical_email = $1", a)
    assert (answer["contact_id"], answer["joined_contact_id"]) == (kept, other)
    second = await env.deliver(message_from(b, subject="Me again"))
    assert await env.wait_state(second, TERMINAL, timeout=120) != ("failed", None)
    assert await env.db.fetchval("SELECT contact_id::text FROM inbound_events WHERE "
                                 "workflow_id = $1", second) == kept
    assert len(await env.crm_records_for(a)) == 1 and await env.crm_records_for(b) == []


async def test_contact_link_moves_a_waiting_item_of_the_joined_contact_to_the_one_record(
        env: StackClient, stack: Stack) -> None:
    """B's first item waits at its CRM step (a 429: nothing written) while an operator links
    B to A, whose contact has a record. The item moves with the link: its retried upsert,
    its note and its email activity reach A's record; no record is made for B; its
    follow-up goes out once, to the address that wrote."""
    a, b = unique_email("linkedkeep"), unique_email("linkedwait")
    first = await env.deliver(message_from(a))
    assert (await env.wait_state(first, TERMINAL, timeout=120))[0] == "completed"
    [record] = await env.crm_records_for(a)
    await env.inject("crm.upsert", "rate_limit", retry_after=15)
    try:
        waiting = await env.deliver(message_from(b, subject="From my other address"))
        op_key = f"{waiting}:crm-upsert"

        async def refused() -> bool:
            row = await env.operation(op_key)
            return row is not None and row["attempts"] >= 1 and row["status"] == "waiting"

        await env.wait_for(refused, timeout=60, what="B's upsert refused once")
        joined = await env.db.fetchval("SELECT contact_id::text FROM contacts WHERE "
                                       "tenant = 'acme' AND canonical_email = $1", b)
        linked = cli(stack, "contact", "link", "--tenant", "acme", a, b, "--json")
        assert linked.returncode == 0, linked.stderr
        answer = json.loads(linked.stdout)
    finally:
        await env.reset_faults()
    event_id = await env.db.fetchval("SELECT event_id::text FROM inbound_events WHERE "
                                     "workflow_id = $1", waiting)
    assert answer["joined_contact_id"] == joined
    assert (answer["items_moved"], answer["items_kept"]) == ([event_id], [])
    assert await env.wait_state(waiting, TERMINAL, timeout=120) == ("completed",
                                                                    "followup_sent")
    assert await env.crm_records_for(b) == []
    assert [r["id"] for r in await env.crm_records_for(a)] == [record["id"]]
    assert await env.db.fetchval("SELECT contact_id::text FROM inbound_events WHERE "
                                 "event_id = $1::uuid", event_id) == answer["contact_id"]
    assert await env.db.fetchval("SELECT crm_record_id FROM contacts WHERE contact_id = "
                                 "$1::uuid", joined) is None
    state = await _state(env.http, stack.sandbox_url)
    [note] = _activities_of(state, waiting, "crm-note")
    assert note["records"] == [record["id"]]
    assert len(await env.emails_to(b)) == 1
    [entry] = await _audit(env.db, "contact_linked", answer["contact_id"])
    assert (entry["items_moved"], entry["items_kept"]) == ([event_id], [])


async def test_contact_link_leaves_an_item_whose_upsert_may_have_written(
        env: StackClient, stack: Stack) -> None:
    """An item of the joined contact whose CRM upsert's outcome is not known (it may have
    made a record by the joined contact's ID) is not moved: only its own reconciliation by
    that ID can find such a record. The link says so (`items_kept`)."""
    a, b = unique_email("keepsafe"), unique_email("unknownb")
    first = await env.deliver(message_from(a))
    assert (await env.wait_state(first, TERMINAL, timeout=120))[0] == "completed"
    other = await env.db.fetchval("INSERT INTO contacts (tenant, canonical_email, email) "
                                  "VALUES ('acme', $1, $1) RETURNING contact_id::text", b)
    item = await _next_item(env.db, other)
    await env.db.execute(
        "UPDATE operations SET status = 'waiting', attempts = 1, last_error_category = "
        "'unknown', last_error = 'timeout', key_window_from = now() WHERE op_key = $1",
        f"{item.workflow_id}:crm-upsert")
    linked = cli(stack, "contact", "link", "--tenant", "acme", a, b, "--json")
    assert linked.returncode == 0, linked.stderr
    answer = json.loads(linked.stdout)
    assert (answer["items_moved"], answer["items_kept"]) == ([], [item.event_id])
    assert await env.db.fetchval("SELECT external_ref FROM operations WHERE op_key = $1",
                                 f"{item.workflow_id}:crm-upsert") == other
    assert await env.db.fetchval("SELECT contact_id::text FROM inbound_events WHERE "
                                 "event_id = $1::uuid", item.event_id) == other


# --- a survivor already carrying another contact's ID of ours -----------------------------


async def _merge_ours_into_another(control: httpx.AsyncClient, provider: str, loser: str,
                                   survivor: str) -> None:
    """A salesperson merges two records that were both ours (each carries our ID)."""
    auth = {"Authorization": f"Bearer {API_KEY}"}
    if provider == "hubspot":
        merged = await control.post("/crm/v3/objects/contacts/merge", headers=auth, json={
            "primaryObjectId": survivor, "objectIdToMerge": loser})
    else:
        merged = await control.post("/_sandbox/salesforce/merge", json={
            "masterRecordId": survivor, "recordToMergeIds": [loser]})
    assert merged.status_code == 200, merged.text


@pytest.mark.parametrize("provider", ["hubspot", "salesforce"])
async def test_a_merge_into_another_contacts_record_goes_to_review_not_followed(
        org: SandboxProcess, store: asyncpg.Pool, provider: str) -> None:
    """Contact A's record merged into contact B's (both ours): A is not re-pointed at B's
    record nor re-created; the upsert goes to review naming the conflict, the survivor on
    the card; the note on the merged record is blocked with the same reason."""
    from inboxcrm.activities.crm import MERGED_INTO_OTHER_REASON
    from inboxcrm.adapters.hubspot import HubSpotCrm
    from inboxcrm.domain import review_card
    from inboxcrm.store import review

    id_field = "inboxcrm_contact_id" if provider == "hubspot" else SF_FIELD
    async with httpx.AsyncClient(base_url=org.url, timeout=10) as control:
        (await control.post("/_sandbox/reset")).raise_for_status()
        a, b = await planned_item(store), await planned_item(store)
        crm = (HubSpotCrm(org.url, API_KEY, id_field, 10) if provider == "hubspot"
               else SalesforceCrm(org.url, API_KEY))
        activities = CrmActivities(store, crm, 300)
        try:
            made = [await step_env().run(activities.upsert_contact_in_crm, i.op("crm-upsert"))
                    for i in (a, b)]
            assert [m.status for m in made] == ["completed", "completed"]
            ours_a, ours_b = (str(m.destination_id) for m in made)
            await _merge_ours_into_another(control, provider, ours_a, ours_b)
            before = (await control.get("/_sandbox/state")).json()["contacts"]

            later = await _next_item(store, a.contact_id)
            upsert = await step_env().run(
                activities.upsert_contact_in_crm,
                OperationInput(later, f"{later.workflow_id}:crm-upsert"))
            assert (upsert.status, upsert.reason) == ("review", MERGED_INTO_OTHER_REASON)
            if provider == "salesforce":  # the note's Task is refused on the deleted Contact
                with pytest.raises(Exception, match=MERGED_INTO_OTHER_REASON):
                    await step_env().run(activities.log_email_on_contact, OperationInput(
                        later, f"{later.workflow_id}:crm-note"))
        finally:
            await crm.aclose()
        after = (await control.get("/_sandbox/state")).json()["contacts"]
    assert len(after) == len(before)                      # nothing created
    [kept] = [c for c in after if c["id"] == ours_b]
    assert kept["properties"][id_field] == b.contact_id   # B's record still B's
    assert not [c for c in after if c["properties"].get(id_field) == a.contact_id]
    assert await store.fetchval("SELECT crm_record_id FROM contacts WHERE contact_id = "
                                "$1::uuid", a.contact_id) == ours_a   # not re-pointed
    assert await _audit(store, "crm_record_merged", a.contact_id) == []
    async with store.acquire() as conn:
        crm_name, candidates = await review.crm_candidates(conn, workflow_id=later.workflow_id)
        facts = await review_card.card_facts(conn, later.workflow_id)
    assert candidates == [ours_b] and crm_name == provider
    assert facts is not None
    [shown] = facts.card.candidates
    assert shown.contact == f"{provider}:{ours_b}", shown
    assert "another contact's ID of ours" in shown.why and ours_a in shown.why
    [card] = [d for d in await _audit(store, "crm_match_needs_review", a.contact_id)]
    assert card["reason"] == MERGED_INTO_OTHER_REASON
    assert (card["old"], card["other_contact_id"]) == (ours_a, b.contact_id)
