"""Each tenant's own words and destinations, on real components (docs/architecture.md §5):
tenants with their own templates, senders and sandbox accounts (a sandbox process each,
with its own database and API key; `north` on the HubSpot/Resend surface, `south` and
`west` on Salesforce through the OAuth client credentials flow and the Resend surface,
west's new prospects becoming Leads, `east` on Pipedrive) run through a real worker
process. Each item reaches only its own tenant's account, in its own words, from its own
sender; the global account sees nothing. South's Salesforce session expires (its sandbox
clock moves past the session timeout) and the next item completes anyway: the token is
renewed, nothing waits for a person. Issue 35 on a Salesforce tenant, under each duplicate
rule (none, alert, block): a Contact a salesperson created is the one record afterwards,
and a new person becomes one Contact or one Lead as the policy says, with one follow-up.
On Pipedrive (east) a person a salesperson created is adopted, and a new one is one person
with the conversation as notes on it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from inboxcrm.sandbox.pipedrive import CUSTOM_FIELD_KEY
from inboxcrm.schemas.models import inbound_workflow_id
from inboxcrm.stack import postgres
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, unique_email
from tests.helpers.own_worker import OwnWorker
from tests.helpers.sandbox_process import SandboxProcess, free_port, running

KEYS = {"north": "north-account-key", "south": "south-account-key",
        "west": "west-account-key", "east": "east-account-key"}
SESSION_SECONDS = 7200


def _policy(tenant: str, url: str, *, sender: str, reply_to: str, postal: str,
            crm: dict[str, Any], language: str) -> dict[str, Any]:
    return {
        "tenant": tenant, "mailboxes": [f"sales@{tenant}.test"], "domains": [f"{tenant}.test"],
        "followup_rules": [{"rule_id": "ack", "version": 1, "template_id": "hello",
                            "intents": ["product_question", "pricing_request", "demo_request",
                                        "support_request", "partnership", "other"]}],
        "sender_authentication": "off", "default_language": language,
        "sender": {"from": sender, "reply_to": reply_to, "postal_address": postal,
                   "signature": f"The {tenant.title()} team"},
        "destinations": {"crm": crm, "mail": {
            "provider": "sandbox", "url": url,
            "token": {"env": f"INBOXCRM_TENANT_{tenant.upper()}_KEY"}}},
    }


def _templates(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")


@pytest.fixture(scope="module")
async def orgs(postgres_server_url: str) -> AsyncIterator[dict[str, SandboxProcess]]:
    """Four accounts: a sandbox process each, with its own database and API key."""
    urls = {t: await postgres.create_database(postgres_server_url, f"sandbox_{t}")
            for t in KEYS}
    processes = {t: SandboxProcess(urls[t], free_port(), args=("--api-key", KEYS[t]))
                 for t in KEYS}
    try:
        async for north in running(processes["north"]):
            async for south in running(processes["south"]):
                async for west in running(processes["west"]):
                    async for east in running(processes["east"]):
                        yield {"north": north, "south": south, "west": west, "east": east}
    finally:
        for url in urls.values():
            await postgres.drop_database(postgres_server_url, url)


@pytest.fixture(scope="module")
def policy_dir(orgs: dict[str, SandboxProcess], tmp_path_factory: pytest.TempPathFactory
               ) -> Path:
    directory = tmp_path_factory.mktemp("policies")
    north = _policy("north", orgs["north"].url, sender="North Sales <sales@north.test>",
                    reply_to="deals@north.test", postal="North AS, Fjordveien 1, 0150 Oslo",
                    crm={"provider": "sandbox", "url": orgs["north"].url,
                         "token": {"env": "INBOXCRM_TENANT_NORTH_KEY"}}, language="en")
    south = _policy("south", orgs["south"].url, sender="Süd Vertrieb <vertrieb@south.test>",
                    reply_to="team@south.test", postal="Süd GmbH, Hauptstraße 5, 80331 München",
                    crm={"provider": "salesforce", "url": orgs["south"].url,
                         "oauth": {"client_id": "south-connected-app",
                                   "client_secret": {"env": "INBOXCRM_TENANT_SOUTH_KEY"}}},
                    language="de")
    # West: Salesforce as south, but a new prospect becomes a Lead.
    west = _policy("west", orgs["west"].url, sender="West Sales <sales@west.test>",
                   reply_to="deals@west.test", postal="West Ltd, 1 Harbour Road, Bristol",
                   crm={"provider": "salesforce", "url": orgs["west"].url,
                        "new_prospects": "lead",
                        "oauth": {"client_id": "west-connected-app",
                                  "client_secret": {"env": "INBOXCRM_TENANT_WEST_KEY"}}},
                   language="en")
    # East: Pipedrive, no upsert by external ID (the mapping is ours, creates reconciled).
    east = _policy("east", orgs["east"].url, sender="East Sales <sales@east.test>",
                   reply_to="deals@east.test", postal="East Oy, Satamakatu 2, 00160 Helsinki",
                   crm={"provider": "pipedrive", "url": orgs["east"].url,
                        "token": {"env": "INBOXCRM_TENANT_EAST_KEY"}}, language="en")
    for data in (north, south, west, east):
        (directory / f"{data['tenant']}.json").write_text(json.dumps(data), encoding="utf-8")
    _templates(directory / "north" / "templates", {
        "hello.en.subject": "North got your note, {{ first_name or 'friend' }}",
        "hello.en.txt": "Hi {{ first_name or 'there' }}, North will call you back.\n"
                        "{{ signature }}\n{{ postal_address }}\nStop: {{ opt_out_url }}\n"})
    _templates(directory / "south" / "templates", {
        "hello.de.subject": "Süd dankt Ihnen",
        "hello.de.txt": "Guten Tag {{ first_name }}, Süd meldet sich bald.\n{{ signature }}\n"
                        "{{ postal_address }}\nAbmelden: {{ opt_out_url }}\n",
        "hello.en.subject": "South thanks you",
        "hello.en.txt": "Hello, South will be in touch.\n{{ postal_address }}\n"
                        "Unsubscribe: {{ opt_out_url }}\n"})
    _templates(directory / "east" / "templates", {
        "hello.en.subject": "East got your note",
        "hello.en.txt": "Hello, East will be in touch.\n{{ postal_address }}\n"
                        "Unsubscribe: {{ opt_out_url }}\n"})
    _templates(directory / "west" / "templates", {
        "hello.en.subject": "West got your note",
        "hello.en.txt": "Hello, West will be in touch.\n{{ postal_address }}\n"
                        "Unsubscribe: {{ opt_out_url }}\n"})
    return directory


@pytest.fixture(scope="module")
def worker(stack: Stack, policy_dir: Path) -> Iterator[OwnWorker]:
    own = OwnWorker(stack, INBOXCRM_POLICY_DIR=str(policy_dir),
                    INBOXCRM_TENANT_NORTH_KEY=KEYS["north"],
                    INBOXCRM_TENANT_SOUTH_KEY=KEYS["south"],
                    INBOXCRM_TENANT_WEST_KEY=KEYS["west"],
                    INBOXCRM_TENANT_EAST_KEY=KEYS["east"])
    own.start()
    yield own
    own.stop_all()


async def _store(db: asyncpg.Pool, tenant: str, email: str) -> tuple[str, str]:
    """An event as the relay stores it for the tenant's mailbox."""
    mailbox, delivery = f"sales@{tenant}.test", f"D-{uuid.uuid4().hex[:12]}"
    raw = (f"From: Jane Doe <{email}>\r\nTo: {mailbox}\r\nSubject: Pricing for 20 seats\r\n"
           f"Message-ID: <{uuid.uuid4().hex}@example.com>\r\n"
           "Date: Sun, 29 Nov 2026 10:00:00 +0000\r\n"
           "Content-Type: text/plain; charset=utf-8\r\n\r\n"
           "Hi, could you send me pricing for 20 seats?\r\n\r\nThanks,\r\nJane Doe\r\n").encode()
    workflow_id = inbound_workflow_id(tenant, "standard", mailbox, delivery)
    event_id = await db.fetchval(
        "INSERT INTO inbound_events (tenant, source, mailbox, delivery_id, workflow_id, raw, "
        "content_sha256, size_bytes, workflow_started_at) VALUES ($1, 'standard', $2, $3, $4, "
        "$5, $6, $7, now()) RETURNING event_id",
        tenant, mailbox, delivery, workflow_id, raw, hashlib.sha256(raw).hexdigest(), len(raw))
    return str(event_id), workflow_id


