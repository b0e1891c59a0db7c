"""The CRM's side of the guarantee checked before a tenant goes live (issue 35): `inboxcrm crm
check --tenant T` reads the destination's own field definitions (Salesforce describe, HubSpot
property definitions) and refuses, naming the field, one whose external ID is not unique; the
worker runs the same check at start and does not take such a tenant live: its item is blocked
and the CRM holds nothing of it. Both surfaces on a sandbox process of their own (its
`crm_fields` setting is the account's field definition), through the console script and a
worker process, counted on the destination side."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from inboxcrm.schemas.models import inbound_workflow_id
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, unique_email
from tests.helpers.own_worker import OwnWorker
from tests.helpers.sandbox_process import API_KEY, SandboxProcess, own_sandbox

SF_FIELD = "Inboxcrm_Contact_Id__c"
HS_PROPERTY = "inboxcrm_contact_id"
KEYS = {"INBOXCRM_TENANT_HS_KEY": API_KEY, "INBOXCRM_TENANT_SF_KEY": API_KEY}


@pytest.fixture(scope="module")
async def org(postgres_server_url: str) -> AsyncIterator[SandboxProcess]:
    async for process in own_sandbox(postgres_server_url, "sandbox_crm_check"):
        yield process


@pytest.fixture
async def control(org: SandboxProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=org.url, timeout=10) as client:
        (await client.post("/_sandbox/reset")).raise_for_status()
        yield client
        await client.post("/_sandbox/config", json={"crm_fields": {}})


def _key(tenant: str) -> str:
    return f"INBOXCRM_TENANT_{tenant.upper()}_KEY"


def _policy(tenant: str, crm: dict[str, Any], url: str) -> dict[str, Any]:
    return {
        "tenant": tenant, "mailboxes": [f"sales@{tenant}.test"], "domains": [f"{tenant}.test"],
        "followup_rules": [{"rule_id": "ack", "version": 1, "template_id": "hello",
                            "intents": ["product_question", "pricing_request", "demo_request",
                                        "support_request", "partnership", "other"]}],
        "sender_authentication": "off", "default_language": "en",
        "sender": {"from": f"Sales <sales@{tenant}.test>", "postal_address": "1 Check Road",
                   "signature": "The team"},
        "destinations": {"crm": crm, "mail": {"provider": "sandbox", "url": url,
                                              "token": {"env": _key(tenant)}}},
    }


@pytest.fixture(scope="module")
def policy_dir(org: SandboxProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("check-policies")
    crms = {"hs": {"provider": "sandbox", "url": org.url, "token": {"env": _key("hs")}},
            "sf": {"provider": "salesforce", "url": org.url, "token": {"env": _key("sf")}}}
    for tenant, crm in crms.items():
        (directory / f"{tenant}.json").write_text(json.dumps(_policy(tenant, crm, org.url)),
                                                  encoding="utf-8")
        templates = directory / tenant / "templates"
        templates.mkdir(parents=True)
        (templates / "hello.en.subject").write_text("Thanks", encoding="utf-8")
        (templates / "hello.en.txt").write_text(
            "We will be in touch.\n{{ postal_address }}\nStop: {{ opt_out_url }}\n",
            encoding="utf-8")
    return directory


def _check(stack: Stack, policy_dir: Path, tenant: str) -> tuple[int, dict[str, Any]]:
    env = dict(stack.env, INBOXCRM_POLICY_DIR=str(policy_dir), **KEYS)
    done = subprocess.run([sys.executable, "-m", "inboxcrm.cli", "crm", "check", "--tenant",
                           tenant, "--json"], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


async def test_crm_check_passes_on_the_defaults(stack: Stack, policy_dir: Path,
                                                control: httpx.AsyncClient) -> None:
    for tenant, checked in (("hs", {("contacts", HS_PROPERTY), ("notes", "inboxcrm_note_id")}),
                            ("sf", {("Contact", SF_FIELD), ("Lead", SF_FIELD),
                                    ("Task", "Inboxcrm_Note_Id__c")})):
        code, answer = await asyncio.to_thread(_check, stack, policy_dir, tenant)
        assert (code, answer["ok"]) == (0, True), answer
        assert {(c["object"], c["field"]) for c in answer["checks"]} == checked


@pytest.mark.parametrize("tenant, field, named", [
    ("hs", HS_PROPERTY, f"HubSpot contact property {HS_PROPERTY} is not unique"),
    ("sf", SF_FIELD, f"Salesforce Contact.{SF_FIELD} is not unique"),
])
async def test_crm_check_refuses_a_non_unique_external_id(
        stack: Stack, policy_dir: Path, control: httpx.AsyncClient, tenant: str, field: str,
        named: str) -> None:
    (await control.post("/_sandbox/config", json={"crm_fields": {field: "not_unique"}})
     ).raise_for_status()
    code, answer = await asyncio.to_thread(_check, stack, policy_dir, tenant)
    assert (code, answer["ok"]) == (1, False)
    problems = [c["problem"] for c in answer["checks"] if not c["ok"]]
    assert problems and problems[0].startswith(named), problems
    assert all(c["ok"] for c in answer["checks"] if c["field"] != field)


async def test_crm_check_refuses_a_missing_or_plain_field(
        stack: Stack, policy_dir: Path, control: httpx.AsyncClient) -> None:
    (await control.post("/_sandbox/config", json={"crm_fields": {
        SF_FIELD: "not_external_id", "Inboxcrm_Note_Id__c": "missing"}})).raise_for_status()
    code, answer = await asyncio.to_thread(_check, stack, policy_dir, "sf")
    assert code == 1
    problems = {c["object"]: c["problem"] for c in answer["checks"]}
    assert problems["Contact"].startswith(f"Salesforce Contact.{SF_FIELD} is not an External ID")
    assert problems["Task"].startswith("Salesforce Task.Inboxcrm_Note_Id__c does not exist")


async def _store(db: asyncpg.Pool, tenant: str, email: str) -> tuple[str, str]:
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


async def test_the_worker_does_not_take_a_tenant_live_without_the_guarantee(
        stack: Stack, env: StackClient, db: asyncpg.Pool, policy_dir: Path,
        control: httpx.AsyncClient) -> None:
    """Salesforce's field not unique when the worker starts: `sf` is refused (the log names
    the field), its item is blocked and nothing reaches its CRM; `hs`, whose property is
    unique, is live and its item completes."""
    (await control.post("/_sandbox/config", json={"crm_fields": {SF_FIELD: "not_unique"}})
     ).raise_for_status()
    worker = OwnWorker(stack, INBOXCRM_POLICY_DIR=str(policy_dir), **KEYS)
    proc = worker.start()
    try:
        assert proc.log_has(f"tenant sf not taken live: Salesforce Contact.{SF_FIELD} is not "
                            "unique")()
        emails = {"sf": unique_email("sf"), "hs": unique_email("hs")}
        results = {}
        for tenant, email in emails.items():
            event_id, workflow_id = await _store(db, tenant, email)
            handle = await worker.run_item(env, event_id, workflow_id, tenant=tenant)
            if tenant == "sf":
                await env.wait_state(workflow_id, "blocked")
                results[tenant] = ("blocked", None)
                await handle.terminate("test done")
            else:
                done = await asyncio.wait_for(handle.result(), timeout=90)
                results[tenant] = (done.state, done.reason)
    finally:
        worker.stop_all()
    assert results["hs"] == ("completed", "followup_sent")
    state = (await control.get("/_sandbox/state")).json()
    held = [r for r in [*state["contacts"], *state["leads"]]
            if r["properties"].get("email") == emails["sf"]]
    assert held == [] and not [e for e in state["emails"] if emails["sf"] in e["to"]]
    assert len([c for c in state["contacts"]
                if c["properties"].get("email") == emails["hs"]]) == 1