async def _run(env: StackClient, db: asyncpg.Pool, worker: OwnWorker, tenant: str,
               email: str) -> Any:
    event_id, workflow_id = await _store(db, tenant, email)
    handle = await worker.run_item(env, event_id, workflow_id, tenant=tenant)
    return await asyncio.wait_for(handle.result(), timeout=90)


async def _account(org: SandboxProcess, tenant: str) -> dict[str, Any]:
    """What one account holds, read with its own key, each email with its body."""
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    async with httpx.AsyncClient(base_url=org.url, headers=headers, timeout=10) as client:
        state = (await client.get("/_sandbox/state")).json()
        state["bodies"] = {e["id"]: (await client.get(f"/emails/{e['id']}")).json()
                           for e in state["emails"]}
        state["calls"] = (await client.get("/_sandbox/calls")).json()["calls"]
    return state


def _contacts(state: dict[str, Any], email: str) -> list[dict[str, Any]]:
    return [c for c in state["contacts"] if c["properties"].get("email") == email]


def _emails(state: dict[str, Any], email: str) -> list[dict[str, Any]]:
    return [e for e in state["emails"] if email in e["to"]]


async def test_each_tenant_gets_its_own_words_from_its_own_account(
        env: StackClient, db: asyncpg.Pool, worker: OwnWorker,
        orgs: dict[str, SandboxProcess]) -> None:
    emails = {"north": unique_email("north"), "south": unique_email("south")}
    results = await asyncio.gather(*(_run(env, db, worker, t, e) for t, e in emails.items()))
    assert [(r.state, r.reason) for r in results] == [("completed", "followup_sent")] * 2

    accounts = {t: await _account(orgs[t], t) for t in KEYS}
    for tenant, other in (("north", "south"), ("south", "north")):
        mine, theirs = accounts[tenant], accounts[other]
        assert len(_contacts(mine, emails[tenant])) == 1
        assert len(_emails(mine, emails[tenant])) == 1
        assert _contacts(theirs, emails[tenant]) == [] == _emails(theirs, emails[tenant])
        assert await env.crm_records_for(emails[tenant]) == []  # the global account
        assert await env.emails_to(emails[tenant]) == []

    [north_mail] = _emails(accounts["north"], emails["north"])
    north_body = accounts["north"]["bodies"][north_mail["id"]]
    assert north_mail["from"] == "North Sales <sales@north.test>"
    assert north_body["reply_to"] == ["deals@north.test"]
    assert north_mail["subject"] == "North got your note, Jane"
    assert north_body["text"].startswith("Hi Jane, North will call you back.")
    assert "North AS, Fjordveien 1" in north_body["text"]
    link = north_body["headers"]["List-Unsubscribe"].strip("<>")
    assert "/v1/unsubscribe/u1.north." in link and link in north_body["text"]

    [south_mail] = _emails(accounts["south"], emails["south"])
    south_body = accounts["south"]["bodies"][south_mail["id"]]
    assert south_mail["from"] == "Süd Vertrieb <vertrieb@south.test>"
    assert south_body["reply_to"] == ["team@south.test"]
    assert south_mail["subject"] == "Süd dankt Ihnen"  # the tenant's default language
    assert "Süd GmbH, Hauptstraße 5" in south_body["text"]
    assert "/v1/unsubscribe/u1.south." in south_body["text"]
    # South's CRM is Salesforce, reached with a token of its own app.
    assert [c["outcome"] for c in accounts["south"]["calls"]
            if c["target"] == "crm.oauth"] == ["ok"]

    # The intents name the planned words: a version of each tenant's own template.
    rows = await db.fetch("SELECT c.tenant, i.template_id FROM followup_intents i JOIN contacts c "
                          "USING (contact_id) WHERE c.email = ANY($1::text[])",
                          list(emails.values()))
    refs = {r["tenant"]: r["template_id"] for r in rows}
    assert refs["north"].startswith("hello@") and refs["south"].startswith("hello@")
    assert refs["north"] != refs["south"]


async def test_an_expired_salesforce_session_does_not_block_the_next_item(
        env: StackClient, db: asyncpg.Pool, worker: OwnWorker,
        orgs: dict[str, SandboxProcess]) -> None:
    first = await _run(env, db, worker, "south", unique_email("south-before"))
    assert first.state == "completed"
    async with httpx.AsyncClient(base_url=orgs["south"].url, timeout=10) as control:
        (await control.post("/_sandbox/clock",
                            json={"advance_seconds": SESSION_SECONDS + 60})).raise_for_status()
    after = unique_email("south-after")
    result = await _run(env, db, worker, "south", after)
    assert (result.state, result.reason) == ("completed", "followup_sent")
    account = await _account(orgs["south"], "south")
    assert len(_contacts(account, after)) == 1 and len(_emails(account, after)) == 1
    outcomes = [(c["target"], c["outcome"]) for c in account["calls"]]
    # Match before create reads first: the expired session is met by that read.
    assert ("crm.search", "session_expired") in outcomes
    # Renewed: a second token, and the upsert after the refusal went through.
    assert outcomes.count(("crm.oauth", "ok")) >= 2
    refused = outcomes.index(("crm.search", "session_expired"))
    assert ("crm.upsert", "ok") in outcomes[refused:]
    op = await db.fetchrow("SELECT o.status, o.attempts FROM operations o JOIN inbound_events e "
                           "USING (event_id) JOIN contacts c ON c.contact_id = e.contact_id "
                           "WHERE c.email = $1 AND o.action = 'crm-upsert'", after)
    assert op is not None and (op["status"], op["attempts"]) == ("completed", 1)


async def test_each_tenants_destinations_are_audited_once(
        db: asyncpg.Pool, worker: OwnWorker, orgs: dict[str, SandboxProcess]) -> None:
    """The worker audits the destinations it runs with: one entry per tenant naming the
    providers, hosts and where the secrets are read from, never a secret's value."""
    rows: list[Any] = []
    for _ in range(300):  # the worker's first pass runs as it starts polling
        rows = await db.fetch("SELECT tenant, detail FROM audit_log WHERE action = "
                              "'destinations_changed' AND tenant = ANY($1::text[]) "
                              "ORDER BY audit_id", list(KEYS))
        if {r["tenant"] for r in rows} == set(KEYS):
            break
        await asyncio.sleep(0.1)
    by_tenant = {r["tenant"]: json.loads(r["detail"]) if isinstance(r["detail"], str)
                 else r["detail"] for r in rows}
    assert sorted(r["tenant"] for r in rows) == sorted(KEYS)  # once each, not per pass
    assert by_tenant["south"]["crm"]["provider"] == "salesforce"
    assert by_tenant["north"]["crm"]["hosts"] == ["127.0.0.1"]
    assert by_tenant["north"]["mail"]["secrets"] == [
        "token: environment variable INBOXCRM_TENANT_NORTH_KEY"]
    assert not any(key in json.dumps(by_tenant) for key in KEYS.values())


@pytest.mark.parametrize("tenant, rule", [("north", None), ("south", "none"),
                                          ("south", "alert"), ("south", "block"),
                                          ("east", None)])
async def test_a_person_already_in_the_crm_is_adopted_end_to_end(
        env: StackClient, db: asyncpg.Pool, worker: OwnWorker,
        orgs: dict[str, SandboxProcess], tenant: str, rule: str | None) -> None:
    """Issue 35: the contact a salesperson created (owner, a field, no ID of ours) is the one
    record afterwards, carrying our external ID, owner and field untouched, one follow-up."""
    email = unique_email(f"{tenant}-seeded")
    crm = {"north": "hubspot", "east": "pipedrive"}.get(tenant, "salesforce")
    owner_field, ours = {"hubspot": ("hubspot_owner_id", "inboxcrm_contact_id"),
                         "salesforce": ("OwnerId", "Inboxcrm_Contact_Id__c"),
                         "pipedrive": ("owner_id", CUSTOM_FIELD_KEY)}[crm]
    async with httpx.AsyncClient(base_url=orgs[tenant].url, timeout=10) as control:
        if rule is not None:
            (await control.post("/_sandbox/config", json={"salesforce_duplicate_rule": rule})
             ).raise_for_status()
        seeded = (await control.post("/_sandbox/seed", json={"crm": crm, "contacts": [
            {"email": email, "lastname": "Seeded", "owner": "owner-7",
             "properties": {"Department": "Key accounts"}}]})).json()["contacts"][0]["id"]
    try:
        result = await _run(env, db, worker, tenant, email)
    finally:
        async with httpx.AsyncClient(base_url=orgs[tenant].url, timeout=10) as control:
            await control.post("/_sandbox/config", json={"salesforce_duplicate_rule": "alert"})
    assert (result.state, result.reason) == ("completed", "followup_sent")
    account = await _account(orgs[tenant], tenant)
    [held] = _contacts(account, email)
    props = held["properties"]
    assert held["id"] == seeded and props.get(ours)
    assert props[owner_field] == "owner-7" and props["lastname"] == "Seeded"
    assert props.get("Department", props.get("department")) == "Key accounts"
    assert len(_emails(account, email)) == 1


@pytest.mark.parametrize("tenant", ["south", "west"])
@pytest.mark.parametrize("rule", ["none", "alert", "block"])
async def test_a_new_person_becomes_what_the_salesforce_policy_says(
        env: StackClient, db: asyncpg.Pool, worker: OwnWorker,
        orgs: dict[str, SandboxProcess], tenant: str, rule: str) -> None:
    """Issue 35: a person no record holds writes in to a Salesforce tenant; under each
    duplicate rule exactly one record is made, a Contact (south, `new_prospects` default) or
    a Lead (west, `new_prospects: lead`), carrying our External ID, none of the other kind,
    one follow-up."""
    email = unique_email(f"{tenant}-new")
    async with httpx.AsyncClient(base_url=orgs[tenant].url, timeout=10) as control:
        (await control.post("/_sandbox/config", json={"salesforce_duplicate_rule": rule})
         ).raise_for_status()
    try:
        result = await _run(env, db, worker, tenant, email)
    finally:
        async with httpx.AsyncClient(base_url=orgs[tenant].url, timeout=10) as control:
            await control.post("/_sandbox/config", json={"salesforce_duplicate_rule": "alert"})
    assert (result.state, result.reason) == ("completed", "followup_sent")
    account = await _account(orgs[tenant], tenant)
    contact_id = await db.fetchval("SELECT contact_id::text FROM contacts WHERE tenant = $1 "
                                   "AND canonical_email = $2", tenant, email)
    contacts = _contacts(account, email)
    leads = [lead for lead in account["leads"] if lead["properties"].get("email") == email]
    made, other = (leads, contacts) if tenant == "west" else (contacts, leads)
    assert len(made) == 1 and other == []
    assert made[0]["properties"]["Inboxcrm_Contact_Id__c"] == contact_id
    assert made[0]["id"].startswith("00Q") is (tenant == "west")
    assert await db.fetchval("SELECT crm_record_id FROM contacts WHERE contact_id = $1::uuid",
                             contact_id) == made[0]["id"]
    assert len(_emails(account, email)) == 1


async def test_two_salesforce_contacts_with_the_email_send_the_item_to_review(
        env: StackClient, db: asyncpg.Pool, worker: OwnWorker,
        orgs: dict[str, SandboxProcess]) -> None:
    """Two existing Contacts hold the address: none is adopted, none created, nothing sent;
    the item waits for a person with both as candidates."""
    email = unique_email("south-two")
    async with httpx.AsyncClient(base_url=orgs["south"].url, timeout=10) as control:
        seeded = [c["id"] for c in (await control.post("/_sandbox/seed", json={
            "crm": "salesforce", "contacts": [{"email": email, "owner": "005A"},
                                              {"email": email, "owner": "005B"}]})
        ).json()["contacts"]]
    event_id, workflow_id = await _store(db, "south", email)
    handle = await worker.run_item(env, event_id, workflow_id, tenant="south")
    try:
        assert await env.wait_state(workflow_id, "awaiting_review") == (
            "awaiting_review", "crm_candidates")
        detail = await db.fetchval(
            "SELECT detail FROM audit_log WHERE workflow_id = $1 AND "
            "action = 'crm_match_needs_review'", workflow_id)
        candidates = (detail if isinstance(detail, dict) else json.loads(detail))["candidates"]
        assert candidates == seeded
        account = await _account(orgs["south"], "south")
        held = _contacts(account, email)
        assert sorted(c["id"] for c in held) == sorted(seeded)
        assert all("Inboxcrm_Contact_Id__c" not in c["properties"] for c in held)
        assert _emails(account, email) == []
    finally:
        await handle.terminate("test over")


async def test_a_new_person_on_pipedrive_is_one_person_with_the_conversation_on_it(
        env: StackClient, db: asyncpg.Pool, worker: OwnWorker,
        orgs: dict[str, SandboxProcess]) -> None:
    """Issue 35 on the CRM without upsert by external ID, through a real worker: a person
    no record holds becomes one Pipedrive person carrying our ID (the mapping kept in the
    store), with one follow-up, and the inbound email and the follow-up as notes on it."""
    email = unique_email("east-new")
    result = await _run(env, db, worker, "east", email)
    assert (result.state, result.reason) == ("completed", "followup_sent")
    account = await _account(orgs["east"], "east")
    row = await db.fetchrow(
        "SELECT contact_id::text, crm_record_id FROM contacts WHERE tenant = 'east' AND "
        "canonical_email = $1", email)
    assert row is not None
    contact_id, record_id = row["contact_id"], row["crm_record_id"]
    [person] = _contacts(account, email)
    assert (person["id"], person["properties"][CUSTOM_FIELD_KEY]) == (record_id, contact_id)
    [sent] = _emails(account, email)
    on_person = [n["properties"]["hs_note_body"] for n in account["notes"]
                 if n["associations"]["contacts"] == [person["id"]]]
    heads = sorted(note.split("\n", 1)[0].split(" (delivery", 1)[0] for note in on_person)
    assert len(heads) == 3, heads  # once each, though the steps may have run again
    assert heads[:2] == ["<p>Email received: Pricing for 20 seats",
                         f"<p>Email sent: {sent['subject']}"]
    assert heads[2].startswith("<p>Inbound email received via standard")
    assert await env.crm_records_for(email) == []  # the global account
